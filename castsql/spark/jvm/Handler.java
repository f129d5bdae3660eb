package castsql.spark.jvm;

import java.util.Map;
import org.apache.spark.sql.sources.Filter;

/**
 * The Python half of format("castsql"): castsql.spark.register(spark) installs
 * one through py4j (castsql/spark/bridge.py). Every method returns its result or
 * a Throwable to throw: an exception raised inside a py4j callback would reach
 * the user as a Python traceback wrapped in a Py4JException.
 */
public interface Handler {
    /** Resolves a read: the options with the version fixed (versionAsOf), plus "__schema", its Spark schema as JSON. */
    Object open(Object session, Map<String, String> options);

    /**
     * The live rows of the columns (a Dataset) of the version the options fix, from the
     * files whose statistics may match the filters (Spark applies them to the rows still).
     */
    Object scan(Object session, Map<String, String> options, String[] columns, Filter[] filters);

    /** Writes a DataFrame as one new version; mode is a SaveMode's name. Returns null. */
    Object write(Object session, Object data, String mode, Map<String, String> options);

    /** Writes one micro-batch as one version unless the table already holds that batch of that query. */
    Object writeBatch(Object session, Object data, long batchId, boolean complete, Map<String, String> options);
}
