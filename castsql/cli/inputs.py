"""The ``--from`` files of ``append`` and ``merge`` read for the embedded
engine: one Arrow table typed as the table (FORMAT.md §3.4), a value that
does not parse refused naming its file, row and column.

Example::

    >>> read_arrow(["new.csv"], "csv", "/data/events", "append")   # doctest: +SKIP
    pyarrow.Table
    ...
"""

from __future__ import annotations

from typing import Any

from castsql.errors import CastSQLError


def read_arrow(sources: list[str], fmt: str, uri: str, what: str = "merge") -> Any:
    """The input files as one Arrow table, for the embedded merge or append (``what``).

    The one type rule (FORMAT.md §3.4): text input (CSV, JSON) is parsed into
    the table's types, and a value that does not parse is refused naming the
    file, the row and the column; typed input (Parquet) is cast only where
    that is a lossless widening, and any other type is left for the merge to
    refuse (or, with ``--merge-schema``, to widen the column to)."""
    import pyarrow as pa

    from castsql.errors import TableNotFound
    from castsql.format import TableLog
    from castsql.format.evolution import fits
    from castsql.storage import open_storage

    try:
        target = {f.name.lower(): f for f in TableLog(open_storage(uri)).latest().schema.to_arrow()}
    except TableNotFound:
        target = {}  # an append that creates the table: the input's own types

    def one(path: str) -> pa.Table:
        try:
            if fmt == "csv":
                import pyarrow.csv as pacsv

                names = pacsv.read_csv(path).column_names
                types = {n: target[n.lower()].type for n in names if n.lower() in target}
                try:
                    return pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(column_types=types))
                except pa.ArrowInvalid:
                    raise bad_csv_value(path, types, what) from None
            if fmt == "json":
                import pyarrow.json as pajson

                names = pajson.read_json(path).column_names
                schema = pa.schema([target[n.lower()].with_name(n) for n in names if n.lower() in target])
                opts = pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
                return pajson.read_json(path, parse_options=opts)
            import pyarrow.parquet as pq

            return pq.read_table(path)
        except (pa.ArrowException, OSError) as e:
            raise CastSQLError(f"{what}: cannot read {path} as {fmt}: {' '.join(str(e).split())}") from None

    tables = [one(p) for p in sources]
    try:
        data = pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as e:
        raise CastSQLError(f"{what}: the input files do not have the same columns: {e}") from None
    cols = []
    for name, col in zip(data.column_names, data.columns, strict=True):
        f = target.get(name.lower())
        if f is not None and col.type != f.type and fits(col.type, f.type):
            col = col.cast(f.type)
        cols.append(col)
    return pa.Table.from_arrays(cols, names=data.column_names)


def bad_csv_value(path: str, types: dict[str, Any], what: str) -> CastSQLError:
    """The first value of a CSV file that does not parse as its column's type,
    as an error naming the file, the row and the column (pyarrow's own names
    neither the row nor the value's column by name)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    strings = pacsv.ConvertOptions(column_types=dict.fromkeys(types, pa.string()), strings_can_be_null=True)
    text = pacsv.read_csv(path, convert_options=strings)
    for name, t in types.items():
        for row, value in enumerate(text.column(name).to_pylist(), start=1):
            if value is None:
                continue
            try:
                pa.array([value], pa.string()).cast(t)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                return CastSQLError(
                    f"{what}: {path}: data row {row}: column {name!r}: {value!r} is not a {t} value; "
                    "nothing was written"
                )
    return CastSQLError(f"{what}: {path}: a value does not parse as its column's type; nothing was written")
