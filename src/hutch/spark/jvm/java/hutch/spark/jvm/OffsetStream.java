package hutch.spark.jvm;

import java.util.List;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * {@code spark.readStream.format("hutch-jvm")} with {@code stream} or {@code superStream}: exactly-once
 * micro-batches of offset ranges (one per partition: a stream has one), read in parallel by the executors;
 * the Java counterpart of {@code HutchStreamOffsetReader} (stream_source.py) and
 * {@code HutchSuperStreamOffsetReader} (super_source.py), with the same offsets in the checkpoint
 * ({@link Json}). Runs on the driver: it only probes the partitions and plans ranges. A super stream's
 * partitions are asked once, when the query starts.
 */
final class OffsetStream implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow {
    private final ReadOptions opts;
    private final Planner planner;
    private final List<String> streams;
    private long[] availableNowEnds;  // null: not an AvailableNow query
    private long[] lastEnds;  // the last probed ends, for Spark's query status
    private long lastBatchMs = System.currentTimeMillis();  // when the last batch was planned (maxTriggerDelay)

    OffsetStream(ReadOptions opts) {
        this.opts = opts;
        this.planner = new Planner(opts);
        this.streams = planner.streams();
    }

    /** The offsets of the partitions: the next offset of each to read (the exclusive ends of the batch before). */
    static final class StreamOffset extends Offset {
        final String json;
        final long[] offsets;

        StreamOffset(ReadOptions opts, long[] offsets) {
            this.offsets = offsets;
            this.json = opts.superStream == null ? Json.offset(opts.stream, offsets[0])
                    : Json.superOffset(opts.superStream, offsets);
        }

        @Override
        public String json() {
            return json;
        }
    }

    private long[] offsets(Offset o) {
        if (o instanceof StreamOffset) {
            return ((StreamOffset) o).offsets;
        }
        return parse(o.json());
    }

    private long[] parse(String json) {
        return opts.superStream == null ? new long[] {Json.parseOffset(json, opts.stream)}
                : Json.parseSuperOffset(json, opts.superStream, streams.size());
    }

    private StreamOffset at(long[] n) {
        return new StreamOffset(opts, n);
    }

    private long[] ends() {
        long[] out = new long[streams.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = Math.max(0, planner.end(streams.get(i)));
        }
        return out;
    }

    @Override
    public Offset initialOffset() {
        long[] out = new long[streams.size()];
        for (int i = 0; i < out.length; i++) {
            out[i] = planner.resolve(streams.get(i), opts.startingOf(i), 0);
        }
        return at(out);
    }

    @Override
    public Offset deserializeOffset(String json) {
        return at(parse(json));
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return opts.maxOffsetsPerTrigger > 0 ? ReadLimit.maxRows(opts.maxOffsetsPerTrigger) : ReadLimit.allAvailable();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        availableNowEnds = ends();
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("latestOffset(Offset, ReadLimit) is the one to call");
    }

    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
        long[] s = offsets(startOffset);
        long[] end = availableNowEnds;
        if (end == null) {
            end = lastEnds = ends();
        }
        end = end.clone();
        long available = 0;
        for (int i = 0; i < end.length; i++) {
            end[i] = Math.max(s[i], end[i]);
        }
        if (limit instanceof ReadMaxRows) {
            end = Planner.capEnds(s, end, ((ReadMaxRows) limit).maxRows());
        }
        for (int i = 0; i < end.length; i++) {
            available += end[i] - s[i];
        }
        long now = System.currentTimeMillis();
        if (availableNowEnds == null && opts.minOffsetsPerTrigger > 0
                && !Planner.admit(available, opts.minOffsetsPerTrigger, opts.maxTriggerDelayMs, now - lastBatchMs)) {
            return at(s);  // wait for more (or for maxTriggerDelay)
        }
        if (available > 0) {
            lastBatchMs = now;
        }
        return at(end);
    }

    @Override
    public Offset reportLatestOffset() {
        return lastEnds == null ? null : at(lastEnds);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        return planner.plan(streams, offsets(start), offsets(end));
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new RangePartition.Factory(opts);
    }

    @Override
    public void commit(Offset end) {
        offsets(end);  // nothing to tell the broker: the offsets are in Spark's checkpoint
    }

    @Override
    public void stop() {
        planner.close();
    }
}
