"""The embedded write engine: DuckDB in-process, one machine, no JVM.

Beside :mod:`castsql.spark`, the other engine of the one write pipeline
(:mod:`castsql.write.pipeline`): it finds rows with DuckDB queries over the
query engine's views (:mod:`castsql.engine`) and writes files with pyarrow.
``castsql.Table``'s writes run here.
"""
