package hutch.spark.jvm;

import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.UUID;

/**
 * AMQP 1.0 values as a stream's records hold them: the decoder ({@link Cursor}, the Java counterpart of
 * {@code hutch.queues.stream.amqp10.decode_value}: the same types, the same refusals) and the value
 * classes it gives beside Java's own (null, Boolean, Long, Double, String, byte[], UUID, List, Map).
 * Rules: every read is bounded by the buffer; nesting at most {@link #MAX_DEPTH}.
 */
final class Amqp10 {
    static final int MAX_DEPTH = 32;

    private Amqp10() {
    }

    /** Not an AMQP 1.0 message as to_091 reads it. */
    static final class Bad extends Exception {
        private static final long serialVersionUID = 1L;

        Bad(String why) {
            super(why, null, false, false);
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
