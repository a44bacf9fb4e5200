package hutch.spark.jvm;

import java.util.EnumSet;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsRead;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.Batch;
import org.apache.spark.sql.connector.read.InputPartition;
import org.apache.spark.sql.connector.read.PartitionReaderFactory;
import org.apache.spark.sql.connector.read.Scan;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.read.streaming.MicroBatchStream;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code spark.read.format("hutch-jvm")} and {@code spark.readStream.format("hutch-jvm")}: reads of a hutch
 * stream by offset, in the JVM (a DataSource V2 provider). The same options, offsets JSON, schema and
 * failOnDataLoss semantics as the Python source's stream reads ({@code format("hutch")},
 * {@code stream_source.py}), without a Python worker per task or Arrow between the JVM and Python.
 * Streams and super streams ({@code superStream}: a partition per partition stream).
 */
public final class HutchStreamProvider implements TableProvider, DataSourceRegister {
    static final StructType PROPERTIES = new StructType(new StructField[] {
        field("content_type", DataTypes.StringType), field("content_encoding", DataTypes.StringType),
        field("delivery_mode", DataTypes.IntegerType), field("priority", DataTypes.IntegerType),
        field("correlation_id", DataTypes.StringType), field("reply_to", DataTypes.StringType),
        field("expiration", DataTypes.StringType), field("message_id", DataTypes.StringType),
        field("timestamp", DataTypes.TimestampType), field("type", DataTypes.StringType),
        field("user_id", DataTypes.StringType), field("app_id", DataTypes.StringType),
        field("cluster_id", DataTypes.StringType),
    });
    /** The Python source's STREAM_SCHEMA (spark/schema.py): Kafka's columns plus hutch's. */
    static final StructType SCHEMA = new StructType(new StructField[] {
        field("key", DataTypes.StringType), field("value", DataTypes.BinaryType),
        field("stream", DataTypes.StringType), field("partition", DataTypes.IntegerType),
        field("offset", DataTypes.LongType), field("timestamp", DataTypes.TimestampType),
        field("exchange", DataTypes.StringType),
        field("headers", DataTypes.createMapType(DataTypes.StringType, DataTypes.StringType, true)),
        field("properties", PROPERTIES),
    });

    private static StructField field(String name, org.apache.spark.sql.types.DataType type) {
        return DataTypes.createStructField(name, type, true);
    }

    @Override
    public String shortName() {
        return "hutch-jvm";
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        return SCHEMA;
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        return new StreamTable(properties.getOrDefault("stream", ""));
    }

    static class StreamTable implements Table, SupportsRead {
        private final String stream;

        StreamTable(String stream) {
            this.stream = stream;
        }

        @Override
        public String name() {
            return "hutch-jvm stream " + stream;
        }

        @Override
        @SuppressWarnings("deprecation")  // Spark 4's Table still asks for schema() by default
        public StructType schema() {
            return SCHEMA;
        }

        @Override
        public Set<TableCapability> capabilities() {
            return EnumSet.of(TableCapability.BATCH_READ, TableCapability.MICRO_BATCH_READ);
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            return () -> new StreamScan(options);
        }
    }

    static final class StreamScan implements Scan {
        private final CaseInsensitiveStringMap options;

        StreamScan(CaseInsensitiveStringMap options) {
            this.options = options;
        }

        @Override
        public StructType readSchema() {
            return SCHEMA;
        }

        @Override
        public String description() {
            return "hutch-jvm stream " + options.getOrDefault("stream", "");
        }

        @Override
        public Batch toBatch() {
            return new RangeBatch(ReadOptions.parse(options, false));
        }

        @Override
        public MicroBatchStream toMicroBatchStream(String checkpointLocation) {
            return new OffsetStream(ReadOptions.parse(options, true));
        }
    }

    /** spark.read: the messages from startingOffsets (or startingTimestamp) to endingOffsets (or
     * endingTimestamp), in minPartitions parallel tasks. */
    static final class RangeBatch implements Batch {
        private final ReadOptions opts;

        RangeBatch(ReadOptions opts) {
            this.opts = opts;
        }

        @Override
        public InputPartition[] planInputPartitions() {
            try (Planner p = new Planner(opts)) {
                java.util.List<String> streams = p.streams();
                long[] starts = new long[streams.size()], ends = new long[streams.size()];
                for (int i = 0; i < starts.length; i++) {
                    String s = streams.get(i);
                    long latest = Math.max(0, p.end(s));
                    // never past the last message (a range's reader waits for a message at or past end - 1)
                    ReadOptions.Position ending = opts.endingOf(i);
                    ends[i] = ending.kind.equals(ReadOptions.LATEST) ? latest
                            : Math.min(p.resolve(s, ending, latest), latest);
                    starts[i] = p.resolve(s, opts.startingOf(i), ends[i]);
                }
                RangePartition[] parts = p.plan(streams, starts, ends);
                return parts.length > 0 ? parts
                        : new InputPartition[] {new RangePartition(0, streams.get(0), 0, 0, 0)};
            }
        }

        @Override
        public PartitionReaderFactory createReaderFactory() {
            return new RangePartition.Factory(opts);
        }
    }
}
