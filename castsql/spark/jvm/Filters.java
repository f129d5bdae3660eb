package castsql.spark.jvm;

import java.util.Arrays;
import org.apache.spark.sql.Column;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.functions;
import org.apache.spark.sql.sources.*;
import org.apache.spark.sql.types.StructType;

/**
 * Spark's pushed filters back into Columns, for the plan a scan builds. Only
 * exact translations: a filter Spark pushed is a rewrite of the query's own
 * predicate on a top-level column, and the same predicate as a Column keeps
 * its meaning (Spark coerces the literal's type as it did the first time).
 */
final class Filters {
    private Filters() {}

    static String quote(String name) {
        return "`" + name.replace("`", "``") + "`";
    }

    static boolean translatable(Filter f, StructType schema) {
        if (f instanceof And a) {
            return translatable(a.left(), schema) && translatable(a.right(), schema);
        }
        if (f instanceof Or o) {
            return translatable(o.left(), schema) && translatable(o.right(), schema);
        }
        if (f instanceof Not n) {
            return translatable(n.child(), schema);
        }
        boolean known = f instanceof EqualTo || f instanceof EqualNullSafe || f instanceof GreaterThan
                || f instanceof GreaterThanOrEqual || f instanceof LessThan || f instanceof LessThanOrEqual
                || f instanceof In || f instanceof IsNull || f instanceof IsNotNull || f instanceof StringStartsWith;
        if (!known) {
            return false;
        }
        java.util.List<String> names = Arrays.asList(schema.fieldNames());
        return Arrays.stream(f.references()).allMatch(names::contains);
    }

    static Column column(Filter f, Dataset<Row> ds) {
        if (f instanceof And a) {
            return column(a.left(), ds).and(column(a.right(), ds));
        }
        if (f instanceof Or o) {
            return column(o.left(), ds).or(column(o.right(), ds));
        }
        if (f instanceof Not n) {
            return functions.not(column(n.child(), ds));
        }
        if (f instanceof EqualTo e) {
            return ds.col(quote(e.attribute())).equalTo(functions.lit(e.value()));
        }
        if (f instanceof EqualNullSafe e) {
            return ds.col(quote(e.attribute())).eqNullSafe(functions.lit(e.value()));
        }
        if (f instanceof GreaterThan e) {
            return ds.col(quote(e.attribute())).gt(functions.lit(e.value()));
        }
        if (f instanceof GreaterThanOrEqual e) {
            return ds.col(quote(e.attribute())).geq(functions.lit(e.value()));
        }
        if (f instanceof LessThan e) {
            return ds.col(quote(e.attribute())).lt(functions.lit(e.value()));
        }
        if (f instanceof LessThanOrEqual e) {
            return ds.col(quote(e.attribute())).leq(functions.lit(e.value()));
        }
        if (f instanceof In e) {
            return ds.col(quote(e.attribute())).isin(e.values());
        }
        if (f instanceof IsNull e) {
            return ds.col(quote(e.attribute())).isNull();
        }
        if (f instanceof IsNotNull e) {
            return ds.col(quote(e.attribute())).isNotNull();
        }
        if (f instanceof StringStartsWith e) {
            return ds.col(quote(e.attribute())).startsWith(e.value());
        }
        throw new IllegalArgumentException("castsql: no translation of filter " + f);
    }
}
