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
 * IllegalArgumentException); a compressed sub-batch (gzip, snappy, lz4, zstd: {@link #decode}) is decoded up
 * to its declared length and no further (at most {@link #MAX_UNCOMPRESSED_BYTES} per chunk); a sub-batch
 * that cannot be read (another codec, a damaged body, records that do not fill it) is left out with a
 * warning, as the Python source leaves it out (queues/stream/chunk.py).
 */
final class Chunks {
    private static final java.util.logging.Logger LOG = java.util.logging.Logger.getLogger("hutch.spark.jvm");
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
                try {
                    if (compression != 0) {
                        if (usize > budget) {
                            throw new BadSubBatch(CODECS[Math.min(compression, 5)] + " sub-batch declares " + usize
                                    + " bytes uncompressed, over the limit of " + budget);
                        }
                        data = decode(compression, c, body, (int) length, (int) usize);
                        from = 0;
                        to = data.length;
                    }
                    fills(data, from, to, n);
                } catch (BadSubBatch e) {
                    // as the Python source (chunk.record_list): a sub-batch that cannot be read is left out
                    LOG.warning("hutch-jvm source: skipped the " + n + " records of a sub-batch at offset " + offset
                            + ": " + e.getMessage());
                    offset += n;
                    continue;
                }
                budget -= usize;  // as chunk._batch_records: every sub-batch read takes its declared size
                int q = from;
                for (int i = 0; i < n; i++) {
                    int len = ((data[q] & 0xff) << 24) | ((data[q + 1] & 0xff) << 16) | ((data[q + 2] & 0xff) << 8)
                            | (data[q + 3] & 0xff);
                    q += 4;
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

    /** A sub-batch that cannot be read (the Python source's BadSubBatch): left out, with a warning. */
    static final class BadSubBatch extends Exception {
        private static final long serialVersionUID = 1L;

        BadSubBatch(String text) {
            super(text);
        }
    }

    static final String[] CODECS = {"uncompressed", "gzip", "snappy", "lz4", "zstd", "unknown-codec"};

    /** {@code n} records (each a u32 length and its bytes) that fill data[from, to) exactly. */
    private static void fills(byte[] data, int from, int to, int n) throws BadSubBatch {
        int q = from;
        for (int i = 0; i < n; i++) {
            if (q + 4 > to) {
                throw new BadSubBatch("sub-batch holds fewer than its " + n + " records");
            }
            long len = ByteBuffer.wrap(data).getInt(q) & 0xffffffffL;
            q += 4;
            if (q + len > to) {
                throw new BadSubBatch("a sub-batch record runs past its data");
            }
            q += (int) len;
        }
        if (q != to) {
            throw new BadSubBatch((to - q) + " bytes follow the sub-batch's " + n + " records");
        }
    }

    /** A compressed sub-batch's body decoded: exactly {@code usize} bytes, the decoder never asked for more
     * than usize + 1 (a bomb costs that buffer and no more). gzip with the JDK; snappy (xerial's framing
     * format) and zstd (frames) with the libraries Spark itself ships (snappy-java, zstd-jni); lz4 (the LZ4
     * frame format, linked or independent blocks) by {@link Lz4}. */
    static byte[] decode(int codec, byte[] c, int pos, int len, int usize) throws BadSubBatch {
        String name = CODECS[Math.min(codec, 5)];
        byte[] out = new byte[usize];
        if (codec == 3) {
            try {
                Lz4.decode(c, pos, len, out);
            } catch (LinkageError e) {
                throw new IllegalStateException("hutch-jvm source: an lz4 sub-batch needs lz4-java (its xxHash), which "
                        + "this JVM cannot load (" + e + "); format(\"hutch\") (the Python source) reads it");
            }
            return out;
        }
        try (InputStream z = open(codec, new ByteArrayInputStream(c, pos, len))) {
            int got = 0;
            while (got < usize) {
                int r = z.read(out, got, usize - got);
                if (r < 0) {
                    break;
                }
                got += r;
            }
            if (got != usize) {
                throw new BadSubBatch(name + " sub-batch decodes to " + got + " bytes, not the declared " + usize);
            }
            if (z.read() >= 0) {
                throw new BadSubBatch(name + " sub-batch decodes past its declared " + usize + " bytes");
            }
        } catch (IOException | RuntimeException e) {
            throw new BadSubBatch(name + " sub-batch does not decode to its declared " + usize + " bytes: " + e);
        } catch (LinkageError e) {
            // the codec's library (Spark's own jars) is not on this JVM's class path: fail, never skip silently
            throw new IllegalStateException("hutch-jvm source: a " + name + " sub-batch needs " + LIBRARIES[codec]
                    + ", which this JVM cannot load (" + e + "); format(\"hutch\") (the Python source) reads it");
        }
        return out;
    }

    private static final String[] LIBRARIES = {"", "", "snappy-java", "", "zstd-jni"};

    private static InputStream open(int codec, InputStream in) throws IOException, BadSubBatch {
        switch (codec) {
            case 1: return new GZIPInputStream(in);
            case 2: return new org.xerial.snappy.SnappyFramedInputStream(in);
            case 4: return new com.github.luben.zstd.ZstdInputStreamNoFinalizer(in);
            default: throw new BadSubBatch("sub-batch compressed with codec " + codec + ", which hutch does not decode");
        }
    }
}
