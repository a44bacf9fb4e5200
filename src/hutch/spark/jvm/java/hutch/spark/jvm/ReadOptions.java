package hutch.spark.jvm;

import java.io.Serializable;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The options of a JVM read of a stream, resolved and checked once: the Python source's names and
 * meanings ({@code spark/options.py}, {@code stream_read_options}), so a query switches between
 * {@code format("hutch")} and {@code format("hutch-jvm")} by its format alone. What the JVM reader does
 * not take (superStream, hosts, amqps) is refused with a clear error.
 */
final class ReadOptions implements Serializable {
    private static final long serialVersionUID = 1L;
    static final String EARLIEST = "earliest", LATEST = "latest", OFFSET = "offset", TIMESTAMP = "timestamp";
    private static final Set<String> KNOWN = Set.of("uri", "stream", "startingoffsets", "startingtimestamp",
            "endingoffsets", "endingtimestamp", "maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay",
            "minpartitions", "failondataloss", "prefetch", "polltimeoutms", "readtimeoutms", "includeheaders",
            "streamport", "path");

    /** Where to start or end: a kind (earliest, latest, offset, timestamp) and its value. */
    static final class Position implements Serializable {
        private static final long serialVersionUID = 1L;
        final String kind;
        final long value;

        Position(String kind, long value) {
            this.kind = kind;
            this.value = value;
        }
    }

    String host, user, password, vhost;
    int streamPort;
    String stream;
    Position starting, ending;
    long maxOffsetsPerTrigger, minOffsetsPerTrigger;
    long maxTriggerDelayMs = 15 * 60_000L;
    int minPartitions = 1;
    boolean failOnDataLoss = true;
    int prefetch = 20_000;
    int pollTimeoutMs = 100;
    int readTimeoutMs = 60_000;
    boolean includeHeaders = true;

    static IllegalArgumentException error(String text) {
        return new IllegalArgumentException("hutch-jvm source: " + text);
    }

    static ReadOptions parse(Map<String, String> raw, boolean streaming) {
        java.util.HashMap<String, String> o = new java.util.HashMap<>();
        for (Map.Entry<String, String> e : raw.entrySet()) {
            o.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue());
        }
        if (o.containsKey("superstream")) {
            throw error("option 'superStream' is read by the Python source only (format(\"hutch\"))");
        }
        if (o.containsKey("hosts")) {
            throw error("option 'hosts' is read by the Python source only (format(\"hutch\"))");
        }
        for (String k : o.keySet()) {
            if (!KNOWN.contains(k)) {
                throw error("unknown option '" + k + "'");
            }
        }
        ReadOptions r = new ReadOptions();
        r.uri(o.getOrDefault("uri", "amqp://guest:guest@localhost:5672/%2F"));
        r.stream = o.getOrDefault("stream", "");
        if (r.stream.isEmpty()) {
            throw error("option 'stream' is required: the name of the stream to read");
        }
        if (r.stream.getBytes(StandardCharsets.UTF_8).length > 255) {
            throw error("option 'stream': a stream name is at most 255 bytes");
        }
        r.streamPort = (int) integer(o, "streamport", "streamPort", 5552, 1, 65535);
        if (o.containsKey("startingoffsets") && o.containsKey("startingtimestamp")) {
            throw error("options 'startingOffsets' and 'startingTimestamp' exclude each other");
        }
        if (o.containsKey("endingoffsets") && o.containsKey("endingtimestamp")) {
            throw error("options 'endingOffsets' and 'endingTimestamp' exclude each other");
        }
        r.starting = o.containsKey("startingtimestamp")
                ? new Position(TIMESTAMP, integer(o, "startingtimestamp", "startingTimestamp", 0, 0, 1L << 53))
                : position(o.getOrDefault("startingoffsets", streaming ? LATEST : EARLIEST), "startingOffsets", r.stream);
        r.ending = o.containsKey("endingtimestamp")
                ? new Position(TIMESTAMP, integer(o, "endingtimestamp", "endingTimestamp", 0, 0, 1L << 53))
                : position(o.getOrDefault("endingoffsets", LATEST), "endingOffsets", r.stream);
        if (streaming && (o.containsKey("endingoffsets") || o.containsKey("endingtimestamp"))) {
            throw error("options 'endingOffsets' and 'endingTimestamp' are for batch reads (spark.read); a "
                    + "streaming query reads on");
        }
        if (!streaming && r.ending.kind.equals(EARLIEST)) {
            throw error("option 'endingOffsets' cannot be 'earliest'");
        }
        for (String k : new String[] {"maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay"}) {
            if (!streaming && o.containsKey(k)) {
                throw error("option '" + k + "' is for streaming reads (spark.readStream)");
            }
        }
        r.maxOffsetsPerTrigger = integer(o, "maxoffsetspertrigger", "maxOffsetsPerTrigger", 0, 1, Long.MAX_VALUE);
        r.minOffsetsPerTrigger = integer(o, "minoffsetspertrigger", "minOffsetsPerTrigger", 0, 1, Long.MAX_VALUE);
        if (o.containsKey("maxtriggerdelay")) {
            r.maxTriggerDelayMs = durationMs(o.get("maxtriggerdelay"));
        }
        r.minPartitions = (int) integer(o, "minpartitions", "minPartitions", 1, 1, 10_000);
        r.failOnDataLoss = bool(o, "failondataloss", "failOnDataLoss", true);
        r.prefetch = (int) integer(o, "prefetch", "prefetch", 20_000, 1, 1_000_000);
        r.pollTimeoutMs = (int) integer(o, "polltimeoutms", "pollTimeoutMs", 100, 1, 3_600_000);
        r.readTimeoutMs = (int) integer(o, "readtimeoutms", "readTimeoutMs", 60_000, 1, 3_600_000);
        r.includeHeaders = bool(o, "includeheaders", "includeHeaders", true);
        return r;
    }

    private void uri(String text) {
        URI u;
        try {
            u = new URI(text);
        } catch (URISyntaxException e) {
            throw error("option 'uri' is not a URI: " + e.getMessage());
        }
        if ("amqps".equals(u.getScheme())) {
            throw error("TLS (amqps) is read by the Python source only (format(\"hutch\"))");
        }
        if (!"amqp".equals(u.getScheme()) || u.getHost() == null) {
            throw error("option 'uri' must be amqp://user:password@host:port/vhost, got " + text);
        }
        host = u.getHost();
        String info = u.getRawUserInfo();
        user = "guest";
        password = "guest";
        if (info != null) {
            int colon = info.indexOf(':');
            user = decode(colon < 0 ? info : info.substring(0, colon));
            password = colon < 0 ? "" : decode(info.substring(colon + 1));
        }
        String path = u.getRawPath();
        vhost = path == null || path.length() <= 1 ? "/" : decode(path.substring(1));
    }

    private static String decode(String s) {
        return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    private static final Pattern INNER = Pattern.compile("\\s*\\{\\s*\"0\"\\s*:\\s*(-?\\d{1,19})\\s*}\\s*");

    /** earliest, latest, or Kafka's JSON {"<stream>": {"0": n}} (also {"0": n}); n = -2 earliest, -1 latest. */
    static Position position(String raw, String name, String stream) {
        String text = raw.trim();
        String lower = text.toLowerCase(Locale.ROOT);
        if (lower.equals(EARLIEST) || lower.equals(LATEST)) {
            return new Position(lower, 0);
        }
        String inner = text;
        String prefix = "{" + Json.quote(stream) + ":";
        String squeezed = text.replaceAll("\\s", "");
        if (squeezed.startsWith(prefix) && squeezed.endsWith("}")) {
            inner = squeezed.substring(prefix.length(), squeezed.length() - 1);
        }
        Matcher m = INNER.matcher(inner);
        if (m.matches()) {
            try {
                long n = Long.parseLong(m.group(1));
                if (n >= -2) {
                    return n == -2 ? new Position(EARLIEST, 0) : n == -1 ? new Position(LATEST, 0) : new Position(OFFSET, n);
                }
            } catch (NumberFormatException ignored) {
                // out of range: the error below
            }
        }
        throw error("option '" + name + "' must be 'earliest', 'latest' or a JSON map of partition to offset such as "
                + "{\"" + stream + "\": {\"0\": 42}} (a stream has one partition, \"0\"; -2 = earliest, -1 = latest), got '"
                + raw + "'");
    }

    private static long integer(Map<String, String> o, String key, String name, long dflt, long lo, long hi) {
        String v = o.get(key);
        if (v == null) {
            return dflt;
        }
        try {
            long n = Long.parseLong(v.trim());
            if (n >= lo && n <= hi) {
                return n;
            }
        } catch (NumberFormatException ignored) {
            // the error below
        }
        throw error("option '" + name + "' must be an integer from " + lo + " to " + hi + ", got '" + v + "'");
    }

    private static boolean bool(Map<String, String> o, String key, String name, boolean dflt) {
        String v = o.get(key);
        if (v == null) {
            return dflt;
        }
        String t = v.trim().toLowerCase(Locale.ROOT);
        if (t.equals("true")) {
            return true;
        }
        if (t.equals("false")) {
            return false;
        }
        throw error("option '" + name + "' must be true or false, got '" + v + "'");
    }

    private static final Pattern DURATION = Pattern.compile("\\s*(\\d{1,12})\\s*([a-z]*)\\s*");

    static long durationMs(String raw) {
        Matcher m = DURATION.matcher(raw.toLowerCase(Locale.ROOT));
        if (m.matches()) {
            long n = Long.parseLong(m.group(1));
            switch (m.group(2)) {
                case "": case "ms": return n;
                case "s": return n * 1000;
                case "m": case "min": return n * 60_000;
                case "h": return n * 3_600_000;
                case "d": return n * 86_400_000;
                default: break;
            }
        }
        throw error("option 'maxTriggerDelay' must be a duration such as 15m, 30s, 500ms or 2h, got '" + raw + "'");
    }

    StreamConnection connect(String purpose) {
        return new StreamConnection(host, streamPort, user, password, vhost, "hutch-spark-jvm " + purpose + " " + stream,
                readTimeoutMs);
    }
}
