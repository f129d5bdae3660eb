"""The SQL that turns a resolved snapshot into a DuckDB view of its live rows.

Provisional design, to be replaced by the measured one.
"""

from __future__ import annotations

import array
from collections.abc import Sequence

import duckdb
import pyarrow as pa

from castsql.snapshot import Predicate, Snapshot, prune_files


def sql_str(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def _file_list(uris: list[str]) -> str:
    return "[" + ", ".join(sql_str(u) for u in uris) + "]"


def _positions(snap: Snapshot, files: list) -> pa.Table:
    idx, pos = [], []
    for i, f in enumerate(files):
        arr = f.deleted.to_array()
        idx.append(pa.array([i] * len(arr), pa.uint64()) if arr else None)
        pos.append(pa.Array.from_buffers(pa.uint32(), len(arr), [None, pa.py_buffer(arr)]) if arr else None)
    idx = [a for a in idx if a is not None]
    pos = [a for a in pos if a is not None]
    if not idx:
        return pa.table({"file_index": pa.array([], pa.uint64()), "pos": pa.array([], pa.int64())})
    return pa.table({"file_index": pa.concat_arrays(idx), "pos": pa.concat_arrays(pos).cast(pa.int64())})


def create_view(
    con: duckdb.DuckDBPyConnection,
    name: str,
    snap: Snapshot,
    *,
    predicates: Sequence[Predicate] = (),
    positions: bool = False,
) -> None:
    """Create (or replace) the temp view ``name`` holding the live rows of ``snap``.

    ``predicates`` prune files by manifest min/max first; ``positions`` adds
    ``_file`` (table key) and ``_pos`` (row position) columns, for audits.
    """
    files = prune_files(snap.files, predicates, {c.name: c.type for c in snap.schema.columns})
    if positions:
        _create_positional_view(con, name, snap, files)
        return
    cols = ", ".join(ident(c) for c in snap.schema.names)
    clean = [f for f in files if not f.has_deletes]
    dirty = [f for f in files if f.has_deletes]
    parts = []
    if clean:
        parts.append(f"SELECT {cols} FROM read_parquet({_file_list([f.uri for f in clean])})")
    if dirty:
        del_name = name + "$deletes"
        con.register(del_name, _positions(snap, dirty))
        pk = snap.primary_key
        ranges = []
        for i, f in enumerate(dirty):
            for lo, hi in f.key_ranges:
                ranges.append(f"(file_index = {i} AND {ident(pk)} BETWEEN {_lit(lo)} AND {_lit(hi)})")
        where = f" WHERE NOT ({' OR '.join(ranges)})" if ranges else ""
        parts.append(
            f"SELECT {cols} FROM (SELECT *, file_index, file_row_number "
            f"FROM read_parquet({_file_list([f.uri for f in dirty])}){where}) AS s "
            f"ANTI JOIN {ident(del_name)} AS d ON s.file_index = d.file_index AND s.file_row_number = d.pos"
        )
    if not parts:
        typed = ", ".join(f"CAST(NULL AS {_duck_type(c.type)}) AS {ident(c.name)}" for c in snap.schema.columns)
        parts.append(f"SELECT {typed} WHERE false")
    con.execute(f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS " + " UNION ALL ".join(parts))


def _create_positional_view(con: duckdb.DuckDBPyConnection, name: str, snap: Snapshot, files: list) -> None:
    cols = ", ".join(ident(c) for c in snap.schema.names)
    if not files:
        typed = ", ".join(f"CAST(NULL AS {_duck_type(c.type)}) AS {ident(c.name)}" for c in snap.schema.columns)
        con.execute(
            f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS SELECT {typed}, NULL::VARCHAR AS _file, "
            "NULL::BIGINT AS _pos WHERE false"
        )
        return
    keys = pa.table({"file_index": pa.array(range(len(files)), pa.uint64()), "_file": [f.key for f in files]})
    con.register(name + "$files", keys)
    dels = name + "$deletes"
    con.register(dels, _positions(snap, files))
    ranges = [
        f"(s.file_index = {i} AND {ident(snap.primary_key)} BETWEEN {_lit(lo)} AND {_lit(hi)})"
        for i, f in enumerate(files)
        for lo, hi in f.key_ranges
    ]
    where = f" WHERE NOT ({' OR '.join(ranges)})" if ranges else ""
    con.execute(
        f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS SELECT {cols}, k._file, s.file_row_number AS _pos "
        f"FROM (SELECT *, file_index, file_row_number FROM read_parquet({_file_list([f.uri for f in files])})) AS s "
        f"JOIN {ident(name + '$files')} AS k ON s.file_index = k.file_index "
        f"ANTI JOIN {ident(dels)} AS d ON s.file_index = d.file_index AND s.file_row_number = d.pos{where}"
    )


def _lit(v) -> str:
    if isinstance(v, str):
        return sql_str(v)
    return repr(v)


def _duck_type(t: str) -> str:
    import duckdb.sqltypes  # noqa: F401

    mapping = {
        "int64": "BIGINT", "int32": "INTEGER", "int16": "SMALLINT", "int8": "TINYINT", "uint64": "UBIGINT",
        "uint32": "UINTEGER", "uint16": "USMALLINT", "uint8": "UTINYINT", "double": "DOUBLE", "float": "FLOAT",
        "string": "VARCHAR", "binary": "BLOB", "bool": "BOOLEAN", "date32[day]": "DATE",
        "timestamp[us]": "TIMESTAMP", "timestamp[us, tz=UTC]": "TIMESTAMPTZ",
    }  # fmt: skip
    if t.startswith("decimal"):
        return t.replace("decimal128", "DECIMAL")
    return mapping.get(t, "VARCHAR")


_ = array
