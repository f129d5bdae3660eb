"""The write planner both engines share (Spark and the embedded DuckDB engine):
which tombstone records delete the matched rows (:mod:`castsql.write.records`),
what a merge does to each row (:mod:`castsql.write.merge`), and the one commit
holding new data files and one tombstone (:mod:`castsql.write.commit`).

Format level: imports :mod:`castsql.format`, :mod:`castsql.storage`, pyarrow,
numpy and pyroaring, never DuckDB or pyspark, so the two engines cannot drift.
"""
