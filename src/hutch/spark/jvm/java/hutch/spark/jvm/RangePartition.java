package hutch.spark.jvm;

import java.util.ArrayList;

import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReader;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;

/**
 * One read task of a JVM read: the messages with offsets in [start, end) ({@link RangePartition}), read by
 * an executor ({@link Reader}) as the Python source's {@code read_range} does: a subscription at offset
 * start with a few chunks of credit, a chunk of credit granted per chunk taken until the chunk that holds
 * end - 1, then unsubscribe; each chunk's records decoded into rows ({@link Records}). Nothing is
 * acknowledged or stored on the broker: the offsets live in Spark's checkpoint alone.
 *
 * <p>Connections are kept per executor JVM between tasks ({@link Pool}); a task reads on a node that holds
 * its stream ({@link Pool#onMember}).
 */
final class RangePartition implements InputPartition {
    private static final long serialVersionUID = 1L;
    static final int CHUNK_RECORDS = 4096;
    final int index;
    final String stream;
    final int partition;  // the partition's index in its super stream (0 for a stream)
    final long start, end;

    RangePartition(int index, String stream, int partition, long start, long end) {
        this.index = index;
        this.stream = stream;
        this.partition = partition;
        this.start = start;
        this.end = end;
    }

    static int creditChunks(int prefetch) {
        return Math.max(2, Math.min(StreamConnection.MAX_CREDIT, (prefetch + CHUNK_RECORDS - 1) / CHUNK_RECORDS));
    }

    static final class Factory implements PartitionReaderFactory {
        private static final long serialVersionUID = 1L;
        private final ReadOptions opts;

        Factory(ReadOptions opts) {
            this.opts = opts;
        }

        @Override
        public PartitionReader<InternalRow> createReader(InputPartition partition) {
            return new Reader(opts, (RangePartition) partition);
        }
    }

    static final class Reader implements PartitionReader<InternalRow> {
        private final ReadOptions opts;
        private final RangePartition part;
        private final Records records;
        private StreamConnection conn;
        private final ArrayList<InternalRow> rows = new ArrayList<>();
        private int at = 0;
        private boolean first = true, done;
        private long seen;

        Reader(ReadOptions opts, RangePartition part) {
            this.opts = opts;
            this.part = part;
            this.records = new Records(part.stream, part.partition, opts.includeHeaders);
            this.done = part.start >= part.end;
            this.seen = part.start - 1;
        }

        private void open() {
            int credit = creditChunks(opts.prefetch);
            for (int attempt = 0; ; attempt++) {
                try {
                    conn = Pool.take(opts, opts.addresses(), "read");
                    conn = Pool.onMember(opts, conn, part.stream, "read");
                    conn.subscribe(part.stream, StreamConnection.OFFSET_OFFSET, part.start, credit);
                    return;
                } catch (StreamConnection.StreamError e) {
                    if (conn != null) {
                        conn.close();
                        conn = null;
                    }
                    if (e.code == StreamConnection.CODE_STREAM_DOES_NOT_EXIST) {
                        throw Planner.missing(opts, part.stream);
                    }
                    if (e.code != 0 || attempt > 0) {
                        throw failed(e);
                    }
                    Pool.forgetIdle(opts);  // a kept connection died while idle (a broker restart?): so did the others

                }
            }
        }

        private IllegalStateException failed(Exception e) {
            return new IllegalStateException("hutch-jvm source (stream '" + part.stream + "'): reading offsets ["
                    + part.start + ", " + part.end + ") (read up to " + seen + "): " + e.getMessage());
        }

        @Override
        public boolean next() {
            at++;
            while (at >= rows.size()) {
                if (done) {
                    return false;
                }
                rows.clear();
                at = 0;
                fill();
            }
            return true;
        }

        /** Take the next chunk of the range and decode its rows. */
        private void fill() {
            if (conn == null) {
                open();
            }
            try {
                byte[] chunk = conn.nextChunk(opts.readTimeoutMs, false);
                if (Chunks.chunkType(chunk) != Chunks.USER) {
                    conn.credit(1);
                    return;
                }
                long id = Chunks.chunkId(chunk), next = Chunks.nextOffset(chunk);
                long from = part.start;
                if (first && id > part.start) {
                    // retention removed offsets since the driver planned the range (or they hold no message)
                    try (Planner p = new Planner(opts)) {
                        from = Planner.checkDataLoss(opts, part.stream, p.first(part.stream), part.start, part.end);
                    }
                }
                first = false;
                if (next < part.end) {
                    conn.credit(1);
                } else {
                    done = true;
                }
                seen = next - 1;
                Chunks.records(chunk, from, part.end, (offset, d, pos, len) -> rows.add(records.row(offset, d, pos, len)));
                if (done) {
                    conn.unsubscribeLater();
                    Pool.giveBack(opts, conn);
                    conn = null;
                }
            } catch (StreamConnection.StreamError e) {
                conn.close();
                conn = null;
                if (e.code == StreamConnection.CODE_STREAM_DOES_NOT_EXIST) {
                    throw Planner.missing(opts, part.stream);
                }
                throw failed(e);
            } catch (IllegalArgumentException e) {
                conn.close();
                conn = null;
                throw new IllegalStateException("hutch-jvm source (stream '" + part.stream + "'): reading offsets ["
                        + part.start + ", " + part.end + "): bad chunk: " + e.getMessage());
            }
        }

        @Override
        public InternalRow get() {
            return rows.get(at);
        }

        @Override
        public void close() {
            if (conn != null) {  // stopped before the end of its range: the subscription is dropped with it
                conn.close();
                conn = null;
            }
        }
    }
}
