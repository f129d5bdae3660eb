package castsql.spark.jvm;

import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.Set;
import org.apache.spark.rdd.RDD;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SQLContext;
import org.apache.spark.sql.SaveMode;
import org.apache.spark.sql.execution.streaming.Sink;
import org.apache.spark.sql.sources.*;
import org.apache.spark.sql.streaming.OutputMode;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.StructType;
import scala.jdk.javaapi.CollectionConverters;

/**
 * format("castsql") for Spark's DataFrame reader and writer, SQL
 * (CREATE TEMPORARY VIEW ... USING castsql) and Structured Streaming.
 *
 * Why a JVM source when a Python one exists: a Python data source hands every
 * row through Arrow to a Python worker and back. Here the Python handler only
 * plans: a read becomes castsql.spark.read's DataFrame (Spark's own Parquet
 * reader, deletes applied in generated code) and a write becomes
 * castsql.spark's Spark-Parquet-writer path plus one commit on the driver, so
 * the rows never leave the JVM.
 */
public final class CastSQLProvider implements DataSourceRegister, RelationProvider, SchemaRelationProvider,
        CreatableRelationProvider, StreamSinkProvider {

    private static volatile Handler handler;

    /** The option a micro-batch's write gets Spark's query id in. */
    static final String STREAM_QUERY_ID = "__streamQueryId";

    /** Called by castsql.spark.register(spark); the last call wins (one Python driver per JVM). */
    public static void install(Handler h) {
        handler = h;
    }

    public static boolean installed() {
        return handler != null;
    }

    static Handler handler() {
        Handler h = handler;
        if (h == null) {
            throw new IllegalStateException(
                    "format('castsql'): call castsql.spark.register(spark) in this Python driver first");
        }
        return h;
    }

    /** The handler's result, or its error thrown as it is (one line for CastSQL's own errors). */
    static Object check(Object result) {
        if (result instanceof Throwable t) {
            throw CastSQLProvider.<RuntimeException>rethrow(t);
        }
        return result;
    }

    /** Throws t as it is, checked or not (a Spark job's SparkException reaches PySpark unwrapped). */
    @SuppressWarnings("unchecked")
    private static <T extends Throwable> T rethrow(Throwable t) throws T {
        throw (T) t;
    }

    @Override
    public String shortName() {
        return "castsql";
    }

    private static Map<String, String> javaMap(scala.collection.immutable.Map<String, String> params) {
        return new java.util.HashMap<>(CollectionConverters.asJava(params));
    }

    @Override
    public BaseRelation createRelation(SQLContext ctx, scala.collection.immutable.Map<String, String> params) {
        @SuppressWarnings("unchecked")
        Map<String, String> pinned = (Map<String, String>) check(handler().open(ctx.sparkSession(), javaMap(params)));
        Map<String, String> opts = new java.util.HashMap<>(pinned);
        StructType schema = (StructType) DataType.fromJson(opts.remove("__schema"));
        ScanStrategy.install(ctx.sparkSession());
        return new Relation(ctx, opts, schema);
    }

    /**
     * A schema given with the read: a catalog table's (saveAsTable records the data's,
     * NOT NULL where Spark knew it) or the user's. The table's own schema decides; one
     * that differs in more than nullability is refused naming both.
     */
    @Override
    public BaseRelation createRelation(
            SQLContext ctx, scala.collection.immutable.Map<String, String> params, StructType given) {
        BaseRelation rel = createRelation(ctx, params);
        StructType have = rel.schema();
        if (!have.asNullable().sameType(given.asNullable())) {
            throw new IllegalArgumentException("format('castsql'): the table's schema is " + have.simpleString()
                    + ", not the given " + given.simpleString() + " (a castsql table's schema is its own: give none)");
        }
        return rel;
    }

    @Override
    public BaseRelation createRelation(
            SQLContext ctx, SaveMode mode, scala.collection.immutable.Map<String, String> params, Dataset<Row> data) {
        Map<String, String> opts = javaMap(params);
        check(handler().write(ctx.sparkSession(), data, mode.name(), opts));
        // Spark only takes the schema of what is returned (to refresh cached plans).
        return new Relation(ctx, opts, data.schema());
    }

    @Override
    public Sink createSink(
            SQLContext ctx,
            scala.collection.immutable.Map<String, String> params,
            scala.collection.immutable.Seq<String> partitionColumns,
            OutputMode mode) {
        if (!partitionColumns.isEmpty()) {
            throw new IllegalArgumentException(
                    "format('castsql'): CastSQL tables are not partitioned; drop partitionBy(" + partitionColumns.mkString(", ") + ")");
        }
        boolean complete = mode == OutputMode.Complete();
        if (!complete && mode != OutputMode.Append()) {
            throw new IllegalArgumentException(
                    "format('castsql'): output mode " + mode + " is not supported; use append or complete");
        }
        return new BatchSink(ctx, javaMap(params), complete);
    }

    /** A version of a table, fixed when the relation was made. */
    static final class Relation extends BaseRelation implements PrunedFilteredScan {
        private final SQLContext ctx;
        private final Map<String, String> options;
        private final StructType schema;

        Relation(SQLContext ctx, Map<String, String> options, StructType schema) {
            this.ctx = ctx;
            this.options = options;
            this.schema = schema;
        }

        @Override
        public SQLContext sqlContext() {
            return ctx;
        }

        @Override
        public StructType schema() {
            return schema;
        }

        /** buildScan hands Spark the rows of the inner plan as they are (InternalRow). */
        @Override
        public boolean needConversion() {
            return false;
        }

        /**
         * The live rows of the columns, in this relation's types, with the filters Spark
         * pushed put inside: Spark's Parquet reader then skips row groups by their
         * statistics (and the handler files by the manifest's). Spark applies them again
         * above (all are left unhandled), so one that cannot be translated is left out.
         */
        // Spark plans a query again after each of its stages runs (adaptive execution):
        // the same scan is the same Dataset, so its plan, and the stages already run, match.
        private final Map<List<Object>, Dataset<Row>> planned = java.util.Collections.synchronizedMap(
                new java.util.LinkedHashMap<>(8, 0.75f, true) {
                    @Override
                    protected boolean removeEldestEntry(Map.Entry<List<Object>, Dataset<Row>> eldest) {
                        return size() > 4;
                    }
                });

        Dataset<Row> dataset(String[] columns, Filter[] filters) {
            List<Object> key = List.of(List.of(columns), List.of(filters));
            Dataset<Row> ds = planned.get(key);
            if (ds == null) {
                ds = plan(columns, filters);
                planned.put(key, ds);
            }
            return ds;
        }

        @SuppressWarnings("unchecked")
        private Dataset<Row> plan(String[] columns, Filter[] filters) {
            Set<String> need = new LinkedHashSet<>(List.of(columns));
            List<Filter> usable = new ArrayList<>();
            for (Filter f : filters) {
                if (Filters.translatable(f, schema)) {
                    usable.add(f);
                    need.addAll(List.of(f.references()));
                }
            }
            if (need.isEmpty() && schema.fields().length > 0) {
                need.add(schema.fields()[0].name()); // count(*): the narrowest plan still needs a column
            }
            Dataset<Row> ds = (Dataset<Row>) check(handler().scan(
                    ctx.sparkSession(), options, need.toArray(new String[0]), usable.toArray(new Filter[0])));
            for (Filter f : usable) {
                ds = ds.filter(Filters.column(f, ds));
            }
            // Spark reads the rows by this relation's schema: a column of another
            // type would be misread, not converted, so any difference is a cast.
            Column[] cols = new Column[columns.length];
            for (int i = 0; i < columns.length; i++) {
                DataType want = schema.apply(columns[i]).dataType();
                DataType have = ds.schema().apply(columns[i]).dataType();
                Column c = ds.col(Filters.quote(columns[i]));
                cols[i] = have.sameType(want) ? c : c.cast(want).as(columns[i]);
            }
            return ds.select(cols);
        }

        /** Where ScanStrategy is not installed: the inner plan's rows, handed over as they are. */
        @Override
        @SuppressWarnings("unchecked")
        public RDD<Row> buildScan(String[] columns, Filter[] filters) {
            return (RDD<Row>) (Object) dataset(columns, filters).queryExecution().toRdd();
        }

        @Override
        public String toString() {
            return "castsql " + options.getOrDefault("path", "") + " v" + options.getOrDefault("versionAsOf", "");
        }
    }

    /** Each micro-batch one version (the handler skips a batch the table already holds). */
    static final class BatchSink implements Sink {
        private final SQLContext ctx;
        private final Map<String, String> options;
        private final boolean complete;

        BatchSink(SQLContext ctx, Map<String, String> options, boolean complete) {
            this.ctx = ctx;
            this.options = options;
            this.complete = complete;
        }

        @Override
        public void addBatch(long batchId, Dataset<Row> data) {
            // A micro-batch's Dataset must not be planned again; its rows become a
            // plain DataFrame first (what Spark's own foreachBatch does).
            org.apache.spark.sql.classic.Dataset<Row> d = (org.apache.spark.sql.classic.Dataset<Row>) data;
            Dataset<Row> batch = d.sparkSession().internalCreateDataFrame(d.queryExecution().toRdd(), d.schema(), false);
            // Spark's id of the query, kept in its checkpoint: the same across restarts,
            // another for another query or a new checkpoint (what Delta's sink keys on).
            Map<String, String> opts = new java.util.HashMap<>(options);
            String query = ctx.sparkContext().getLocalProperty("sql.streaming.queryId");
            if (query != null) {
                opts.put(STREAM_QUERY_ID, query);
            }
            check(handler().writeBatch(ctx.sparkSession(), batch, batchId, complete, opts));
        }

        @Override
        public String toString() {
            return "castsql " + options.getOrDefault("path", "");
        }
    }
}
