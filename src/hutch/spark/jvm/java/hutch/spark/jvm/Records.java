package hutch.spark.jvm;

import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.util.ArrayBasedMapData;
import org.apache.spark.sql.catalyst.util.GenericArrayData;
import org.apache.spark.sql.catalyst.util.MapData;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * A stream's stored records (AMQP 1.0 messages as RabbitMQ stores them) into the rows of a read, in the
 * stream schema ({@link Schema}): what an AMQP 0-9-1 consumer of the stream receives, by the broker's
 * mapping ({@code hutch.queues.stream.amqp10.to_091}), the values exactly as the Python source's
 * ({@code spark/records.py}): header values as text (strings as they are, everything else as Python's
 * {@code json.dumps} writes it), {@code timestamp} the publisher's timestamp property, a record that is not
 * an AMQP 1.0 message a row of its bytes and nothing else.
 *
 * <p>How: a record's sections are found by their size fields; the header, message-annotations and
 * application-properties sections, which repeat from message to message, are mapped once per distinct
 * byte string (a bounded cache); the properties section is decoded per record (or taken from its own
 * cache); the data sections are the body. Rules: caches hold at most {@link #CACHE_MAX} entries each
 * (emptied when full); every read is bounded by the record; nesting at most {@link #MAX_DEPTH}.
 */
final class Records {
    static final int CACHE_MAX = 4096;
    static final int MAX_DEPTH = 32;
    private static final int HEADER = 0x70, DELIVERY_ANNOTATIONS = 0x71, MESSAGE_ANNOTATIONS = 0x72, PROPERTIES = 0x73,
            APPLICATION_PROPERTIES = 0x74, DATA = 0x75, AMQP_SEQUENCE = 0x76, AMQP_VALUE = 0x77;
    private static final long MICROS_MAX_S = Long.MAX_VALUE / 1_000_000;

    private final boolean includeHeaders;
    private final UTF8String stream;
    private final int partition;
    private final Map<ByteKey, Base> bases = new HashMap<>();
    private final Map<ByteKey, Object[]> props = new HashMap<>();

    Records(String stream, int partition, boolean includeHeaders) {
        this.stream = UTF8String.fromString(stream);
        this.partition = partition;
        this.includeHeaders = includeHeaders;
    }

    /** Not an AMQP 1.0 message as to_091 reads it. */
    static final class Bad extends Exception {
        private static final long serialVersionUID = 1L;

        Bad(String why) {
            super(why, null, false, false);
        }
    }

    /** A byte range as a hash key (copied). */
    static final class ByteKey {
        final byte[] b;
        final int hash;

        ByteKey(byte[] b) {
            this.b = b;
            this.hash = Arrays.hashCode(b);
        }

        @Override
        public boolean equals(Object o) {
            return o instanceof ByteKey && Arrays.equals(b, ((ByteKey) o).b);
        }

        @Override
        public int hashCode() {
            return hash;
        }
    }

    /** What the header, message-annotations and application-properties sections say. */
    static final class Base {
        UTF8String exchange = UTF8String.EMPTY_UTF8, routingKey = UTF8String.EMPTY_UTF8;
        Integer deliveryMode, priority;
        String expiration, type, appId;  // appId: RabbitMQ 3.x's x-basic-app-id (overrides the properties')
        MapData headers;  // null: none (or includeHeaders=false)
        private InternalRow plain;

        /** The properties struct's values this base gives (the rest null, for the properties section). */
        Object[] propertiesRow() {
            Object[] pr = new Object[13];
            pr[2] = deliveryMode;
            pr[3] = priority;
            pr[6] = expiration == null ? null : UTF8String.fromString(expiration);
            pr[9] = type == null ? null : UTF8String.fromString(type);
            pr[11] = appId == null ? null : UTF8String.fromString(appId);
            return pr;
        }

        /** The properties struct of a record without a properties section (shared: rows never change it). */
        InternalRow plainProperties() {
            if (plain == null) {
                plain = new GenericInternalRow(propertiesRow());
            }
            return plain;
        }
    }

    static final class Symbol {
        final String text;

        Symbol(String text) {
            this.text = text;
        }

        @Override
        public String toString() {
            return text;
        }
    }

    static final class ULong {
        final long bits;  // unsigned

        ULong(long bits) {
            this.bits = bits;
        }
    }

    static final class AmqpTimestamp {
        final long ms;

        AmqpTimestamp(long ms) {
            this.ms = ms;
        }
    }

    static final class Described {
        final Object descriptor, value;

        Described(Object descriptor, Object value) {
            this.descriptor = descriptor;
            this.value = value;
        }
    }

    // -- one record -> one row ----------------------------------------------------------------------

    InternalRow row(long offset, byte[] d, int pos, int len) {
        try {
            return decoded(offset, d, pos, len);
        } catch (Bad | IndexOutOfBoundsException | IllegalArgumentException e) {
            Object[] v = new Object[9];
            v[1] = Arrays.copyOfRange(d, pos, pos + len);
            v[2] = stream;
            v[3] = partition;
            v[4] = offset;
            return new GenericInternalRow(v);
        }
    }

    // per-record scratch (a Records belongs to one read task: one thread)
    private final int[] codes = new int[8], starts = new int[8], ends = new int[8];
    private final List<int[]> data = new ArrayList<>(2);
    private byte[] lastKey;
    private Base lastBase;

    private InternalRow decoded(long offset, byte[] d, int pos, int len) throws Bad {
        int end = pos + len;
        int n = 0;
        data.clear();
        List<int[]> valueSections = null;
        int p = pos;
        while (p < end) {
            int start = p;
            int code;
            if (end - p >= 5 && d[p] == 0 && d[p + 1] == 0x53) {
                code = d[p + 2] & 0xff;
                p += 3;
            } else {
                if (d[p] != 0) {
                    throw new Bad("an AMQP 1.0 message section is a described value with a numeric descriptor");
                }
                Cursor c = new Cursor(d, p + 1, end);
                Object desc = c.value(1);
                if (!(desc instanceof Long || desc instanceof ULong)) {
                    throw new Bad("an AMQP 1.0 message section is a described value with a numeric descriptor");
                }
                code = desc instanceof Long ? (int) (long) (Long) desc : (int) ((ULong) desc).bits;
                p = c.pos;
            }
            int ctor = d[p] & 0xff;
            if (code == DATA && (ctor == 0xa0 || ctor == 0xb0)) {
                int width = ctor == 0xa0 ? 1 : 4;
                need(p + 1 + width, end);
                long size = width == 1 ? (d[p + 1] & 0xff) : (ByteBuffer.wrap(d).getInt(p + 1) & 0xffffffffL);
                p += 1 + width;
                need(p + size, end);
                data.add(new int[] {p, (int) (p + size), start});
                p += (int) size;
                continue;
            }
            Cursor c = new Cursor(d, p, end);
            if (code == HEADER || code == MESSAGE_ANNOTATIONS || code == PROPERTIES || code == APPLICATION_PROPERTIES) {
                c.skip(0);  // decoded in full when its bytes are not in a cache (base, properties): bad ones fail there
            } else {
                c.value(0);
            }
            if (code == AMQP_VALUE || code == AMQP_SEQUENCE || code == DATA) {
                if (valueSections == null) {
                    valueSections = new ArrayList<>(1);
                }
                valueSections.add(new int[] {p, c.pos, start, code});
            } else if (n < 8) {
                codes[n] = code;
                starts[n] = start;
                ends[n] = c.pos;
                n++;
            } else {
                throw new Bad("too many sections");
            }
            p = c.pos;
        }
        Base base = base(d, n);
        Object[] pf = null;  // message_id, user_id, reply_to, correlation_id, content_type, content_encoding, ts s, app_id
        for (int i = 0; i < n; i++) {
            if (codes[i] == PROPERTIES) {
                ByteKey pk = new ByteKey(Arrays.copyOfRange(d, starts[i], ends[i]));
                pf = props.get(pk);
                if (pf == null) {
                    pf = properties(d, starts[i], ends[i]);
                    if (props.size() >= CACHE_MAX) {
                        props.clear();
                    }
                    props.put(pk, pf);
                }
            }
        }
        byte[] body = body(d, data, valueSections);
        Long tsMicros = null;
        InternalRow struct;
        if (pf == null) {
            struct = base.plainProperties();
        } else {
            if (pf[6] != null) {
                long s = (Long) pf[6];
                if (s < -MICROS_MAX_S || s > MICROS_MAX_S) {
                    throw new IllegalStateException("a message's timestamp of " + s + " s is out of range");
                }
                tsMicros = s * 1_000_000;
            }
            Object[] pr = base.propertiesRow();
            pr[0] = pf[4];
            pr[1] = pf[5];
            pr[4] = pf[3];
            pr[5] = pf[2];
            pr[7] = pf[0];
            pr[8] = tsMicros;
            pr[10] = pf[1];
            if (base.appId == null) {
                pr[11] = pf[7];
            }
            struct = new GenericInternalRow(pr);
        }
        Object[] v = new Object[9];
        v[0] = base.routingKey;
        v[1] = body;
        v[2] = stream;
        v[3] = partition;
        v[4] = offset;
        v[5] = tsMicros;
        v[6] = base.exchange;
        v[7] = base.headers;
        v[8] = struct;
        return new GenericInternalRow(v);
    }

    /** The base of the record's header, annotations and application properties: the last record's when they
     * are the same bytes (one publisher's messages mostly are), else from the cache, else mapped now. */
    private Base base(byte[] d, int n) throws Bad {
        int baseLen = 0;
        for (int i = 0; i < n; i++) {
            if (codes[i] == HEADER || codes[i] == MESSAGE_ANNOTATIONS || codes[i] == APPLICATION_PROPERTIES) {
                baseLen += 5 + ends[i] - starts[i];
            }
        }
        if (lastKey != null && lastKey.length == baseLen && sameAsLast(d, n)) {
            return lastBase;
        }
        byte[] key = new byte[baseLen];
        ByteBuffer kb = ByteBuffer.wrap(key);
        for (int i = 0; i < n; i++) {
            if (codes[i] == HEADER || codes[i] == MESSAGE_ANNOTATIONS || codes[i] == APPLICATION_PROPERTIES) {
                kb.put((byte) codes[i]).putInt(ends[i] - starts[i]).put(d, starts[i], ends[i] - starts[i]);
            }
        }
        ByteKey bk = new ByteKey(key);
        Base base = bases.get(bk);
        if (base == null) {
            base = mapBase(d, n);
            if (bases.size() >= CACHE_MAX) {
                bases.clear();
            }
            bases.put(bk, base);
        }
        lastKey = key;
        lastBase = base;
        return base;
    }

    private boolean sameAsLast(byte[] d, int n) {
        int at = 0;
        for (int i = 0; i < n; i++) {
            if (codes[i] == HEADER || codes[i] == MESSAGE_ANNOTATIONS || codes[i] == APPLICATION_PROPERTIES) {
                int size = ends[i] - starts[i];
                if (lastKey[at] != (byte) codes[i] || ByteBuffer.wrap(lastKey).getInt(at + 1) != size
                        || !Arrays.equals(lastKey, at + 5, at + 5 + size, d, starts[i], ends[i])) {
                    return false;
                }
                at += 5 + size;
            }
        }
        return true;
    }

    private static void need(long upTo, int end) throws Bad {
        if (upTo > end) {
            throw new Bad("AMQP 1.0 value runs past its buffer");
        }
    }

    private static byte[] body(byte[] d, List<int[]> data, List<int[]> valueSections) throws Bad {
        if (!data.isEmpty() && valueSections == null) {
            if (data.size() == 1) {
                int[] r = data.get(0);
                return Arrays.copyOfRange(d, r[0], r[1]);
            }
            return concat(d, data);
        }
        if (valueSections != null && valueSections.size() == 1 && data.isEmpty()) {
            int[] r = valueSections.get(0);
            Object value = new Cursor(d, r[0], r[1]).value(0);
            if (r[3] == AMQP_VALUE || r[3] == AMQP_SEQUENCE) {
                if (value instanceof byte[]) {
                    return (byte[]) value;
                }
                if (value instanceof String) {
                    return ((String) value).getBytes(StandardCharsets.UTF_8);
                }
            }
        }
        // an unusual mix of body sections: the encoded sections as they are, in record order
        List<int[]> all = new ArrayList<>();
        for (int[] r : data) {
            all.add(new int[] {r[2], r[1]});
        }
        if (valueSections != null) {
            for (int[] r : valueSections) {
                all.add(new int[] {r[2], r[1]});
            }
        }
        all.sort((a, b) -> Integer.compare(a[0], b[0]));
        return concat(d, all);
    }

    /** The bytes d[r[0], r[1]) of each range, one after the other. */
    private static byte[] concat(byte[] d, List<int[]> ranges) {
        int size = 0;
        for (int[] r : ranges) {
            size += r[1] - r[0];
        }
        byte[] out = new byte[size];
        int at = 0;
        for (int[] r : ranges) {
            System.arraycopy(d, r[0], out, at, r[1] - r[0]);
            at += r[1] - r[0];
        }
        return out;
    }

    private Base mapBase(byte[] d, int n) throws Bad {
        Base b = new Base();
        String exchange = "", routingKey = "";
        boolean sawHeader = false;
        LinkedHashMap<String, Object> headers = new LinkedHashMap<>();
        for (int i = 0; i < n; i++) {
            int code = codes[i];
            if (code != HEADER && code != MESSAGE_ANNOTATIONS && code != APPLICATION_PROPERTIES) {
                continue;
            }
            Cursor c = new Cursor(d, starts[i], ends[i]);
            Object value = c.section();
            if (code == HEADER && value instanceof List) {
                sawHeader = true;
                List<?> f = (List<?>) value;
                if (truthy(get(f, 0))) {
                    b.deliveryMode = 2;
                }
                Object prio = get(f, 1);
                b.priority = prio == null ? null : toInt(prio);
                if (get(f, 2) != null) {
                    b.expiration = pyStr(get(f, 2));
                }
            } else if (code == MESSAGE_ANNOTATIONS && value instanceof Map) {
                for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                    String k = pyStr(e.getKey());
                    Object v = e.getValue();
                    switch (k) {
                        case "x-exchange": exchange = pyStr(v); break;
                        case "x-routing-key": routingKey = pyStr(v); break;
                        case "x-basic-type": b.type = pyStr(v); break;
                        case "x-basic-delivery-mode": b.deliveryMode = toInt(v); break;
                        case "x-basic-expiration": b.expiration = pyStr(v); break;
                        case "x-basic-priority": b.priority = toInt(v); break;
                        default:
                            if (k.startsWith("x-")) {
                                headers.put(k, headerValue(v));
                            }
                    }
                }
            } else if (code == APPLICATION_PROPERTIES && value instanceof Map) {
                for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                    String k = pyStr(e.getKey());
                    if (k.equals("x-basic-type") && !sawHeader) {
                        b.type = pyStr(e.getValue());
                    } else if (k.equals("x-basic-app-id") && !sawHeader) {
                        b.appId = pyStr(e.getValue());
                    } else {
                        headers.put(k, headerValue(e.getValue()));
                    }
                }
            }
        }
        b.exchange = UTF8String.fromString(exchange);
        b.routingKey = UTF8String.fromString(routingKey);
        if (includeHeaders && !headers.isEmpty()) {
            Object[] ks = new Object[headers.size()], vs = new Object[headers.size()];
            int i = 0;
            for (Map.Entry<String, Object> e : headers.entrySet()) {
                ks[i] = UTF8String.fromString(e.getKey());
                vs[i] = UTF8String.fromString(headerText(e.getValue()));
                i++;
            }
            b.headers = new ArrayBasedMapData(new GenericArrayData(ks), new GenericArrayData(vs));
        }
        return b;
    }

    private static Object[] properties(byte[] d, int start, int end) throws Bad {
        Object value = new Cursor(d, start, end).section();
        Object[] out = new Object[8];
        if (!(value instanceof List)) {
            return out;
        }
        List<?> f = (List<?>) value;
        out[0] = utf8(propStr(get(f, 0)));
        out[1] = utf8(propStr(get(f, 1)));
        out[2] = utf8(propStr(get(f, 4)));
        out[3] = utf8(propStr(get(f, 5)));
        out[4] = utf8(propStr(get(f, 6)));
        out[5] = utf8(propStr(get(f, 7)));
        Object ts = get(f, 9);
        if (ts != null) {
            out[6] = Math.floorDiv(toLong(ts), 1000L);
        }
        out[7] = utf8(propStr(get(f, 10)));
        return out;
    }

    private static UTF8String utf8(String s) {
        return s == null ? null : UTF8String.fromString(s);
    }

    private static Object get(List<?> f, int i) {
        return i < f.size() ? f.get(i) : null;
    }

    private static boolean truthy(Object v) {
        if (v == null) {
            return false;
        }
        if (v instanceof Boolean) {
            return (Boolean) v;
        }
        if (v instanceof Long) {
            return (Long) v != 0;
        }
        if (v instanceof Double) {
            return (Double) v != 0;
        }
        if (v instanceof ULong) {
            return ((ULong) v).bits != 0;
        }
        if (v instanceof String) {
            return !((String) v).isEmpty();
        }
        if (v instanceof byte[]) {
            return ((byte[]) v).length > 0;
        }
        if (v instanceof List) {
            return !((List<?>) v).isEmpty();
        }
        if (v instanceof Map) {
            return !((Map<?, ?>) v).isEmpty();
        }
        return true;
    }

    private static long toLong(Object v) throws Bad {
        if (v instanceof Long) {
            return (Long) v;
        }
        if (v instanceof AmqpTimestamp) {
            return ((AmqpTimestamp) v).ms;
        }
        if (v instanceof ULong) {
            return ((ULong) v).bits;
        }
        if (v instanceof Boolean) {
            return (Boolean) v ? 1 : 0;
        }
        throw new Bad("not an integer: " + v);
    }

    private static Integer toInt(Object v) throws Bad {
        long x = toLong(v);
        if (x < Integer.MIN_VALUE || x > Integer.MAX_VALUE) {
            throw new Bad("an integer out of range: " + x);
        }
        return (int) x;
    }

    /** A properties field as text: the broker's `_str` (bytes as UTF-8 with U+FFFD, a UUID as urn:uuid:). */
    private static String propStr(Object v) {
        if (v == null) {
            return null;
        }
        if (v instanceof byte[]) {
            return new String((byte[]) v, StandardCharsets.UTF_8);
        }
        if (v instanceof UUID) {
            return "urn:uuid:" + v;
        }
        return pyStr(v);
    }

    /** Python's str() of a decoded value, for the types a route, a key or a property holds. */
    static String pyStr(Object v) {
        if (v == null) {
            return "None";
        }
        if (v instanceof String) {
            return (String) v;
        }
        if (v instanceof Symbol) {
            return ((Symbol) v).text;
        }
        if (v instanceof Boolean) {
            return (Boolean) v ? "True" : "False";
        }
        if (v instanceof ULong) {
            return Long.toUnsignedString(((ULong) v).bits);
        }
        if (v instanceof AmqpTimestamp) {
            return Long.toString(((AmqpTimestamp) v).ms);
        }
        if (v instanceof Double) {
            return pyFloat((Double) v);
        }
        if (v instanceof Described) {
            return pyStr(((Described) v).value);
        }
        return String.valueOf(v);
    }

    /** `_header_value`: an AMQP 1.0 value as the 0-9-1 field-table value the broker makes of it. */
    static Object headerValue(Object v) {
        if (v instanceof AmqpTimestamp) {
            return Math.floorDiv(((AmqpTimestamp) v).ms, 1000L);
        }
        if (v instanceof Symbol) {
            return ((Symbol) v).text;
        }
        if (v instanceof ULong) {
            long bits = ((ULong) v).bits;
            return bits >= 0 ? (Object) bits : Long.toUnsignedString(bits);
        }
        if (v instanceof UUID) {
            return v.toString();
        }
        if (v instanceof Described) {
            return headerValue(((Described) v).value);
        }
        if (v instanceof List) {
            List<Object> out = new ArrayList<>();
            for (Object x : (List<?>) v) {
                out.add(headerValue(x));
            }
            return out;
        }
        if (v instanceof Map) {
            LinkedHashMap<String, Object> out = new LinkedHashMap<>();
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                out.put(pyStr(e.getKey()), headerValue(e.getValue()));
            }
            return out;
        }
        return v;
    }

    /** `schema.header_text`: strings as they are, bytes as UTF-8 (bad bytes as \xNN), the rest as JSON. */
    static String headerText(Object v) {
        if (v instanceof String) {
            return (String) v;
        }
        if (v instanceof byte[]) {
            return backslashReplace((byte[]) v);
        }
        StringBuilder sb = new StringBuilder();
        json(v, sb);
        return sb.toString();
    }

    private static void json(Object v, StringBuilder sb) {
        if (v == null) {
            sb.append("null");
        } else if (v instanceof Boolean) {
            sb.append((Boolean) v ? "true" : "false");
        } else if (v instanceof Long) {
            sb.append((long) (Long) v);
        } else if (v instanceof Double) {
            double x = (Double) v;
            sb.append(Double.isNaN(x) ? "NaN" : Double.isInfinite(x) ? (x > 0 ? "Infinity" : "-Infinity") : pyFloat(x));
        } else if (v instanceof String) {
            jsonString((String) v, sb);
        } else if (v instanceof byte[]) {
            jsonString(backslashReplace((byte[]) v), sb);
        } else if (v instanceof List) {
            sb.append('[');
            boolean first = true;
            for (Object x : (List<?>) v) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                json(x, sb);
            }
            sb.append(']');
        } else if (v instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                jsonString(String.valueOf(e.getKey()), sb);
                sb.append(':');
                json(e.getValue(), sb);
            }
            sb.append('}');
        } else {
            jsonString(pyStr(v), sb);
        }
    }

    /** json.dumps of a str (ensure_ascii: every non-ASCII UTF-16 unit as \\uXXXX). */
    private static void jsonString(String s, StringBuilder sb) {
        sb.append('"');
        for (int i = 0; i < s.length(); i++) {
            char ch = s.charAt(i);
            switch (ch) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                case '\b': sb.append("\\b"); break;
                case '\f': sb.append("\\f"); break;
                default:
                    if (ch < 0x20 || ch > 0x7e) {
                        sb.append(String.format("\\u%04x", (int) ch));
                    } else {
                        sb.append(ch);
                    }
            }
        }
        sb.append('"');
    }

    /** bytes.decode("utf-8", "backslashreplace"). */
    static String backslashReplace(byte[] b) {
        CharsetDecoder dec = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                .onUnmappableCharacter(CodingErrorAction.REPORT);
        StringBuilder sb = new StringBuilder();
        ByteBuffer in = ByteBuffer.wrap(b);
        CharBuffer out = CharBuffer.allocate(b.length + 1);
        while (true) {
            java.nio.charset.CoderResult r = dec.decode(in, out, true);
            if (r.isError()) {
                for (int i = 0; i < r.length(); i++) {
                    out.flip();
                    sb.append(out);
                    out.clear();
                    sb.append(String.format("\\x%02x", in.get() & 0xff));
                }
                continue;
            }
            break;
        }
        dec.flush(out);
        out.flip();
        sb.append(out);
        return sb.toString();
    }

    /** Python's repr() of a float. */
    static String pyFloat(double x) {
        if (Double.isNaN(x)) {
            return "nan";
        }
        if (Double.isInfinite(x)) {
            return x > 0 ? "inf" : "-inf";
        }
        if (x == 0) {
            return (1 / x < 0) ? "-0.0" : "0.0";
        }
        BigDecimal bd = new BigDecimal(Double.toString(x)).stripTrailingZeros();
        String digits = bd.unscaledValue().abs().toString();
        int exp = digits.length() - 1 - bd.scale();  // decimal exponent of the first digit
        String sign = x < 0 ? "-" : "";
        if (exp >= -5 && exp < 16) {
            String plain = bd.abs().toPlainString();
            return sign + (plain.contains(".") ? plain : plain + ".0");
        }
        String mant = digits.length() == 1 ? digits : digits.charAt(0) + "." + digits.substring(1);
        return sign + mant + "e" + (exp < 0 ? "-" : "+") + (Math.abs(exp) < 10 ? "0" : "") + Math.abs(exp);
    }

    // -- the AMQP 1.0 value decoder ({@code amqp10.decode_value}) -------------------------------------

    static final class Cursor {
        final byte[] d;
        int pos;
        final int end;

        Cursor(byte[] d, int pos, int end) {
            this.d = d;
            this.pos = pos;
            this.end = end;
        }

        /** A section at pos: 0x00, its descriptor, its value; the value returned. */
        Object section() throws Bad {
            Object v = value(0);
            if (!(v instanceof Described)) {
                throw new Bad("not a section");
            }
            return ((Described) v).value;
        }

        private void need(int n) throws Bad {
            if (pos + n > end || n < 0) {
                throw new Bad("AMQP 1.0 value runs past its buffer");
            }
        }

        private long fixed(int n) throws Bad {
            need(n);
            long v = 0;
            for (int i = 0; i < n; i++) {
                v = (v << 8) | (d[pos + i] & 0xff);
            }
            pos += n;
            return v;
        }

        private String text(int n) throws Bad {
            need(n);
            boolean ascii = true;
            for (int i = pos; i < pos + n && ascii; i++) {
                ascii = d[i] >= 0;
            }
            if (ascii) {
                String s = new String(d, pos, n, StandardCharsets.ISO_8859_1);
                pos += n;
                return s;
            }
            try {
                String s = StandardCharsets.UTF_8.newDecoder().onMalformedInput(CodingErrorAction.REPORT)
                        .onUnmappableCharacter(CodingErrorAction.REPORT).decode(ByteBuffer.wrap(d, pos, n)).toString();
                pos += n;
                return s;
            } catch (CharacterCodingException e) {
                throw new Bad("bad UTF-8");
            }
        }

        /** Move past one value by its constructor and size fields, decoding nothing; where the value ends is
         * where {@link #value} would end when it decodes. */
        void skip(int depth) throws Bad {
            if (depth > MAX_DEPTH) {
                throw new Bad("AMQP 1.0 value nested too deep");
            }
            need(1);
            int code = d[pos++] & 0xff;
            int width;
            switch (code) {
                case 0x00:
                    skip(depth + 1);
                    skip(depth + 1);
                    return;
                case 0x40: case 0x41: case 0x42: case 0x43: case 0x44: case 0x45:
                    return;
                case 0x50: case 0x51: case 0x52: case 0x53: case 0x54: case 0x55: case 0x56:
                    width = 1;
                    break;
                case 0x60: case 0x61:
                    width = 2;
                    break;
                case 0x70: case 0x71: case 0x72:
                    width = 4;
                    break;
                case 0x80: case 0x81: case 0x82: case 0x83:
                    width = 8;
                    break;
                case 0x98:
                    width = 16;
                    break;
                case 0xa0: case 0xa1: case 0xa3: case 0xc0: case 0xc1: case 0xe0:
                    width = 1 + (int) peek(1);
                    break;
                case 0xb0: case 0xb1: case 0xb3: case 0xd0: case 0xd1: case 0xf0: {
                    long n = peek(4);
                    if (n > Integer.MAX_VALUE - 4) {
                        throw new Bad("AMQP 1.0 value runs past its buffer");
                    }
                    width = 4 + (int) n;
                    break;
                }
                default:
                    throw new Bad("unknown AMQP 1.0 type code 0x" + Integer.toHexString(code));
            }
            need(width);
            pos += width;
        }

        private long peek(int n) throws Bad {
            long v = fixed(n);
            pos -= n;
            return v;
        }

        Object value(int depth) throws Bad {
            need(1);
            int code = d[pos++] & 0xff;
            return as(code, depth);
        }

        private Object as(int code, int depth) throws Bad {
            if (depth > MAX_DEPTH) {
                throw new Bad("AMQP 1.0 value nested too deep");
            }
            switch (code) {
                case 0x40: return null;
                case 0x41: return Boolean.TRUE;
                case 0x42: return Boolean.FALSE;
                case 0x43: return 0L;
                case 0x44: return new ULong(0);
                case 0x45: return new ArrayList<>();
                case 0x50: case 0x52: return fixed(1);
                case 0x51: case 0x54: case 0x55: return (long) (byte) fixed(1);
                case 0x53: return new ULong(fixed(1));
                case 0x56: return fixed(1) != 0;
                case 0x60: return fixed(2);
                case 0x61: return (long) (short) fixed(2);
                case 0x70: return fixed(4);
                case 0x71: return (long) (int) fixed(4);
                case 0x80: return new ULong(fixed(8));
                case 0x81: return fixed(8);
                case 0x72: return (double) Float.intBitsToFloat((int) fixed(4));
                case 0x82: return Double.longBitsToDouble(fixed(8));
                case 0x83: return new AmqpTimestamp(fixed(8));
                case 0x98: {
                    long hi = fixed(8), lo = fixed(8);
                    return new UUID(hi, lo);
                }
                case 0xa0: return bin((int) fixed(1));
                case 0xb0: return bin(len32());
                case 0xa1: return text((int) fixed(1));
                case 0xb1: return text(len32());
                case 0xa3: return new Symbol(text((int) fixed(1)));
                case 0xb3: return new Symbol(text(len32()));
                case 0x00: {
                    Object desc = value(depth + 1);
                    Object v = value(depth + 1);
                    return new Described(desc, v);
                }
                case 0xc0: case 0xc1: case 0xe0: case 0xd0: case 0xd1: case 0xf0: {
                    boolean small = code == 0xc0 || code == 0xc1 || code == 0xe0;
                    int w = small ? 1 : 4;
                    need(2 * w);
                    long size = fixed(w);
                    int compoundEnd = (int) Math.min((long) pos + size, Integer.MAX_VALUE);
                    if (pos + size > end) {
                        throw new Bad("AMQP 1.0 value runs past its buffer");
                    }
                    long count = fixed(w);
                    List<Object> values = new ArrayList<>();
                    if (code == 0xe0 || code == 0xf0) {
                        need(1);
                        int ctor = d[pos++] & 0xff;
                        for (long i = 0; i < count; i++) {
                            values.add(as(ctor, depth + 1));
                        }
                    } else {
                        for (long i = 0; i < count; i++) {
                            values.add(value(depth + 1));
                        }
                    }
                    if (pos > compoundEnd) {
                        throw new Bad("AMQP 1.0 compound runs past its size");
                    }
                    pos = compoundEnd;
                    if (code == 0xc1 || code == 0xd1) {
                        LinkedHashMap<Object, Object> m = new LinkedHashMap<>();
                        for (int i = 0; i + 1 < values.size(); i += 2) {
                            m.put(values.get(i), values.get(i + 1));
                        }
                        return m;
                    }
                    return values;
                }
                default:
                    throw new Bad("unknown AMQP 1.0 type code 0x" + Integer.toHexString(code));
            }
        }


        private int len32() throws Bad {
            long n = fixed(4);
            if (n > Integer.MAX_VALUE) {
                throw new Bad("AMQP 1.0 value runs past its buffer");
            }
            return (int) n;
        }

        private byte[] bin(int n) throws Bad {
            need(n);
            byte[] b = Arrays.copyOfRange(d, pos, pos + n);
            pos += n;
            return b;
        }
    }
}
