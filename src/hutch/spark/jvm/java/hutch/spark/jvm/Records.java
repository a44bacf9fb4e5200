package hutch.spark.jvm;

import static hutch.spark.jvm.PyText.headerText;
import static hutch.spark.jvm.PyText.headerValue;
import static hutch.spark.jvm.PyText.pyStr;

import java.nio.ByteBuffer;
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

import hutch.spark.jvm.Amqp10.AmqpTimestamp;
import hutch.spark.jvm.Amqp10.Bad;
import hutch.spark.jvm.Amqp10.Cursor;
import hutch.spark.jvm.Amqp10.ULong;

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


}
