package hutch.spark.jvm;

import java.util.ArrayList;
import java.util.List;
import java.util.logging.Logger;

/**
 * The driver's side of a JVM read (the counterpart of {@code stream_source.py}'s {@code Probe},
 * {@code check_data_loss}, {@code split_range} and {@code admit}, and {@code super_source.py}'s
 * {@code partition_streams}, {@code cap_ends} and {@code plan_partitions}): probes of a stream over a kept
 * connection of the JVM's pool (one-credit subscriptions that take one chunk) on a node that holds it,
 * data-loss checks, and the split of offset ranges into read tasks. No row passes through the driver.
 */
final class Planner implements AutoCloseable {
    static final long CHUNK_WAIT_MS = 5000;
    private static final Logger LOG = Logger.getLogger("hutch.spark.jvm");
    private final ReadOptions opts;

    Planner(ReadOptions opts) {
        this.opts = opts;
    }

    interface Ask<T> {
        T ask(StreamConnection c);
    }

    /** Run a probe of {@code stream} on a pooled connection to a member of it (a new connection if a kept one
     * is broken: one retry). */
    <T> T probe(String stream, Ask<T> ask) {
        for (int attempt = 0; ; attempt++) {
            StreamConnection conn = null;
            try {
                conn = Pool.onMember(opts, Pool.take(opts, opts.addresses(), "probe"), stream, "probe");
                T out = ask.ask(conn);
                Pool.giveBack(opts, conn);
                return out;
            } catch (StreamConnection.StreamError e) {
                if (conn != null) {
                    conn.close();
                }
                if (e.code == StreamConnection.CODE_STREAM_DOES_NOT_EXIST) {
                    throw missing(opts, stream);
                }
                if (e.code != 0 || attempt > 0) {
                    throw new IllegalStateException("hutch-jvm source (stream '" + stream + "'): " + e.getMessage());
                }
                Pool.forgetIdle(opts);  // a kept connection died while idle (a broker restart?): so did the others
            }
        }
    }

    static IllegalStateException missing(ReadOptions opts, String stream) {
        if (opts.superStream != null && stream.equals(opts.superStream)) {
            return new IllegalStateException("hutch-jvm source: super stream '" + stream + "' does not exist in vhost '"
                    + opts.vhost + "'");
        }
        return new IllegalStateException("hutch-jvm source: stream '" + stream + "' does not exist in vhost '"
                + opts.vhost + "' on " + opts.host + ":" + opts.streamPort + " (or it is not a stream: the 'stream' "
                + "option reads streams by offset)");
    }

    /** The streams read, in partition order: the stream, or the super stream's partitions. */
    List<String> streams() {
        if (opts.superStream == null) {
            return List.of(opts.stream);
        }
        List<String> found = probe(opts.superStream, c -> c.partitions(opts.superStream));
        if (found.isEmpty()) {
            throw new IllegalStateException("hutch-jvm source: super stream '" + opts.superStream + "' has no partitions");
        }
        return found;
    }

    long first(String stream) {
        return probe(stream, c -> c.firstOffset(stream, CHUNK_WAIT_MS));
    }

    long end(String stream) {
        return probe(stream, c -> c.committedEnd(stream, CHUNK_WAIT_MS));
    }

    long atTimestamp(String stream, long ms) {
        return probe(stream, c -> {
            long last = c.lastChunkTimestamp(stream, opts.pollTimeoutMs);
            if (last == Long.MIN_VALUE || last < ms) {
                return -1L;
            }
            return c.offsetAt(stream, ms, CHUNK_WAIT_MS);
        });
    }

    /** An offset of {@code stream} for {@code pos}; {@code empty} when the position names no message yet. */
    long resolve(String stream, ReadOptions.Position pos, long empty) {
        switch (pos.kind) {
            case ReadOptions.OFFSET:
                return pos.value;
            case ReadOptions.EARLIEST: {
                long f = first(stream);
                return f < 0 ? empty : f;
            }
            case ReadOptions.LATEST: {
                long e = end(stream);
                return e < 0 ? empty : e;
            }
            default: {
                long found = atTimestamp(stream, pos.value);
                if (found >= 0) {
                    return found;
                }
                long e = end(stream);
                return e < 0 ? empty : e;
            }
        }
    }

    /** The start to read [start, end) of {@code stream} from: start, or its first message when retention
     * removed offsets from start on (failOnDataLoss=true: an error instead). */
    static long checkDataLoss(ReadOptions opts, String stream, long first, long start, long end) {
        if (start >= end || first < 0 || first <= start) {
            return start;
        }
        String text = "hutch-jvm source (stream '" + stream + "'): offsets " + start + " to "
                + (Math.min(first, end) - 1) + " are no longer in the stream (retention removed them; its first "
                + "message is at offset " + first + ")";
        if (opts.failOnDataLoss) {
            throw new IllegalStateException(text + "; set failOnDataLoss=false to skip them with a warning");
        }
        LOG.warning(text + "; skipped (failOnDataLoss=false)");
        return Math.min(first, end);
    }

    /** [start, end) as at most {@code parts} contiguous, non-empty, near-equal ranges, in order. */
    static List<long[]> split(long start, long end, long parts) {
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

    /** Ends that admit at most {@code maxRows} offsets in all, spread over the partitions in proportion to
     * what each has available (Kafka's rule, super_source.cap_ends). */
    static long[] capEnds(long[] starts, long[] ends, long maxRows) {
        long[] avail = new long[starts.length];
        long total = 0;
        for (int i = 0; i < starts.length; i++) {
            avail[i] = Math.max(0, ends[i] - starts[i]);
            total += avail[i];
        }
        if (total <= maxRows) {
            return ends.clone();
        }
        long[] take = new long[starts.length];
        long left = maxRows;
        for (int i = 0; i < starts.length; i++) {
            take[i] = java.math.BigInteger.valueOf(avail[i]).multiply(java.math.BigInteger.valueOf(maxRows))
                    .divide(java.math.BigInteger.valueOf(total)).longValue();
            left -= take[i];
        }
        for (int i = 0; i < starts.length && left > 0; i++) {
            long extra = Math.min(left, avail[i] - take[i]);
            take[i] += extra;
            left -= extra;
        }
        long[] out = new long[starts.length];
        for (int i = 0; i < starts.length; i++) {
            out[i] = starts[i] + take[i];
        }
        return out;
    }

    /** The read tasks of [starts[i], ends[i]) of each of {@code streams}, after the data-loss check of each:
     * one per non-empty range, and when minPartitions asks for more, the large ranges split in proportion to
     * their width (super_source.plan_partitions; for one stream, minPartitions near-equal ranges). */
    RangePartition[] plan(List<String> streams, long[] starts, long[] ends) {
        long[] from = new long[starts.length];
        int live = 0;
        long total = 0;
        for (int i = 0; i < starts.length; i++) {
            from[i] = checked(streams.get(i), starts[i], ends[i]);
            if (ends[i] > from[i]) {
                live++;
                total += ends[i] - from[i];
            }
        }
        List<RangePartition> out = new ArrayList<>();
        for (int i = 0; i < starts.length; i++) {
            if (ends[i] <= from[i]) {
                continue;
            }
            long parts = 1;
            if (opts.minPartitions > live) {
                parts = Math.max(1, java.math.BigInteger.valueOf(ends[i] - from[i])
                        .multiply(java.math.BigInteger.valueOf(opts.minPartitions))
                        .add(java.math.BigInteger.valueOf(total - 1)).divide(java.math.BigInteger.valueOf(total))
                        .longValue());
            }
            for (long[] r : split(from[i], ends[i], parts)) {
                out.add(new RangePartition(out.size(), streams.get(i), i, r[0], r[1]));
            }
        }
        return out.toArray(new RangePartition[0]);
    }

    private long checked(String stream, long start, long end) {
        if (start >= end) {
            return start;
        }
        // the stream's first offset from its stats (one round trip): nothing below start was removed when it is
        // at or below start; else the first message's offset decides, as in the Python source
        Long firstChunk = probe(stream, c -> c.stats(stream).get("first_chunk_id"));
        if (firstChunk == null || firstChunk < 0 || firstChunk > start) {
            return checkDataLoss(opts, stream, first(stream), start, end);
        }
        return start;
    }

    /** minOffsetsPerTrigger / maxTriggerDelay (Kafka's): plan {@code available} offsets now, or wait? */
    static boolean admit(long available, long minOffsets, long maxDelayMs, long waitedMs) {
        return available > 0 && (available >= minOffsets || waitedMs >= maxDelayMs);
    }

    @Override
    public void close() {
        // the connections are the pool's (kept for the next probe or read task of this JVM)
    }
}
