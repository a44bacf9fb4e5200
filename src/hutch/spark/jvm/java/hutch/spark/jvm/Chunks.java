package hutch.spark.jvm;

import java.io.ByteArrayInputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.zip.GZIPInputStream;

/**
 * Stream chunks as the broker delivers them (osiris's format, {@code hutch/queues/stream/chunk.py}): the
 * 48-byte header, then the bloom filter, the entries (simple entries and sub-batches) and the trailer.
 * {@link #records} walks a user chunk's records with offsets in [start, end) without copying them.
 *
 * <p>Rules: every length is checked against the chunk (a short or garbled chunk raises
 * IllegalArgumentException); a gzip sub-batch is inflated up to its declared length and no further (at
 * most {@link #MAX_UNCOMPRESSED_BYTES} per chunk); sub-batches of the other codecs (snappy, lz4, zstd)
 * are refused with a clear error (the Python reader reads them).
 */
final class Chunks {
    static final int HEADER_SIZE = 48;
    static final int MAGIC_VERSION = 0x50;
    static final int USER = 0;
    static final int MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024;

    private Chunks() {
    }

    /** What a walk over a chunk's records does with each: the record is data[pos, pos + len). */
    interface RecordSink {
        void record(long offset, byte[] data, int pos, int len);
    }

    private static ByteBuffer header(byte[] c) {
        if (c.length < HEADER_SIZE) {
            throw new IllegalArgumentException("chunk header needs " + HEADER_SIZE + " bytes, got " + c.length);
        }
        if ((c[0] & 0xff) != MAGIC_VERSION) {
            throw new IllegalArgumentException("bad chunk magic/version 0x" + Integer.toHexString(c[0] & 0xff));
        }
        return ByteBuffer.wrap(c);
    }

    static int chunkType(byte[] c) {
        return header(c).get(1) & 0xff;
    }

    static long recordCount(byte[] c) {
        return header(c).getInt(4) & 0xffffffffL;
    }

    static long timestamp(byte[] c) {
        return header(c).getLong(8);
    }

    static long chunkId(byte[] c) {
        return header(c).getLong(24);
    }

    /** One past the chunk's last offset. */
    static long nextOffset(byte[] c) {
        return chunkId(c) + recordCount(c);
    }

    /** Each non-empty record of a user chunk with an offset in [start, end), in order. */
    static void records(byte[] c, long start, long end, RecordSink sink) {
        ByteBuffer h = header(c);
        long dataSize = h.getInt(36) & 0xffffffffL;
        int bloom = h.get(44) & 0xff;
        long pos = HEADER_SIZE + bloom;
        long stop = pos + dataSize;
        if (stop > c.length) {
            throw new IllegalArgumentException("chunk " + chunkId(c) + " is short: " + c.length + " bytes");
        }
        long offset = chunkId(c);
        long budget = MAX_UNCOMPRESSED_BYTES;
        while (pos < stop && offset < end) {
            int p = (int) pos;
            if ((c[p] & 0x80) != 0) {
                if (p + 11 > stop) {
                    throw new IllegalArgumentException("a sub-batch header runs past the chunk's data");
                }
                int compression = (c[p] >> 4) & 0x7;
                int n = h.getShort(p + 1) & 0xffff;
                long usize = h.getInt(p + 3) & 0xffffffffL;
                long length = h.getInt(p + 7) & 0xffffffffL;
                int body = p + 11;
                if (body + length > stop) {
                    throw new IllegalArgumentException("a sub-batch runs past the chunk's data");
                }
                pos = body + length;
                if (offset + n <= start) {
                    offset += n;
                    continue;
                }
                byte[] data = c;
                int from = body;
                int to = (int) (body + length);
                if (compression != 0) {
                    if (compression != 1) {
                        throw new IllegalArgumentException("a sub-batch compressed with codec " + compression
                                + " (the JVM reader inflates gzip only; the Python source reads every codec)");
                    }
                    if (usize > budget) {
                        throw new IllegalArgumentException("a sub-batch of " + usize + " bytes uncompressed is over"
                                + " the chunk's budget");
                    }
                    budget -= usize;
                    data = gunzip(c, body, (int) length, (int) usize);
                    from = 0;
                    to = data.length;
                }
                int q = from;
                for (int i = 0; i < n; i++) {
                    if (q + 4 > to) {
                        throw new IllegalArgumentException("a sub-batch's records run past it");
                    }
                    int len = ByteBuffer.wrap(data).getInt(q);
                    q += 4;
                    if (len < 0 || q + len > to) {
                        throw new IllegalArgumentException("a sub-batch's records run past it");
                    }
                    if (offset >= start && offset < end && len > 0) {
                        sink.record(offset, data, q, len);
                    }
                    q += len;
                    offset++;
                }
                continue;
            }
            if (p + 4 > stop) {
                throw new IllegalArgumentException("an entry header runs past the chunk's data");
            }
            long len = h.getInt(p) & 0x7fffffffL;
            p += 4;
            if (p + len > stop) {
                throw new IllegalArgumentException("an entry runs past the chunk's data");
            }
            if (len > 0 && offset >= start) {
                sink.record(offset, c, p, (int) len);
            }
            pos = p + len;
            offset++;
        }
    }

    private static byte[] gunzip(byte[] c, int pos, int len, int usize) {
        byte[] out = new byte[usize];
        try (InputStream z = new GZIPInputStream(new ByteArrayInputStream(c, pos, len))) {
            int got = 0;
            while (got < usize) {
                int r = z.read(out, got, usize - got);
                if (r < 0) {
                    break;
                }
                got += r;
            }
            if (got != usize || z.read() >= 0) {
                throw new IllegalArgumentException("a gzip sub-batch does not inflate to its declared " + usize
                        + " bytes");
            }
        } catch (IOException e) {
            throw new IllegalArgumentException("a gzip sub-batch does not inflate: " + e.getMessage());
        }
        return out;
    }
}
