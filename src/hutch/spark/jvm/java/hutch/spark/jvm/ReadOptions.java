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
 * {@code format("hutch")} and {@code format("hutch-jvm")} by its format alone: a stream or a super stream
 * ({@code superStream}: positions per partition index), {@code hosts} (more nodes to try, in turn) and
 * {@code amqps://} uris with RabbitMQ's TLS query parameters ({@link Tls}).
 */
final class ReadOptions implements Serializable {
    private static final long serialVersionUID = 1L;
    static final String EARLIEST = "earliest", LATEST = "latest", OFFSET = "offset", TIMESTAMP = "timestamp";
    private static final Set<String> KNOWN = Set.of("uri", "stream", "startingoffsets", "startingtimestamp",
            "endingoffsets", "endingtimestamp", "maxoffsetspertrigger", "minoffsetspertrigger", "maxtriggerdelay",
            "minpartitions", "failondataloss", "prefetch", "polltimeoutms", "readtimeoutms", "includeheaders",
            "streamport", "path", "superstream", "hosts");
    static final int MAX_HOSTS = 64;

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
    int connectTimeoutMs = 10_000;
    boolean tls, verify = true;
    String cacertfile = "", certfile = "", keyfile = "", serverName = "";
    /** More nodes to try (option 'hosts'): host and port (0: streamPort). */
    java.util.List<String> hostNames = new java.util.ArrayList<>();
    java.util.List<Integer> hostPorts = new java.util.ArrayList<>();
    String stream;
    /** A super stream read: its name (then {@code stream} is the super stream's name, for messages). */
    String superStream;
    Position starting, ending;
    /** A super stream's positions given per partition index (the rest take starting / ending). */
    java.util.Map<Integer, Position> startingBy = new java.util.HashMap<>(), endingBy = new java.util.HashMap<>();
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
        for (String k : o.keySet()) {
            if (!KNOWN.contains(k)) {
                throw error("unknown option '" + k + "'");
            }
        }
        ReadOptions r = new ReadOptions();
        r.uri(o.getOrDefault("uri", "amqp://guest:guest@localhost:5672/%2F"));
        if (o.containsKey("stream") && o.containsKey("superstream")) {
            throw error("options 'stream' and 'superStream' exclude each other");
        }
        r.superStream = o.get("superstream");
        if (r.superStream != null) {
            int n = r.superStream.getBytes(StandardCharsets.UTF_8).length;
            if (n == 0 || n > 255) {
                throw error("option 'superStream' must be a super stream name of 1 to 255 bytes");
            }
        }
        r.stream = r.superStream != null ? r.superStream : o.getOrDefault("stream", "");
        if (r.stream.isEmpty()) {
            throw error("option 'stream' is required: the name of the stream to read");
        }
        if (r.stream.getBytes(StandardCharsets.UTF_8).length > 255) {
            throw error("option 'stream': a stream name is at most 255 bytes");
        }
        if (o.containsKey("hosts")) {
            r.hosts(o.get("hosts"));
        }
        r.streamPort = (int) integer(o, "streamport", "streamPort", r.tls ? 5551 : 5552, 1, 65535);
        if (o.containsKey("startingoffsets") && o.containsKey("startingtimestamp")) {
            throw error("options 'startingOffsets' and 'startingTimestamp' exclude each other");
        }
        if (o.containsKey("endingoffsets") && o.containsKey("endingtimestamp")) {
            throw error("options 'endingOffsets' and 'endingTimestamp' exclude each other");
        }
        String startingText = o.getOrDefault("startingoffsets", streaming ? LATEST : EARLIEST);
        String endingText = o.getOrDefault("endingoffsets", LATEST);
        r.starting = o.containsKey("startingtimestamp")
                ? new Position(TIMESTAMP, integer(o, "startingtimestamp", "startingTimestamp", 0, 0, 1L << 53))
                : r.superStream != null ? partitionPositions(startingText, "startingOffsets", r.superStream,
                        r.startingBy, streaming ? LATEST : EARLIEST)
                : position(startingText, "startingOffsets", r.stream);
        r.ending = o.containsKey("endingtimestamp")
                ? new Position(TIMESTAMP, integer(o, "endingtimestamp", "endingTimestamp", 0, 0, 1L << 53))
                : r.superStream != null ? partitionPositions(endingText, "endingOffsets", r.superStream, r.endingBy, LATEST)
                : position(endingText, "endingOffsets", r.stream);
        if (streaming && (o.containsKey("endingoffsets") || o.containsKey("endingtimestamp"))) {
            throw error("options 'endingOffsets' and 'endingTimestamp' are for batch reads (spark.read); a "
                    + "streaming query reads on");
        }
        if (!streaming && (r.ending.kind.equals(EARLIEST)
                || r.endingBy.values().stream().anyMatch(p -> p.kind.equals(EARLIEST)))) {
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
        tls = "amqps".equals(u.getScheme());
        if (!(tls || "amqp".equals(u.getScheme())) || u.getHost() == null) {
            throw error("option 'uri' must be amqp://user:password@host:port/vhost (or amqps://), got " + text);
        }
        host = u.getHost().startsWith("[") ? u.getHost().substring(1, u.getHost().length() - 1) : u.getHost();
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
        String query = u.getRawQuery();
        if (query == null || query.isEmpty()) {
            return;
        }
        for (String pair : query.split("&")) {
            int eq = pair.indexOf('=');
            String key = decode(eq < 0 ? pair : pair.substring(0, eq));
            String value = eq < 0 ? "" : decode(pair.substring(eq + 1));
            switch (key) {
                case "heartbeat": case "frame_max":
                    break;  // the AMQP 0-9-1 connection's; a read over the stream protocol takes the broker's
                case "connection_timeout":
                    try {
                        connectTimeoutMs = (int) Math.max(1, Math.min(Double.parseDouble(value), 3_600_000));
                    } catch (NumberFormatException e) {
                        throw error("option 'uri': connection_timeout must be a positive number of milliseconds");
                    }
                    break;
                case "cacertfile": case "certfile": case "keyfile": case "verify": case "server_name_indication":
                    tlsParameter(key, value);
                    break;
                default:
                    throw error("option 'uri': unknown query parameter '" + key + "' (allowed: heartbeat, "
                            + "connection_timeout, frame_max; with amqps also cacertfile, certfile, keyfile, verify, "
                            + "server_name_indication)");
            }
        }
    }

    private void tlsParameter(String key, String value) {
        if (!tls) {
            throw error("option 'uri': " + key + " is a TLS parameter: use amqps://");
        }
        if (key.equals("verify")) {
            if (!value.equals("verify_peer") && !value.equals("verify_none")) {
                throw error("option 'uri': verify must be verify_peer or verify_none, got '" + value + "'");
            }
            verify = value.equals("verify_peer");
            return;
        }
        if (value.isEmpty()) {
            throw error("option 'uri': " + key + " must not be empty");
        }
        switch (key) {
            case "cacertfile": cacertfile = value; break;
            case "certfile": certfile = value; break;
            case "keyfile": keyfile = value; break;
            default: serverName = value; break;
        }
    }

    private static final Pattern HOST = Pattern.compile(
            "\\[([0-9A-Fa-f:.]+)\\](?::(\\d{1,5}))?|([^\\s:/@\\[\\]]+)(?::(\\d{1,5}))?");

    /** The 'hosts' option (spark/options.py parse_hosts): host[:port],... ([v6 address]:port), at most 64. */
    private void hosts(String raw) {
        String[] items = raw.split(",", -1);
        boolean any = false;
        for (String item : items) {
            any |= !item.trim().isEmpty();
        }
        if (!any || items.length > MAX_HOSTS) {
            throw error("option 'hosts' must list 1 to " + MAX_HOSTS + " hosts as host[:port],host[:port]..., got '"
                    + raw + "'");
        }
        for (String item : items) {
            String t = item.trim();
            Matcher m = HOST.matcher(t);
            boolean ok = m.matches();
            String portText = ok ? (m.group(2) != null ? m.group(2) : m.group(4)) : null;
            int port = portText == null ? 0 : Integer.parseInt(portText);
            if (!ok || port > 65535 || (portText != null && port == 0)) {
                throw error("option 'hosts': '" + t + "' is not host[:port] (a port is 1 to 65535; an IPv6 address "
                        + "is written [address]:port)");
            }
            String h = m.group(1) != null ? m.group(1) : m.group(3);
            boolean seen = false;
            for (int i = 0; i < hostNames.size(); i++) {
                seen |= hostNames.get(i).equals(h) && hostPorts.get(i) == port;
            }
            if (!seen) {
                hostNames.add(h);
                hostPorts.add(port);
            }
        }
    }

    /** "host:port" ("[v6]:port"): an address as the pool and the metadata command's answers name it. */
    static String address(String host, int port) {
        return (host.contains(":") ? "[" + host + "]" : host) + ":" + port;
    }

    /** The addresses to try in turn, as {host, port}: uri's host on streamPort, then each of hosts. */
    java.util.List<Object[]> addresses() {
        java.util.List<Object[]> out = new java.util.ArrayList<>();
        java.util.Set<String> seen = new java.util.HashSet<>();
        out.add(new Object[] {host, streamPort});
        seen.add(address(host, streamPort));
        for (int i = 0; i < hostNames.size(); i++) {
            int port = hostPorts.get(i) == 0 ? streamPort : hostPorts.get(i);
            if (seen.add(address(hostNames.get(i), port))) {
                out.add(new Object[] {hostNames.get(i), port});
            }
        }
        return out;
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

    private static final Pattern PAIR = Pattern.compile("\\s*\"(\\d{1,9})\"\\s*:\\s*(-?\\d{1,19})\\s*");

    /** A super stream's earliest/latest (every partition: returned), or Kafka's JSON map of partition index to
     * offset, {"<super stream>": {"0": 42, "3": -2}} (also {"0": 42}), put in {@code by} (then {@code dflt}). */
    static Position partitionPositions(String raw, String name, String superStream, Map<Integer, Position> by,
                                       String dflt) {
        String text = raw.trim();
        String lower = text.toLowerCase(Locale.ROOT);
        if (lower.equals(EARLIEST) || lower.equals(LATEST)) {
            return new Position(lower, 0);
        }
        String squeezed = text.replaceAll("\\s", "");
        String prefix = "{" + Json.quote(superStream) + ":";
        String inner = squeezed.startsWith(prefix) && squeezed.endsWith("}")
                ? squeezed.substring(prefix.length(), squeezed.length() - 1) : squeezed;
        boolean ok = inner.length() > 2 && inner.startsWith("{") && inner.endsWith("}");
        if (ok) {
            for (String pair : inner.substring(1, inner.length() - 1).split(",", -1)) {
                Matcher m = PAIR.matcher(pair);
                long n;
                try {
                    n = m.matches() ? Long.parseLong(m.group(2)) : -3;
                } catch (NumberFormatException e) {
                    n = -3;
                }
                if (n < -2) {
                    ok = false;
                    break;
                }
                by.put(Integer.parseInt(m.group(1)), n == -2 ? new Position(EARLIEST, 0)
                        : n == -1 ? new Position(LATEST, 0) : new Position(OFFSET, n));
            }
        }
        if (!ok) {
            throw error("option '" + name + "' must be 'earliest', 'latest' or a JSON map of partition index to "
                    + "offset such as {\"" + superStream + "\": {\"0\": 42, \"1\": 7}} (-2 = earliest, -1 = latest), "
                    + "got '" + raw + "'");
        }
        return new Position(dflt, 0);
    }

    /** The position of a super stream's partition {@code i} (its own, or the default). */
    Position startingOf(int i) {
        return startingBy.getOrDefault(i, starting);
    }

    Position endingOf(int i) {
        return endingBy.getOrDefault(i, ending);
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

    /** A new connection to the first of {@code addrs} ({host, port}) that answers (spark/hosts.py's rule): an
     * address that does not answer (code 0) is passed over, one that answers and refuses fails at once; with
     * several and none answering, the error names each address tried and why. */
    StreamConnection connect(String purpose, java.util.List<Object[]> addrs) {
        StringBuilder tried = new StringBuilder();
        for (Object[] a : addrs) {
            try {
                return new StreamConnection(this, (String) a[0], (Integer) a[1], "hutch-spark-jvm " + purpose + " "
                        + stream);
            } catch (StreamConnection.StreamError e) {
                if (e.code != 0 || addrs.size() == 1) {
                    throw e;
                }
                tried.append(tried.length() > 0 ? "; " : "").append(address((String) a[0], (Integer) a[1]))
                        .append(": ").append(e.getMessage());
            }
        }
        throw new StreamConnection.StreamError("none of the " + addrs.size() + " hosts answered (option 'uri' and "
                + "'hosts'), tried in turn: " + tried, 0);
    }

    StreamConnection connect(String purpose) {
        return connect(purpose, addresses());
    }
}
