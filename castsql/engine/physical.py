"""Data files as they are, against the schema the manifest declares.

A table's files may come from other writers, and files that lose nothing
still differ from the manifest: columns in another order or case, an extra
column, ``int32`` where the manifest says ``int64``, a timestamp stored as an
instant (Spark's default, ``isAdjustedToUTC``) where the manifest says a naive
``timestamp[us]``. DuckDB's ``read_parquet`` maps the columns of every file by
name onto the *first* file's columns and casts the rest to the first file's
types (a zoned timestamp through the session's ``TimeZone``), so without care
``SELECT *`` would return different columns, types or instants depending on
which file a query happens to read first.

So every view reads the manifest's columns, names, order and types, whatever
the files hold: files are grouped by their physical columns (read from their
footers once: files never change), each group is read on its own, and each
manifest column is an expression over the group's physical column:

- the same type: the column itself;
- a lossless widening (``int32`` to ``int64``, ``float`` to ``double``, a
  wider decimal, another timestamp unit): a ``CAST``;
- an instant where the manifest says a naive timestamp, or the reverse: the
  UTC wall-clock time (``timezone('UTC', …)``), never the session's time zone;
- a column the file lacks that the table added after it was written
  (``added_in``, FORMAT.md §3.4): NULL;
- anything else (``VARCHAR`` where the manifest says ``BIGINT``, a missing
  column the table was created with, a name matching two columns but for
  case): one error naming the file, the column and both types.

Columns are matched by name, never by position: a version reads with its own
schema, so time travel to a version before a column was added or widened
shows the columns and types it had, and a widened column reads old files
through the ``CAST`` above (``DATE`` to ``TIMESTAMP`` among them).

Example::

    >>> conversion("c", "INTEGER", "BIGINT", "f.parquet")
    'CAST("c" AS BIGINT)'
    >>> conversion("ts", "TIMESTAMP WITH TIME ZONE", "TIMESTAMP", "f.parquet")
    'timezone(\\'UTC\\', "ts")'
    >>> conversion("c", "VARCHAR", "BIGINT", "f.parquet")
    Traceback (most recent call last):
    castsql.errors.SchemaMismatch: f.parquet: column 'c' is VARCHAR in the file, the manifest says BIGINT
"""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb
import pyarrow as pa

from castsql.engine.sql.quoting import ident as _ident
from castsql.engine.sql.quoting import sql_list
from castsql.errors import FormatError, SchemaMismatch
from castsql.format.manifest import DataFile
from castsql.format.schema import Schema, type_from_name
from castsql.snapshot import ResolvedFile
from castsql.storage import Storage

Signature = tuple[tuple[str, str | None], ...]  # (physical name, DuckDB type or None for nested), in file order

_INTS = {
    "TINYINT": (True, 8),
    "SMALLINT": (True, 16),
    "INTEGER": (True, 32),
    "BIGINT": (True, 64),
    "HUGEINT": (True, 128),
    "UTINYINT": (False, 8),
    "USMALLINT": (False, 16),
    "UINTEGER": (False, 32),
    "UBIGINT": (False, 64),
}
_DECIMAL = re.compile(r"^DECIMAL\((\d+),\s*(\d+)\)$")
_TIMESTAMPS = {"TIMESTAMP", "TIMESTAMP_S", "TIMESTAMP_MS", "TIMESTAMP_NS"}
_TZ = "TIMESTAMP WITH TIME ZONE"


def duck_type(arrow_name: str) -> str:
    """DuckDB's name for a manifest column type (``int64`` -> ``BIGINT``).

    >>> duck_type("timestamp[us, tz=UTC]"), duck_type("decimal128(10, 2)"), duck_type("string")
    ('TIMESTAMP WITH TIME ZONE', 'DECIMAL(10,2)', 'VARCHAR')
    """
    t = type_from_name(arrow_name)
    simple = {
        pa.bool_(): "BOOLEAN", pa.int8(): "TINYINT", pa.int16(): "SMALLINT", pa.int32(): "INTEGER",
        pa.int64(): "BIGINT", pa.uint8(): "UTINYINT", pa.uint16(): "USMALLINT", pa.uint32(): "UINTEGER",
        pa.uint64(): "UBIGINT", pa.float16(): "FLOAT", pa.float32(): "FLOAT", pa.float64(): "DOUBLE",
        pa.string(): "VARCHAR", pa.binary(): "BLOB", pa.date32(): "DATE",
    }  # fmt: skip
    if t in simple:
        return simple[t]
    if pa.types.is_timestamp(t):
        return _TZ if t.tz else "TIMESTAMP"
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    raise SchemaMismatch(f"column type {arrow_name} has no DuckDB equivalent")


def _widens(src: str, dst: str) -> bool:
    """Every value of DuckDB type ``src`` is exactly a value of ``dst``."""
    if src in _INTS and dst in _INTS:
        (s_signed, s_bits), (d_signed, d_bits) = _INTS[src], _INTS[dst]
        if s_signed == d_signed:
            return d_bits >= s_bits
        return d_signed and d_bits > s_bits  # unsigned into a wider signed type
    if src == "FLOAT" and dst == "DOUBLE":
        return True
    s, d = _DECIMAL.match(src), _DECIMAL.match(dst)
    if s and d:
        (sp, ss), (dp, ds) = (int(s[1]), int(s[2])), (int(d[1]), int(d[2]))
        return ds >= ss and dp - ds >= sp - ss
    if src in _INTS and d:  # an integer into a decimal with room for all its digits
        digits = {8: 3, 16: 5, 32: 10, 64: 20, 128: 39}[_INTS[src][1]]
        return int(d[1]) - int(d[2]) >= digits
    if src == "DATE" and dst == "TIMESTAMP":  # a widened column (FORMAT.md §3.4): midnight of the date
        return True
    # Timestamp units: DuckDB reads seconds and milliseconds as microseconds; a
    # nanosecond column keeps the microseconds the manifest's type can hold.
    return src in _TIMESTAMPS and dst == "TIMESTAMP"


def conversion(physical: str, src: str | None, dst: str, file: str) -> str:
    """The SQL expression turning file column ``physical`` of DuckDB type ``src``
    into the manifest's type ``dst``; SchemaMismatch if that would lose or invent data."""
    col = _ident(physical)
    if src == dst:
        return col
    if src is not None:
        if _widens(src, dst):
            return f"CAST({col} AS {dst})"
        if src == _TZ and dst == "TIMESTAMP":
            return f"timezone('UTC', {col})"  # the instant's UTC wall-clock time
        if src in _TIMESTAMPS and dst == _TZ:
            inner = col if src == "TIMESTAMP" else f"CAST({col} AS TIMESTAMP)"
            return f"timezone('UTC', {inner})"  # a naive time taken as UTC, as FORMAT.md §3 says
    what = src or "a nested type"
    raise SchemaMismatch(f"{file}: column {physical!r} is {what} in the file, the manifest says {dst}")


def projection(schema: Schema, signature: Signature, file: str) -> str:
    """``expr AS "column", …`` for every manifest column, in manifest order, over
    files whose physical columns are ``signature`` (``file`` names one in errors)."""
    exact = {name: (name, t) for name, t in signature}
    folded: dict[str, list[tuple[str, str | None]]] = {}
    for name, t in signature:
        folded.setdefault(name.lower(), []).append((name, t))
    out = []
    for c in schema.columns:
        found = exact.get(c.name)
        if found is None:
            candidates = folded.get(c.name.lower(), [])
            if len(candidates) > 1:
                names = " and ".join(repr(n) for n, _ in candidates)
                raise SchemaMismatch(f"{file}: columns {names} both match the manifest's column {c.name!r}")
            if not candidates and c.added_in is not None:
                # Written before the column was added (FORMAT.md §3.4): NULL there.
                out.append(f"CAST(NULL AS {duck_type(c.type)}) AS {_ident(c.name)}")
                continue
            if not candidates:
                have = ", ".join(n for n, _ in signature)
                raise SchemaMismatch(f"{file}: has no column {c.name!r} (it has {have})")
            found = candidates[0]
        out.append(f"{conversion(found[0], found[1], duck_type(c.type), file)} AS {_ident(c.name)}")
    return ", ".join(out)


def matches(schema: Schema, signature: Signature) -> bool:
    """The files hold exactly the manifest's columns, in its order, with its types."""
    return len(signature) == len(schema.columns) and all(
        name == c.name and t == duck_type(c.type) for (name, t), c in zip(signature, schema.columns, strict=True)
    )


@dataclass(frozen=True)
class Group:
    """Files of one physical signature."""

    signature: Signature
    uris: tuple[str, ...]


class Signatures:
    """Physical columns of data files, read from their footers once per process
    (data files are immutable; DuckDB's own metadata cache keeps the footers)."""

    _cache: dict[str, Signature] = {}
    _rows: dict[str, tuple[int, ...]] = {}  # rows per row group, from the footer
    _lock = threading.Lock()

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con

    def of(self, uris: Sequence[str]) -> dict[str, Signature]:
        with self._lock:
            missing = [u for u in uris if u not in self._cache]
        for start in range(0, len(missing), 2000):
            found = self._read(missing[start : start + 2000])
            with self._lock:
                self._cache.update(found)
        with self._lock:
            return {u: self._cache[u] for u in uris}

    def _read(self, uris: list[str]) -> dict[str, Signature]:
        rows = self.con.execute(
            f"SELECT file_name, name, duckdb_type, num_children FROM parquet_schema({sql_list(uris)})"
        ).fetchall()
        out: dict[str, list[tuple[str, str | None]]] = {}
        pending: dict[str, list[int]] = {}  # per file: children still to skip below the current top-level column
        for file, name, dtype, children in rows:
            stack = pending.setdefault(file, [])
            if file not in out:  # the first row of a file is its root
                out[file] = []
                continue
            if stack:  # inside a nested column: skip its members
                stack[-1] -= 1
                if stack[-1] == 0:
                    stack.pop()
                if children:
                    stack.append(children)
                continue
            out[file].append((name, dtype if not children else None))
            if children:
                stack.append(children)
        return {f: tuple(cols) for f, cols in out.items()}

    @classmethod
    def remember(cls, storage: Storage, files: Sequence[DataFile], schema: Schema) -> None:
        """Footers this process wrote itself (``files``, written by
        :func:`castsql.format.write_data_files` under ``schema``): what a read
        would find in them, known without reading them. A stream's automatic
        compaction then plans and reads its small files without a footer read
        each; files another writer wrote are still read and checked."""
        if any(f.row_group_rows is None for f in files):
            return
        types = [type_from_name(c.type) for c in schema.columns]
        if any(pa.types.is_timestamp(t) and t.unit != "us" for t in types):
            return  # a foreign manifest's other units: the footer says TIMESTAMP_NS (or _MS, _S), not TIMESTAMP
        try:
            sig = tuple((c.name, duck_type(c.type)) for c in schema.columns)
        except SchemaMismatch:
            return
        with cls._lock:
            for f in files:
                uri = storage.uri(f.path)
                cls._cache[uri] = sig
                cls._rows[uri] = tuple(f.row_group_rows)  # type: ignore[arg-type]

    def row_groups(self, uris: Sequence[str]) -> dict[str, tuple[int, ...]]:
        """Rows in each row group of each file, from its footer (read once per process)."""
        with self._lock:
            missing = [u for u in uris if u not in self._rows]
        for start in range(0, len(missing), 2000):
            chunk = missing[start : start + 2000]
            rows = self.con.execute(
                f"SELECT file_name, row_group_id, max(row_group_num_rows) FROM parquet_metadata({sql_list(chunk)}) "
                "GROUP BY ALL ORDER BY file_name, row_group_id"
            ).fetchall()
            found: dict[str, list[int]] = {u: [] for u in chunk}
            for file, _, n in rows:
                found.setdefault(file, []).append(n)
            with self._lock:
                self._rows.update({u: tuple(ns) for u, ns in found.items()})
        with self._lock:
            return {u: self._rows[u] for u in uris}

    def check_rows(self, files: Sequence[ResolvedFile]) -> None:
        """FormatError naming the file and the version unless each file's footer
        holds the rows its manifest entry says (total, and per row group where the
        entry lists them): deletes are positions placed by those counts, and a count
        answered from metadata relies on them."""
        found = self.row_groups([f.uri for f in files])
        for f in files:
            got, entry = found[f.uri], f.entry
            claimed = entry.row_group_rows
            if sum(got) != entry.total_rows or (claimed is not None and tuple(claimed) != got):
                said = f"{entry.total_rows} rows" + (
                    f" in row groups of {list(claimed)}" if claimed is not None else ""
                )
                raise FormatError(
                    f"{f.uri} (version {f.version}): the file holds {sum(got)} rows in row groups of "
                    f"{list(got)}, the manifest says {said}"
                )

    def groups_of(self, files: Sequence[ResolvedFile]) -> list[Group]:
        """The files by physical signature (see :meth:`groups`), after checking
        their row counts against their footers (:meth:`check_rows`)."""
        self.check_rows(files)
        return self.groups([f.uri for f in files])

    def groups(self, uris: Sequence[str]) -> list[Group]:
        """``uris`` by physical signature, in the order each signature is first met."""
        sigs = self.of(uris)
        by: dict[Signature, list[str]] = {}
        for u in uris:
            by.setdefault(sigs[u], []).append(u)
        return [Group(sig, tuple(us)) for sig, us in by.items()]
