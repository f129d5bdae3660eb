package castsql.spark.jvm;

import java.util.ArrayList;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Set;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.SparkSession;
import org.apache.spark.sql.catalyst.expressions.Alias;
import org.apache.spark.sql.catalyst.expressions.And;
import org.apache.spark.sql.catalyst.expressions.Attribute;
import org.apache.spark.sql.catalyst.expressions.AttributeReference;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.NamedExpression;
import org.apache.spark.sql.catalyst.planning.PhysicalOperation$;
import org.apache.spark.sql.catalyst.plans.logical.LogicalPlan;
import org.apache.spark.sql.catalyst.plans.logical.Project;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.execution.SparkStrategy;
import org.apache.spark.sql.execution.datasources.DataSourceStrategy$;
import org.apache.spark.sql.execution.datasources.LogicalRelation;
import org.apache.spark.sql.sources.Filter;
import scala.Option;
import scala.Tuple3;
import scala.jdk.javaapi.CollectionConverters;

/**
 * Plans a scan of a castsql relation as the inner DataFrame's own plan (Spark's Parquet
 * scan, the deletes' join), so whole-stage code generation runs through it. Without
 * this, Spark plans a V1 relation as a row scan over buildScan's RDD: one more copy of
 * every row (RowDataSourceScanExec's projection) and a boundary code generation stops at.
 * The strategy takes the projections and filters above the relation as Spark's own
 * file-source strategy does (PhysicalOperation), hands the filters to the relation, and
 * keeps the relation's attribute ids (aliases), so the plan above it is unchanged.
 */
final class ScanStrategy extends SparkStrategy {

    /** Adds the strategy to the session's extra strategies, once. */
    static void install(SparkSession session) {
        if (!(session instanceof org.apache.spark.sql.classic.SparkSession classic)) {
            return;
        }
        org.apache.spark.sql.ExperimentalMethods ex = classic.experimental();
        scala.collection.immutable.Seq<SparkStrategy> now = ex.extraStrategies();
        for (SparkStrategy s : CollectionConverters.asJava(now)) {
            if (s instanceof ScanStrategy) {
                return;
            }
        }
        List<SparkStrategy> all = new ArrayList<>(CollectionConverters.asJava(now));
        all.add(new ScanStrategy());
        ex.extraStrategies_$eq(CollectionConverters.asScala(all).toSeq());
    }

    @Override
    public scala.collection.immutable.Seq<SparkPlan> apply(LogicalPlan plan) {
        Option<Tuple3<scala.collection.immutable.Seq<NamedExpression>, scala.collection.immutable.Seq<Expression>, LogicalPlan>> op =
                PhysicalOperation$.MODULE$.unapply(plan);
        if (op.isEmpty() || !(op.get()._3() instanceof LogicalRelation lr)
                || !(lr.relation() instanceof CastSQLProvider.Relation rel)) {
            return CollectionConverters.asScala(List.<SparkPlan>of()).toList();
        }
        List<NamedExpression> projects = CollectionConverters.asJava(op.get()._1());
        List<Expression> filters = CollectionConverters.asJava(op.get()._2());
        // The relation's columns the projections and filters use, in the relation's order.
        Set<Long> used = new java.util.HashSet<>();
        for (NamedExpression p : projects) {
            for (Attribute a : CollectionConverters.asJava(((Expression) p).references().toSeq())) {
                used.add(a.exprId().id());
            }
        }
        for (Expression f : filters) {
            for (Attribute a : CollectionConverters.asJava(f.references().toSeq())) {
                used.add(a.exprId().id());
            }
        }
        List<AttributeReference> outer = new ArrayList<>();
        for (AttributeReference a : CollectionConverters.asJava(lr.output())) {
            if (used.contains(a.exprId().id())) {
                outer.add(a);
            }
        }
        Set<Filter> pushed = new LinkedHashSet<>();
        for (Expression f : filters) {
            Option<Filter> t = DataSourceStrategy$.MODULE$.translateFilter(f, false);
            if (t.isDefined()) {
                pushed.add(t.get());
            }
        }
        String[] names = outer.stream().map(AttributeReference::name).toArray(String[]::new);
        Dataset<Row> ds = rel.dataset(names, pushed.toArray(new Filter[0]));
        LogicalPlan inner = ds.queryExecution().optimizedPlan();
        // The inner plan's columns under the relation's attribute ids.
        List<NamedExpression> aliases = new ArrayList<>();
        List<Attribute> innerOut = CollectionConverters.asJava(inner.output());
        for (int i = 0; i < outer.size(); i++) {
            AttributeReference a = outer.get(i);
            aliases.add(new Alias(innerOut.get(i), a.name(), a.exprId(), a.qualifier(), Option.empty(),
                    CollectionConverters.asScala(List.<String>of()).toList()));
        }
        LogicalPlan top = new Project(CollectionConverters.asScala(aliases).toList(), inner);
        if (!filters.isEmpty()) {
            Expression cond = filters.get(0);
            for (int i = 1; i < filters.size(); i++) {
                cond = new And(cond, filters.get(i));
            }
            top = new org.apache.spark.sql.catalyst.plans.logical.Filter(cond, top);
        }
        top = new Project(CollectionConverters.asScala(projects).toList(), top);
        return CollectionConverters.asScala(List.of(planLater(top))).toList();
    }
}
