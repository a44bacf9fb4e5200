package hutch.spark.jvm;

/**
 * The offset of a stream in Spark's checkpoint, {@code {"stream": "<name>", "offset": <n>}}, written as the
 * Python source writes it (Python's {@code json.dumps} of its offset dict) and read back from either
 * source's checkpoint: a query may switch between {@code format("hutch")} and {@code format("hutch-jvm")}.
 */
final class Json {
    private Json() {
    }

    /** A JSON string as json.dumps writes it (ensure_ascii). */
    static String quote(String s) {
        StringBuilder sb = new StringBuilder("\"");
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            if (ch == '"' || ch == '\\') {
                sb.append('\\').append(ch);
            } else if (ch < 0x20 || ch > 0x7e) {
                sb.append(String.format("\\u%04x", (int) ch));
            } else {
                sb.append(ch);
            }
        }
        return sb.append('"').toString();
    }

    static String offset(String stream, long n) {
        return "{\"stream\": " + quote(stream) + ", \"offset\": " + n + "}";
    }

    /** The offset of {@code json} if it is an offset of {@code stream}; else an error that says to use a new
     * checkpoint. */
    static long parseOffset(String json, String stream) {
        String want = quote(stream);
        String t = json.trim();
        int s = t.indexOf("\"stream\"");
        int o = t.indexOf("\"offset\"");
        if (t.startsWith("{") && t.endsWith("}") && s >= 0 && o >= 0) {
            String sv = value(t, s + 8);
            String ov = value(t, o + 8);
            if (sv != null && ov != null && sv.equals(want)) {
                try {
                    return Long.parseLong(ov);
                } catch (NumberFormatException ignored) {
                    // the error below
                }
            }
        }
        throw ReadOptions.error("the checkpoint's offset " + json + " is not an offset of stream '" + stream
                + "'; use a new checkpointLocation");
    }

    /** A super stream's offsets as the Python source writes them: {"superStream": "<name>", "offsets": {"0": n,
     * ...}} (json.dumps of its dict). */
    static String superOffset(String superStream, long[] offsets) {
        StringBuilder sb = new StringBuilder("{\"superStream\": ").append(quote(superStream)).append(", \"offsets\": {");
        for (int i = 0; i < offsets.length; i++) {
            sb.append(i > 0 ? ", " : "").append('"').append(i).append("\": ").append(offsets[i]);
        }
        return sb.append("}}").toString();
    }

    private static final java.util.regex.Pattern PAIR = java.util.regex.Pattern.compile(
            "\\s*\"(\\d{1,9})\"\\s*:\\s*(-?\\d{1,19})\\s*");

    /** The offsets of {@code json} if it holds one per partition of {@code superStream} ({@code partitions} of
     * them); else an error that says to use a new checkpoint. */
    static long[] parseSuperOffset(String json, String superStream, int partitions) {
        String t = json.trim();
        int s = t.indexOf("\"superStream\"");
        int o = t.indexOf("\"offsets\"");
        String bad = "hutch-jvm source: the checkpoint's offset " + json + " is not an offset of super stream '"
                + superStream + "'; use a new checkpointLocation";
        if (!t.startsWith("{") || !t.endsWith("}") || s < 0 || o < 0 || !quote(superStream).equals(value(t, s + 13))) {
            throw new IllegalStateException(bad);
        }
        int open = t.indexOf('{', o), close = t.indexOf('}', o);
        if (open < 0 || close < open) {
            throw new IllegalStateException(bad);
        }
        java.util.Map<Integer, Long> got = new java.util.HashMap<>();
        String inner = t.substring(open + 1, close);
        if (!inner.isBlank()) {
            for (String pair : inner.split(",")) {
                java.util.regex.Matcher m = PAIR.matcher(pair);
                if (!m.matches()) {
                    throw new IllegalStateException(bad);
                }
                got.put(Integer.parseInt(m.group(1)), Long.parseLong(m.group(2)));
            }
        }
        long[] out = new long[partitions];
        for (int i = 0; i < partitions; i++) {
            if (!got.containsKey(i)) {
                break;
            }
            out[i] = got.get(i);
        }
        if (got.size() != partitions || !got.keySet().stream().allMatch(k -> k < partitions)) {
            throw new IllegalStateException("hutch-jvm source: the checkpoint has offsets for " + got.size()
                    + " partitions of super stream '" + superStream + "', which now has " + partitions + "; a query "
                    + "does not follow partitions added or removed: start it with a new checkpointLocation");
        }
        return out;
    }

    /** The raw text of the value after a key ending at {@code at}: `: value` up to `,` or `}` (a string whole). */
    private static String value(String t, int at) {
        int i = at;
        while (i < t.length() && Character.isWhitespace(t.charAt(i))) {
            i++;
        }
        if (i >= t.length() || t.charAt(i) != ':') {
            return null;
        }
        i++;
        while (i < t.length() && Character.isWhitespace(t.charAt(i))) {
            i++;
        }
        int start = i;
        if (i < t.length() && t.charAt(i) == '"') {
            i++;
            while (i < t.length() && t.charAt(i) != '"') {
                i += t.charAt(i) == '\\' ? 2 : 1;
            }
            return i < t.length() ? t.substring(start, i + 1) : null;
        }
        while (i < t.length() && t.charAt(i) != ',' && t.charAt(i) != '}') {
            i++;
        }
        return t.substring(start, i).trim();
    }
}
