package hutch.spark.jvm;

import java.math.BigDecimal;
import java.nio.ByteBuffer;
import java.nio.CharBuffer;
import java.nio.charset.CharsetDecoder;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import hutch.spark.jvm.Amqp10.AmqpTimestamp;
import hutch.spark.jvm.Amqp10.Described;
import hutch.spark.jvm.Amqp10.Symbol;
import hutch.spark.jvm.Amqp10.ULong;

/**
 * Decoded AMQP 1.0 values as text exactly as the Python source writes them: Python's {@code str()} of a
 * value (a route, a key, a property), the broker's {@code _header_value} mapping of a header value, and
 * {@code schema.header_text} (strings as they are, bytes as UTF-8 with bad bytes as \xNN, everything else
 * as Python's {@code json.dumps}: floats by Python's {@code repr}, non-ASCII escaped).
 */
final class PyText {
    private PyText() {
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
}
