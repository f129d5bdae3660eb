"""The Spark half of the writer subcommands (``castsql delete|update|merge|append|compact --engine spark``):
a Spark session, the input files read as a DataFrame typed as the table, the
job run by :mod:`castsql.spark.appends`, :mod:`castsql.spark.engine` or
:mod:`castsql.spark.compactor`. The command line itself, the embedded engine
and the summaries are :mod:`castsql.cli.writes`'s.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from castsql.errors import require
from castsql.format import TableLog
from castsql.spark.errors import job_errors
from castsql.storage import open_storage


def run(args: Any, clauses: Callable[[Any, Any], Any]) -> Any:
    """Run ``args`` (a parsed writer command) as a Spark job: the committed
    manifest, the merge's metrics, or None when nothing changed. ``clauses``
    adds the merge clauses the flags ask for to a merge builder."""
    require("pyspark", "spark", f"castsql {args.command}")
    from castsql.spark.session import spark_session

    # PySpark logs every analysis error as a JSON record on stderr before
    # raising it; the CLI reports the error itself, in one line.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).disabled = True
    spark = spark_session(f"castsql {args.command}", progress=True)
    # The JVM's own ERROR lines for a failed task would repeat, with stack
    # traces, what the one error line the CLI prints says.
    spark.sparkContext.setLogLevel("OFF")
    try:
        return _spark_command(spark, args, clauses)
    finally:
        spark.sparkContext.setLogLevel("WARN")  # as log4j2.properties has it, for whoever shares the session


def _spark_command(spark: Any, args: Any, clauses: Callable[[Any, Any], Any]) -> Any:
    if args.command == "append":
        from castsql.spark.appends import append

        df = _read_input(spark, args.uri, args.sources, args.input_format, "append")
        return append(
            spark,
            args.uri,
            df,
            primary_key=args.primary_key,
            merge_schema=args.merge_schema,
            allow_duplicate_keys=args.allow_duplicate_keys,
            properties=args.properties or None,
        )
    if args.command == "delete":
        from castsql.spark.engine import delete

        return delete(spark, args.uri, args.where)
    if args.command == "update":
        from castsql.spark.engine import update

        return update(spark, args.uri, args.assign, args.where, merge_schema=args.merge_schema)
    if args.command == "merge":
        from castsql.spark.engine import merge

        if args.cdc is not None:
            from castsql.spark.engine import cdc_merge

            if args.input_format == "debezium":
                df, cdc = _debezium_input(spark, args.uri, args.sources, args.cdc)
                return cdc_merge(spark, args.uri, df, **cdc)
            df = _read_input(spark, args.uri, args.sources, args.input_format, "merge")
            return cdc_merge(spark, args.uri, df, **args.cdc)
        df = _read_input(spark, args.uri, args.sources, args.input_format, "merge")
        builder = merge(
            spark,
            args.uri,
            df,
            on=args.on,
            merge_schema=args.merge_schema,
            allow_duplicate_keys=args.allow_duplicate_keys,
        )
        return clauses(builder, args).execute()
    from castsql.spark.compactor import compact

    return compact(spark, args.uri, threshold=args.threshold)


def _debezium_input(spark: Any, uri: str, sources: list[str], cdc: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Debezium events (JSON lines) as a CDC batch whose table columns have
    the table's types, and ``cdc_merge``'s options for it."""
    from castsql.spark.engine import _debezium_frame

    with job_errors("merge: reading the input"):
        df = spark.read.json([os.path.abspath(s) for s in sources])
    if "payload" in df.columns:  # events with their schema: {"schema": …, "payload": …}
        df = df.select("payload.*")
    batch, op, seq, unavailable = _debezium_frame(df, cdc["op_column"], cdc["sequence"], cdc["unavailable"])
    return _fit_to_table(uri, batch, "json"), {
        **cdc,
        "format": "rows",
        "op_column": op,
        "sequence": seq,
        "unavailable": unavailable,
    }


def _read_input(spark: Any, uri: str, sources: list[str], fmt: str, what: str) -> Any:
    """The ``--from`` files as a DataFrame whose table columns have the table's types (:func:`_fit_to_table`).

    CSV carries no types: Spark infers one per column over the files, and an
    inferred type need not be the table's (``1.25`` is a double for a
    ``decimal(5, 2)`` column, ``0007`` an int for a string one, ``2.5`` a
    double for a BIGINT one). So when the table exists, its columns are read
    again as the text in the file and parsed into the table's types, which
    refuses a value that does not parse, or would not be stored exactly,
    naming the file and its line; the input's other columns (new ones, for
    ``--merge-schema``) keep the inferred type."""
    paths = [os.path.abspath(s) for s in sources]
    reader = spark.read.format(fmt)
    if fmt == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    with job_errors(f"{what}: reading the input"):
        df = reader.load(paths)
    if fmt == "csv":
        df = _table_columns_as_text(spark, uri, df, paths)
    return _fit_to_table(uri, df, fmt)


def _table_columns_as_text(spark: Any, uri: str, df: Any, paths: list[str]) -> Any:
    """``df`` (CSV read with inferred types) read again with the table's columns as strings."""
    from pyspark.sql.types import StringType, StructField, StructType

    from castsql.errors import TableNotFound

    try:
        names = {n.lower() for n in TableLog(open_storage(uri)).latest().schema.names}
    except TableNotFound:
        return df
    fields = df.schema.fields
    if all(f.name.lower() not in names or isinstance(f.dataType, StringType) for f in fields):
        return df  # already the text
    text = StructType([StructField(f.name, StringType(), True) if f.name.lower() in names else f for f in fields])
    # The same files, header and columns in the same order: the schema applies by position, as inference did.
    return spark.read.format("csv").option("header", "true").schema(text).load(paths)


def _fit_to_table(uri: str, df: Any, fmt: str | None = None) -> Any:
    """Cast the columns of an input file that the table has to the table's types.

    CSV and JSON carry no schema: Spark infers INT for small numbers and
    STRING for times. Columns are matched by name (any case) and the others
    kept as they are (a merge's change-type column); missing or extra columns
    are left for append's schema check to report. Text parsed into a column's
    type is checked first (one Spark job over those columns): a value that
    does not parse is refused naming the file, its line, the column and both
    types (:func:`_refuse_bad_text`), before anything is written.
    """
    from castsql.errors import TableNotFound
    from castsql.spark.types import spark_type

    try:
        schema = TableLog(open_storage(uri)).latest().schema
    except TableNotFound:
        return df

    from castsql.format.evolution import fits

    types = {f.name.lower(): f for f in schema.to_arrow()}
    cols, parsed = [], []
    for field in df.schema.fields:
        c = field.name
        f = types.get(c.lower())
        # Text (what CSV and JSON hold) is parsed into the column's type; any
        # other input type only where the one type rule (FORMAT.md §3.4,
        # castsql.format.evolution.fits) takes it losslessly. The rest is left
        # as it is, for append's check to refuse naming both types.
        src = _arrow_of(field.dataType)
        # Only CSV and JSON hold text for every type; a Parquet string column is a string.
        text = src is not None and pa.types.is_string(src) and fmt in ("csv", "json")
        if f is None or (src is not None and not text and not fits(src, f.type)):
            cols.append(df[c])
        elif text and not pa.types.is_string(f.type):
            want = spark_type(f.type)
            cols.append(df[c].try_cast(want).alias(f.name))
            parsed.append((c, f, want))
        else:
            cols.append(df[c].cast(spark_type(f.type)).alias(f.name))
    if parsed:
        _refuse_bad_text(df, parsed, fmt)
    return df.select(*cols)


def _refuse_bad_text(df: Any, parsed: list[tuple[str, Any, Any]], fmt: str | None) -> None:
    """SchemaMismatch naming file, line, column and both types for the first
    input text that does not parse as its table column's type."""
    from pyspark.sql import functions as F

    from castsql.errors import SchemaMismatch

    conds = [df[c].isNotNull() & df[c].try_cast(want).isNull() for c, _, want in parsed]
    lossy = [_changed(df[c], f.type, want) for c, f, want in parsed]
    bad = conds[0]
    for cond in conds[1:] + lossy:
        bad = bad | cond
    with job_errors("reading the input"):
        flags = [cond.alias(f"_bad{i}") for i, cond in enumerate(conds)]
        flags += [cond.alias(f"_lossy{i}") for i, cond in enumerate(lossy)]
        rows = df.where(bad).select(F.input_file_name().alias("_file"), *flags, *[df[c] for c, _, _ in parsed])
        rows = rows.limit(1).collect()
    if not rows:
        return
    row = rows[0]
    for i, (c, f, _) in enumerate(parsed):
        if not (row[f"_bad{i}"] or row[f"_lossy{i}"]):
            continue
        value = row[c]
        path = _local_path(row["_file"])
        line = _line_of(path, c, value, fmt)
        at = f"{path}" + (f" line {line}" if line is not None else "")
        why = "" if row[f"_bad{i}"] else f" ({_LOSS[_kind(f.type) or '']})"
        raise SchemaMismatch(
            f"{at}: column {f.name!r}: {value!r} (string in the file) is not a {f.type} value{why}, the table's type; "
            "nothing was written"
        )


# What a value that parses into a column's type would lose (see _changed).
_LOSS = {
    "decimal": "it would be rounded",
    "date": "it has a time of day",
    "float": "it is out of range",
    "naive": "its time zone would be dropped",
}


def _kind(t: pa.DataType) -> str | None:
    if pa.types.is_decimal(t):
        return "decimal"
    if pa.types.is_date32(t):
        return "date"
    if pa.types.is_floating(t):
        return "float"
    if pa.types.is_timestamp(t) and t.tz is None:
        return "naive"
    return None


def _changed(text: Any, t: pa.DataType, want: Any) -> Any:
    """True for text that parses as ``want`` (``t``'s Spark type) only by
    changing its value, which Spark's casts do without a word: a decimal with
    more digits after the point than the column keeps (rounded), a date with a
    time of day (truncated), a number beyond FLOAT's range (infinity), a time
    with a zone other than UTC into a naive timestamp (the zone dropped; naive
    times are UTC wall clock, FORMAT.md §3). Integers need no check (a
    fraction does not parse); floating-point text is rounded by nature."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import DecimalType, DoubleType, TimestampNTZType, TimestampType

    parsed = text.try_cast(want)
    kind = _kind(t)
    if kind == "decimal":
        wide = DecimalType(38, max(18, t.scale))
        exact = text.try_cast(wide)
        return F.coalesce(exact.isNotNull() & parsed.isNotNull() & (parsed.cast(wide) != exact), F.lit(False))
    if kind == "date":
        exact = text.try_cast(TimestampNTZType())
        return F.coalesce(parsed.isNotNull() & (parsed.cast(TimestampNTZType()) != exact), F.lit(False))
    if kind == "float" and pa.types.is_float32(t):
        inf = F.lit(float("inf"))
        return F.coalesce((F.abs(parsed) == inf) & (F.abs(text.try_cast(DoubleType())) != inf), F.lit(False))
    if kind == "naive":
        instant = text.try_cast(TimestampType()).cast(TimestampNTZType())
        return F.coalesce(parsed.isNotNull() & (parsed != instant), F.lit(False))
    return F.lit(False)


def _local_path(uri: str) -> str:
    from urllib.parse import unquote, urlparse

    u = urlparse(uri)
    return unquote(u.path) if u.scheme in ("file", "") else uri


def _line_of(path: str, column: str, value: str, fmt: str | None) -> int | None:
    """The 1-based line of ``path`` where the first record whose ``column`` is
    ``value`` starts (CSV with a header, or JSON lines); None if not found."""
    import csv
    import json

    try:
        with open(path, newline="", encoding="utf-8") as fh:
            if fmt == "json":
                for n, text in enumerate(fh, 1):
                    try:
                        rec = json.loads(text)
                    except ValueError:
                        continue
                    got = {k.lower(): v for k, v in rec.items()}.get(column.lower()) if isinstance(rec, dict) else None
                    if got is not None and str(got) == value:
                        return n
                return None
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                return None
            names = [h.strip().lower() for h in header]
            if column.lower() not in names:
                return None
            i = names.index(column.lower())
            start = reader.line_num + 1
            for rec in reader:
                if i < len(rec) and rec[i] == value:
                    return start
                start = reader.line_num + 1
    except (OSError, UnicodeDecodeError):  # the line is a courtesy: the error names the file anyway
        return None
    return None


def _arrow_of(spark_type_: Any) -> Any:
    from pyspark.sql.pandas.types import to_arrow_type

    try:
        return to_arrow_type(spark_type_, timestamp_utc=True)
    except Exception:
        return None
