package hutch.spark.jvm;

import net.jpountz.xxhash.XXHash32;
import net.jpountz.xxhash.XXHashFactory;

/**
 * The LZ4 frame format (lz4's {@code lz4_Frame_format.md}) decoded into one buffer of a known size: what
 * an lz4 sub-batch holds. lz4-java's {@code LZ4FrameInputStream} reads independent blocks only, and a
 * frame with linked blocks (lz4's own default, cramjam's and the lz4 command's) is as valid, so the blocks
 * are decoded here, each into the same output after the one before (a match may reach back into earlier
 * blocks). Header, block and content checksums are verified (xxHash32, lz4-java's).
 *
 * <p>Bounded: nothing is written past {@code out.length}; a frame that would decode to more, or to less,
 * or that is damaged anywhere, is a {@link Chunks.BadSubBatch}.
 */
final class Lz4 {
    private static final int MAGIC = 0x184D2204;
    private static final XXHash32 XXH = XXHashFactory.fastestJavaInstance().hash32();

    private Lz4() {
    }

    private static int le32(byte[] b, int at) {
        return (b[at] & 0xff) | (b[at + 1] & 0xff) << 8 | (b[at + 2] & 0xff) << 16 | (b[at + 3] & 0xff) << 24;
    }

    private static Chunks.BadSubBatch bad(String why) {
        return new Chunks.BadSubBatch("lz4 sub-batch: " + why);
    }

    /** Decode the frame(s) in src[pos, pos + len) into exactly {@code out.length} bytes. */
    static void decode(byte[] src, int pos, int len, byte[] out) throws Chunks.BadSubBatch {
        int p = pos, stop = pos + len, o = 0;
        while (p < stop) {
            if (p + 7 > stop || le32(src, p) != MAGIC) {
                throw bad("not an LZ4 frame");
            }
            int flg = src[p + 4] & 0xff;
            int hdr = p + 4;
            if ((flg >> 6) != 1) {
                throw bad("LZ4 frame version " + (flg >> 6));
            }
            boolean blockSum = (flg & 0x10) != 0, contentSize = (flg & 0x08) != 0, contentSum = (flg & 0x04) != 0;
            boolean dictId = (flg & 0x01) != 0;
            p += 6 + (contentSize ? 8 : 0) + (dictId ? 4 : 0);
            if (p + 1 > stop) {
                throw bad("a cut frame header");
            }
            if (dictId) {
                throw bad("a frame that needs a dictionary");
            }
            if (((XXH.hash(src, hdr, p - hdr, 0) >> 8) & 0xff) != (src[p] & 0xff)) {
                throw bad("a frame header checksum that does not match");
            }
            p++;
            int frameStart = o;
            while (true) {
                if (p + 4 > stop) {
                    throw bad("a cut frame");
                }
                int size = le32(src, p);
                p += 4;
                if (size == 0) {
                    break;
                }
                boolean raw = size < 0;
                size &= 0x7fffffff;
                if (p + size + (blockSum ? 4 : 0) > stop) {
                    throw bad("a block runs past the frame");
                }
                if (blockSum && XXH.hash(src, p, size, 0) != le32(src, p + size)) {
                    throw bad("a block checksum that does not match");
                }
                if (raw) {
                    if (o + size > out.length) {
                        throw bad("decodes past its declared " + out.length + " bytes");
                    }
                    System.arraycopy(src, p, out, o, size);
                    o += size;
                } else {
                    o = block(src, p, p + size, out, o);
                }
                p += size + (blockSum ? 4 : 0);
            }
            if (contentSum) {
                if (p + 4 > stop) {
                    throw bad("a cut content checksum");
                }
                if (XXH.hash(out, frameStart, o - frameStart, 0) != le32(src, p)) {
                    throw bad("a content checksum that does not match");
                }
                p += 4;
            }
        }
        if (o != out.length) {
            throw bad("decodes to " + o + " bytes, not the declared " + out.length);
        }
    }

    /** A length of 15 (+4) extended by the bytes at src[p...] (each added; 255 means another follows), no
     * further than {@code limit} + 255 (past it the block cannot fit anyway): (length << 32) | the new p. */
    private static long extended(byte[] src, int p, int stop, int length, int limit) throws Chunks.BadSubBatch {
        int b;
        do {
            if (p >= stop) {
                throw bad("a damaged block");
            }
            b = src[p++] & 0xff;
            length += b;
        } while (b == 255 && length < limit + 255);
        return ((long) length << 32) | p;
    }

    /** One LZ4 block (sequences of literals and matches) from src[p, stop) written at out[o...]; the new o. */
    private static int block(byte[] src, int p, int stop, byte[] out, int o) throws Chunks.BadSubBatch {
        while (p < stop) {
            int token = src[p++] & 0xff;
            int lit = token >>> 4;
            if (lit == 15) {
                long ext = extended(src, p, stop, lit, out.length);
                lit = (int) (ext >>> 32);
                p = (int) ext;
            }
            if (p + lit > stop || o + lit > out.length) {
                throw bad(o + lit > out.length ? "decodes past its declared " + out.length + " bytes" : "a damaged block");
            }
            System.arraycopy(src, p, out, o, lit);
            p += lit;
            o += lit;
            if (p >= stop) {
                break;  // the last sequence has literals only
            }
            if (p + 2 > stop) {
                throw bad("a damaged block");
            }
            int offset = (src[p] & 0xff) | (src[p + 1] & 0xff) << 8;
            p += 2;
            if (offset == 0 || offset > o) {
                throw bad("a match before the start of the data");
            }
            int match = (token & 0x0f) + 4;
            if ((token & 0x0f) == 15) {
                long ext = extended(src, p, stop, match, out.length);
                match = (int) (ext >>> 32);
                p = (int) ext;
            }
            if (o + match > out.length) {
                throw bad("decodes past its declared " + out.length + " bytes");
            }
            int from = o - offset;
            if (offset >= match) {
                System.arraycopy(out, from, out, o, match);
            } else {
                for (int i = 0; i < match; i++) {  // an overlapping match repeats what it writes
                    out[o + i] = out[from + i];
                }
            }
            o += match;
        }
        return o;
    }
}
