package hutch.spark.jvm;

import java.util.ArrayList;
import java.util.List;
import java.util.logging.Logger;

/**
 * The driver's side of a JVM read (the counterpart of {@code stream_source.py}'s {@code Probe},
 * {@code check_data_loss}, {@code split_range} and {@code admit}): probes of the stream over one kept
 * connection (one-credit subscriptions that take one chunk), data-loss checks, and the split of an offset
 * range into read tasks. No row passes through the driver.
 */
final class Planner implements AutoCloseable {
    static final long CHUNK_WAIT_MS = 5000;
    private static final Logger LOG = Logger.getLogger("hutch.spark.jvm");
    private final ReadOptions opts;
    private StreamConnection conn;

    Planner(ReadOptions opts) {
        this.opts = opts;
    }

    interface Ask<T> {
        T ask(StreamConnection c);
    }

    /** Run a probe on the kept connection (a new one if it is broken: one retry). */
    <T> T probe(Ask<T> ask) {
        for (int attempt = 0; ; attempt++) {
            try {
                if (conn == null) {
                    conn = opts.connect("probe");
                }
                return ask.ask(conn);
            } catch (StreamConnection.StreamError e) {
                if (conn != null) {
                    conn.close();
                    conn = null;
                }
                if (e.code == StreamConnection.CODE_STREAM_DOES_NOT_EXIST) {
                    throw missing(opts);
                }
                if (e.code != 0 || attempt > 0) {
                    throw new IllegalStateException("hutch-jvm source (stream '" + opts.stream + "'): " + e.getMessage());
                }
            }
        }
    }

    static IllegalStateException missing(ReadOptions opts) {
        return new IllegalStateException("hutch-jvm source: stream '" + opts.stream + "' does not exist in vhost '"
                + opts.vhost + "' on " + opts.host + ":" + opts.streamPort + " (or it is not a stream: the 'stream' "
                + "option reads streams by offset)");
    }

    long first() {
        return probe(c -> c.firstOffset(opts.stream, CHUNK_WAIT_MS));
    }

    long end() {
        return probe(c -> c.committedEnd(opts.stream, CHUNK_WAIT_MS));
    }

    long atTimestamp(long ms) {
        return probe(c -> {
            long last = c.lastChunkTimestamp(opts.stream, opts.pollTimeoutMs);
            if (last == Long.MIN_VALUE || last < ms) {
                return -1L;
            }
            return c.offsetAt(opts.stream, ms, CHUNK_WAIT_MS);
        });
    }

    /** An offset for {@code pos}; {@code empty} when the position names no message yet. */
    long resolve(ReadOptions.Position pos, long empty) {
        switch (pos.kind) {
            case ReadOptions.OFFSET:
                return pos.value;
            case ReadOptions.EARLIEST: {
                long f = first();
                return f < 0 ? empty : f;
            }
            case ReadOptions.LATEST: {
                long e = end();
                return e < 0 ? empty : e;
            }
            default: {
                long found = atTimestamp(pos.value);
                if (found >= 0) {
                    return found;
                }
                long e = end();
                return e < 0 ? empty : e;
            }
        }
    }

    /** The start to read [start, end) from: start, or the stream's first message when retention removed
     * offsets from start on (failOnDataLoss=true: an error instead). */
    static long checkDataLoss(ReadOptions opts, long first, long start, long end) {
        if (start >= end || first < 0 || first <= start) {
            return start;
        }
        String text = "hutch-jvm source (stream '" + opts.stream + "'): offsets " + start + " to "
                + (Math.min(first, end) - 1) + " are no longer in the stream (retention removed them; its first "
                + "message is at offset " + first + ")";
        if (opts.failOnDataLoss) {
            throw new IllegalStateException(text + "; set failOnDataLoss=false to skip them with a warning");
        }
        LOG.warning(text + "; skipped (failOnDataLoss=false)");
        return Math.min(first, end);
    }

    /** [start, end) as at most {@code parts} contiguous, non-empty, near-equal ranges, in order. */
    static List<long[]> split(long start, long end, int parts) {
        List<long[]> out = new ArrayList<>();
        long width = end - start;
        if (width <= 0) {
            return out;
        }
        long p = Math.max(1, Math.min(parts, width));
        long base = width / p, extra = width % p;
        long s = start;
        for (long i = 0; i < p; i++) {
            long e = s + base + (i < extra ? 1 : 0);
            out.add(new long[] {s, e});
            s = e;
        }
        return out;
    }

    /** The read tasks of [start, end), after the data-loss check. */
    RangePartition[] plan(long start, long end) {
        if (start < end) {
            // the stream's first offset from its stats (one round trip): nothing below start was removed when it
            // is at or below start; else the first message's offset decides, as in the Python source
            Long firstChunk = probe(c -> c.stats(opts.stream).get("first_chunk_id"));
            if (firstChunk == null || firstChunk < 0 || firstChunk > start) {
                start = checkDataLoss(opts, first(), start, end);
            }
        }
        List<long[]> ranges = split(start, end, opts.minPartitions);
        RangePartition[] out = new RangePartition[ranges.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = new RangePartition(i, ranges.get(i)[0], ranges.get(i)[1]);
        }
        return out;
    }

    /** minOffsetsPerTrigger / maxTriggerDelay (Kafka's): plan {@code available} offsets now, or wait? */
    static boolean admit(long available, long minOffsets, long maxDelayMs, long waitedMs) {
        return available > 0 && (available >= minOffsets || waitedMs >= maxDelayMs);
    }

    @Override
    public void close() {
        if (conn != null) {
            conn.close();
            conn = null;
        }
    }
}
