package hutch.spark.jvm;

import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.connector.read.streaming.Offset;
import org.apache.spark.sql.connector.read.streaming.ReadLimit;
import org.apache.spark.sql.connector.read.streaming.ReadMaxRows;
import org.apache.spark.sql.connector.read.streaming.SupportsAdmissionControl;
import org.apache.spark.sql.connector.read.streaming.SupportsTriggerAvailableNow;

/**
 * {@code spark.readStream.format("hutch-jvm").option("stream", ...)}: exactly-once micro-batches of offset
 * ranges, read in parallel by the executors; the Java counterpart of {@code HutchStreamOffsetReader}
 * (stream_source.py), with the same offsets in the checkpoint ({@link Json}). Runs on the driver: it only
 * probes the stream and plans ranges.
 */
final class OffsetStream implements MicroBatchStream, SupportsAdmissionControl, SupportsTriggerAvailableNow {
    private final ReadOptions opts;
    private final Planner planner;
    private long availableNowEnd = -1;  // -1: not an AvailableNow query
    private long lastEnd = -1;  // the last probed end, for Spark's query status
    private long lastBatchMs = System.currentTimeMillis();  // when the last batch was planned (maxTriggerDelay)

    OffsetStream(ReadOptions opts) {
        this.opts = opts;
        this.planner = new Planner(opts);
    }

    /** An offset of the stream: the next offset to read (the exclusive end of the batch before). */
    static final class StreamOffset extends Offset {
        final String stream;
        final long offset;

        StreamOffset(String stream, long offset) {
            this.stream = stream;
            this.offset = offset;
        }

        @Override
        public String json() {
            return Json.offset(stream, offset);
        }
    }

    private long offset(Offset o) {
        if (o instanceof StreamOffset && ((StreamOffset) o).stream.equals(opts.stream)) {
            return ((StreamOffset) o).offset;
        }
        return Json.parseOffset(o.json(), opts.stream);
    }

    private StreamOffset at(long n) {
        return new StreamOffset(opts.stream, n);
    }

    @Override
    public Offset initialOffset() {
        return at(planner.resolve(opts.starting, 0));
    }

    @Override
    public Offset deserializeOffset(String json) {
        return at(Json.parseOffset(json, opts.stream));
    }

    @Override
    public ReadLimit getDefaultReadLimit() {
        return opts.maxOffsetsPerTrigger > 0 ? ReadLimit.maxRows(opts.maxOffsetsPerTrigger) : ReadLimit.allAvailable();
    }

    @Override
    public void prepareForTriggerAvailableNow() {
        availableNowEnd = Math.max(0, planner.end());
    }

    @Override
    public Offset latestOffset() {
        throw new UnsupportedOperationException("latestOffset(Offset, ReadLimit) is the one to call");
    }

    @Override
    public Offset latestOffset(Offset startOffset, ReadLimit limit) {
        long s = offset(startOffset);
        long end = availableNowEnd;
        if (end < 0) {
            end = lastEnd = Math.max(0, planner.end());
        }
        if (limit instanceof ReadMaxRows) {
            end = Math.min(end, s + ((ReadMaxRows) limit).maxRows());
        }
        long now = System.currentTimeMillis();
        if (availableNowEnd < 0 && opts.minOffsetsPerTrigger > 0
                && !Planner.admit(end - s, opts.minOffsetsPerTrigger, opts.maxTriggerDelayMs, now - lastBatchMs)) {
            return at(s);  // wait for more (or for maxTriggerDelay)
        }
        if (end > s) {
            lastBatchMs = now;
        }
        return at(Math.max(s, end));
    }

    @Override
    public Offset reportLatestOffset() {
        return lastEnd < 0 ? null : at(lastEnd);
    }

    @Override
    public InputPartition[] planInputPartitions(Offset start, Offset end) {
        return planner.plan(offset(start), offset(end));
    }

    @Override
    public PartitionReaderFactory createReaderFactory() {
        return new RangePartition.Factory(opts);
    }

    @Override
    public void commit(Offset end) {
        offset(end);  // nothing to tell the broker: the offset is in Spark's checkpoint
    }

    @Override
    public void stop() {
        planner.close();
    }
}
