package hutch.spark.jvm;

import java.util.EnumSet;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

import org.apache.spark.sql.connector.catalog.SupportsWrite;
import org.apache.spark.sql.connector.catalog.Table;
import org.apache.spark.sql.connector.catalog.TableCapability;
import org.apache.spark.sql.connector.catalog.TableProvider;
import org.apache.spark.sql.connector.expressions.Transform;
import org.apache.spark.sql.connector.read.ScanBuilder;
import org.apache.spark.sql.connector.write.LogicalWriteInfo;
import org.apache.spark.sql.connector.write.WriteBuilder;
import org.apache.spark.sql.execution.datasources.v2.python.PythonDataSourceV2;
import org.apache.spark.sql.sources.DataSourceRegister;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.sql.util.CaseInsensitiveStringMap;

/**
 * {@code format("hutch")} when the session has this jar ({@code hutch.spark.register(spark)} sets it up):
 * reads of a stream or a super stream ({@code stream} / {@code superStream}) by the JVM reader
 * ({@link HutchStreamProvider}'s scan), everything else (reads of a queue, every write, a stream's sink
 * included) by the Python data source, registered under {@link #PYTHON} and reached through Spark's own
 * {@code PythonDataSourceV2}.
 *
 * <p>Why one name and not two: a user types {@code format("hutch")}; Spark refuses a JVM
 * {@code DataSourceRegister} and a registered Python data source of the same short name ("found multiple
 * data sources", {@code DataSource.lookupDataSource}), so the JVM provider takes the name and hands the
 * Python source what only it does, and the Python source answers to {@code hutch-python} (also usable
 * directly). Without this jar on the class path {@code register} gives the name to the Python source.
 */
public final class HutchProvider implements TableProvider, DataSourceRegister {
    static final String PYTHON = "hutch-python";

    @Override
    public String shortName() {
        return "hutch";
    }

    static boolean readsStream(Map<String, String> options) {
        for (String k : options.keySet()) {
            String lower = k.toLowerCase(Locale.ROOT);
            if (lower.equals("stream") || lower.equals("superstream")) {
                return true;
            }
        }
        return false;
    }

    private static PythonDataSourceV2 python() {
        PythonDataSourceV2 p = new PythonDataSourceV2();
        p.setShortName(PYTHON);
        return p;
    }

    @Override
    public boolean supportsExternalMetadata() {
        return true;  // a write passes its DataFrame's schema; a read's given schema is checked at the scan
    }

    @Override
    public StructType inferSchema(CaseInsensitiveStringMap options) {
        if (readsStream(options)) {
            // Spark infers the schema of reads only (load()): the options are checked here, as the Python
            // source checks them in schema(); a read with an ending is a batch read
            boolean streaming = !options.containsKey("endingOffsets") && !options.containsKey("endingTimestamp");
            ReadOptions.parse(options, streaming);
            return HutchStreamProvider.SCHEMA;
        }
        return python().inferSchema(options);
    }

    @Override
    public Transform[] inferPartitioning(CaseInsensitiveStringMap options) {
        return new Transform[0];
    }

    @Override
    public Table getTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
        if (!readsStream(properties)) {
            return python().getTable(schema, partitioning, properties);
        }
        return new StreamTable(schema, partitioning, properties);
    }

    /** A stream: read by the JVM reader, written by the Python source's stream sink. */
    static final class StreamTable extends HutchStreamProvider.StreamTable implements SupportsWrite {
        private final StructType schema;
        private final Transform[] partitioning;
        private final Map<String, String> properties;

        StreamTable(StructType schema, Transform[] partitioning, Map<String, String> properties) {
            super(properties.getOrDefault("stream", properties.getOrDefault("superStream", "")));
            this.schema = schema;
            this.partitioning = partitioning;
            this.properties = properties;
        }

        @Override
        @SuppressWarnings("deprecation")  // Spark 4's Table still asks for schema() by default
        public StructType schema() {
            return schema;  // a read's (checked at the scan) or a write's DataFrame's
        }

        @Override
        public Set<TableCapability> capabilities() {
            // the reads' and the Python table's (its writes)
            Set<TableCapability> out = EnumSet.copyOf(super.capabilities());
            out.addAll(python().getTable(schema, partitioning, properties).capabilities());
            return out;
        }

        @Override
        public ScanBuilder newScanBuilder(CaseInsensitiveStringMap options) {
            if (!HutchStreamProvider.SCHEMA.equals(schema)) {
                throw ReadOptions.error("the schema of a hutch read is fixed; remove .schema(...) (expected "
                        + HutchStreamProvider.SCHEMA.simpleString() + ", got " + schema.simpleString() + ")");
            }
            return () -> new HutchStreamProvider.StreamScan(options);
        }

        @Override
        public WriteBuilder newWriteBuilder(LogicalWriteInfo info) {
            return ((SupportsWrite) python().getTable(schema, partitioning, properties)).newWriteBuilder(info);
        }
    }
}
