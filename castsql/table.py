"""The Python front door: ``castsql.open`` gives a :class:`Table` pinned at one
version, read as Arrow, pandas, polars or a DuckDB relation.

A ``Table`` is what ``deltalake.DeltaTable`` and PyIceberg's ``Table`` are: it
stays at the version it was opened at (a new commit does not move it), and
:meth:`Table.at` gives the table at another version or timestamp (``at()``:
the newest). Reads go through the same SQL path as the shell, so a ``filter``
prunes files and row groups exactly as a ``WHERE`` does.

Example::

    >>> import castsql, tempfile, pyarrow as pa
    >>> from castsql.format import TableLog, write_data_files
    >>> from castsql.storage import open_storage
    >>> store = open_storage(tempfile.mkdtemp() + "/events")
    >>> data = pa.table({"id": pa.array(range(10), pa.int64()), "kind": ["a", "b"] * 5})
    >>> log = TableLog.create(store, data.schema, primary_key="id")
    >>> log.append(write_data_files(store, data, log.latest().schema)).version
    1
    >>> events = castsql.open(store.root)
    >>> events
    <castsql.Table events at version 1>
    >>> events.to_arrow(["id"], filter="kind = 'b' AND id < 6").column("id").to_pylist()
    [1, 3, 5]
    >>> events.at(version=0).to_arrow().num_rows
    0
    >>> events.close()
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from castsql.errors import CastSQLError, MissingExtra, TableNotFound, require
from castsql.storage import S3Config

if TYPE_CHECKING:
    import duckdb
    import pandas as pd
    import polars as pl

    from castsql.embedded.engine import Writer
    from castsql.engine import Session
    from castsql.format import Manifest
    from castsql.mirror.delta import DeltaExport
    from castsql.mirror.iceberg import IcebergExport
    from castsql.write.cdc import CdcMetrics
    from castsql.write.garbage import GCReport
    from castsql.write.merge import MergeBuilder, MergeMetrics, MergeSpec


def open(
    uri: str,
    *,
    version: int | None = None,
    timestamp: str | datetime | None = None,
    s3: S3Config | None = None,
) -> Table:
    """The table at ``uri`` (a directory or ``s3://bucket/prefix``), at
    ``version`` or the newest version committed at or before ``timestamp``
    (default: the newest version now).

    >>> castsql.open("s3://bucket/events", version=3)            # doctest: +SKIP
    <castsql.Table events at version 3>
    """
    from castsql.engine import Session

    session = Session(s3=s3)
    try:
        names = session.open(uri)
        if not names:
            raise TableNotFound(
                f"{session.uris[-1]}: no table here (an empty directory); castsql.write_table creates one"
            )
        if len(names) != 1 or session.log(names[0]).storage.root != session.uris[-1]:
            shown = ", ".join(sorted(names)[:5]) + (", …" if len(names) > 5 else "")
            first = sorted(names)[0]
            raise CastSQLError(
                f"{uri} is a warehouse of {len(names)} table{'s' * (len(names) != 1)} ({shown}): open one table "
                f"(castsql.open({uri.rstrip('/') + '/' + first!r})) or use castsql.connect({uri!r})"
            )
        return _at(session, names[0], version, timestamp)
    except BaseException:
        session.close()
        raise


WRITE_MODES = ("error", "append", "overwrite", "ignore")


def write_table(
    uri: str,
    data: Any,
    *,
    mode: str = "error",
    primary_key: str | None = None,
    merge_schema: bool = False,
    allow_duplicate_keys: bool = False,
    properties: dict[str, str] | None = None,
    s3: S3Config | None = None,
) -> Manifest | None:
    """Write Arrow, pandas or polars ``data`` to the table at ``uri``, creating
    it (with ``data``'s columns, ``primary_key`` and table ``properties``, as
    write_deltalake's ``configuration``, all in version 0) when there is none,
    in this process (no JVM); to an existing table, ``primary_key`` and
    ``properties`` must be what it has (``Table.set_properties`` changes them).
    ``mode`` says what happens when a table exists, as in
    ``deltalake.write_deltalake``: ``"error"`` (the default) refuses, ``"append"``
    adds the rows, ``"overwrite"`` replaces every row (one version; older
    versions keep theirs for time travel), ``"ignore"`` does nothing and
    returns None. Returns the manifest of the version written (a new table's
    first rows are version 1; version 0 creates it).

    >>> castsql.write_table("./warehouse/events", df, primary_key="id").version     # doctest: +SKIP
    1
    >>> castsql.write_table("./warehouse/events", more, mode="append").version      # doctest: +SKIP
    2
    """
    from castsql.errors import TableExists, TableNotFound
    from castsql.format import TableLog
    from castsql.storage import open_storage
    from castsql.write.arrow import as_arrow

    if mode not in WRITE_MODES:
        raise CastSQLError(f"{uri}: mode must be one of {', '.join(WRITE_MODES)}, not {mode!r}")
    storage = open_storage(uri, s3=s3)
    try:
        head = TableLog(storage).latest()
    except TableNotFound:
        head = None
    if head is not None:
        if mode == "error":
            raise TableExists(
                f"{storage.root}: a table exists there (version {head.version}); "
                "mode='append' adds rows to it, mode='overwrite' replaces them"
            )
        if mode == "ignore":
            return None
        if primary_key is not None and primary_key != head.primary_key:
            raise CastSQLError(f"{storage.root}: the table's primary key is {head.primary_key!r}, not {primary_key!r}")
        from castsql.format.properties import check_unchanged

        check_unchanged(head.properties, properties, storage.root)
    else:
        from castsql.format.datafiles import conform
        from castsql.write.keys import check_input_keys

        # The first write is checked whole before version 0 exists (what
        # create refuses, the type rule, the key rule), so a refused first
        # write leaves no table behind and the corrected call creates it.
        table = as_arrow(data, f"{storage.root}: write")
        schema = TableLog.check_create(storage, table.schema, primary_key=primary_key, properties=properties)
        table = conform(table, schema, f"table {storage.root}: append", primary_key=primary_key)
        if primary_key is not None and not allow_duplicate_keys:
            check_input_keys(storage.root, primary_key, table.column(primary_key))
        TableLog.create(storage, schema, primary_key=primary_key, exist_ok=True, properties=properties)
        data = table
    with open(storage.root, s3=s3) as t:
        writer = t._writer()
        m: Manifest | None
        if mode == "overwrite" and head is not None:
            m = writer.overwrite(data, merge_schema=merge_schema, allow_duplicate_keys=allow_duplicate_keys)
        else:
            m = writer.append(data, merge_schema=merge_schema, allow_duplicate_keys=allow_duplicate_keys)
        return m if m is not None else TableLog(storage).latest()


def connect(
    *uris: str,
    connection: duckdb.DuckDBPyConnection | None = None,
    s3: S3Config | None = None,
    read_only: bool = False,
) -> Session:
    """A SQL session over the tables (or warehouses) at ``uris``: every
    statement run through it reads each table's newest version and takes
    ``AS OF VERSION n`` / ``AS OF TIMESTAMP '…'``; ``DELETE``, ``UPDATE``,
    ``INSERT`` and ``MERGE INTO`` of a table commit one version each
    (docs/SHELL.md, Writing in SQL), unless ``read_only``.

    ``connection``: run on the caller's own DuckDB connection, so that its other
    tables can be joined; queries that name CastSQL tables must go through
    ``session.sql`` (it brings each table's view up to date first).

    >>> s = castsql.connect("/data/events", "/data/users")        # doctest: +SKIP
    >>> s.sql("SELECT count(*) FROM events AS OF VERSION 3 WHERE id < ?", [100])  # doctest: +SKIP
    >>> s.sql("DELETE FROM events WHERE user_id = 42").to_pylist()  # doctest: +SKIP
    [{'count': 17}]
    """
    from castsql.engine import Session

    session = Session(connection=connection, s3=s3, read_only=read_only)
    try:
        for uri in uris:
            session.open(uri)
    except BaseException:
        session.close()
        raise
    return session


def _at(session: Session, name: str, version: int | None, timestamp: str | datetime | None) -> Table:
    if version is not None and timestamp is not None:
        raise CastSQLError(f"table {name}: give a version or a timestamp, not both")
    if timestamp is not None:
        version = session.resolve_time(name, timestamp)
    # Without a version: the pointer is read now (the newest version); a
    # version that does not exist (or was collected) is refused here.
    # A Table asked for a version (or a time) stays there; writes refuse it.
    return Table(session, name, session.snapshot(name, version).version, pinned=version is not None)


def _check_one_condition(table: str, text: str) -> None:
    from castsql.engine.barrier.guard import check_one_condition

    check_one_condition(table, text)


class Table:
    """One version of one table. Made by :func:`castsql.open`."""

    def __init__(self, session: Session, name: str, version: int, *, pinned: bool = False) -> None:
        self._session = session
        self.name = name
        self.version = version  # the version this object reads
        self._pinned = pinned  # opened at a given version or time: no writes

    def __repr__(self) -> str:
        return f"<castsql.Table {self.name} at version {self.version}>"

    @property
    def uri(self) -> str:
        return self._session.log(self.name).storage.root

    @property
    def schema(self) -> pa.Schema:
        """The version's columns as an Arrow schema.

        >>> events.schema.names                                      # doctest: +SKIP
        ['id', 'ts', 'user_id', 'kind', 'amount']
        """
        return self._session.snapshot(self.name, self.version).schema.to_arrow()

    def at(self, version: int | None = None, timestamp: str | datetime | None = None) -> Table:
        """The same table at ``version``, or the newest version committed at or
        before ``timestamp``; with neither, the newest version now."""
        return _at(self._session, self.name, version, timestamp)

    def history(self) -> pa.Table:
        """One row per kept version: time, operation, files added and removed,
        rows inserted, updated (paired by primary key) and deleted.

        >>> events.history().select(["version", "rows_updated"]).to_pylist()[-1]  # doctest: +SKIP
        {'version': 7, 'rows_updated': 30}
        """
        return self._session.history(self.name)

    def changes(self, start: int | str | datetime, end: int | str | datetime | None = None) -> pa.Table:
        """Rows inserted, updated and deleted by each version from ``start`` to
        ``end``, both included (as Delta's ``table_changes``; ``end`` defaults
        to this object's version), or by the commits made between two
        timestamps. ``_change_type`` is
        ``insert``, ``delete``, ``update_preimage`` or ``update_postimage``
        (updates paired by primary key), with ``_commit_version`` and
        ``_commit_timestamp``. Reads only what those versions changed.

        >>> events.changes(5, 7).column("_change_type").to_pylist()[:2]  # doctest: +SKIP
        ['update_preimage', 'update_postimage']
        """
        return self._session.changes(self.name, start, self.version if end is None else end)

    def diff(self, other: int | str | datetime, to: int | str | datetime | None = None) -> pa.Table:
        """The rows version ``to`` (default: this object's version) holds and
        version ``other`` lacks (``insert``) and the reverse (``delete``),
        compared as values, updates paired by primary key; reads only the files
        that differ between the two versions.

        >>> events.diff(3).column("_change_type").to_pylist()  # doctest: +SKIP
        ['update_preimage', 'update_postimage', 'insert']
        """
        return self._session.diff(self.name, other, self.version if to is None else to)

    def row_history(self, key: Any, key_hi: Any = None) -> pa.Table:
        """Every change of the row whose primary key is ``key`` (or of the rows
        whose key is in [``key``, ``key_hi``]) over the kept versions up to the
        latest, as :meth:`changes` shows them. Versions whose files cannot hold
        the key (by their statistics) are not read.

        >>> customers.row_history(42).select(["_commit_version", "_change_type"]).to_pylist()  # doctest: +SKIP
        [{'_commit_version': 1, '_change_type': 'insert'}, ...]
        """
        return self._session.row_history(self.name, key, key_hi)

    # ------------------------------------------------------------------ reads

    def _query(self, columns: Sequence[str] | None, filter: str | None) -> str:
        from castsql.engine.views import ident

        if isinstance(columns, str):
            raise CastSQLError(f"table {self.name}: columns must be a list of names, not {columns!r}")
        self._session.check_columns(self.name, self._session.snapshot(self.name, self.version), columns or [])
        cols = ", ".join(ident(c) for c in columns) if columns else "*"
        q = f"SELECT {cols} FROM {ident(self.name)} AS OF VERSION {self.version}"
        if filter is not None:
            if not isinstance(filter, str) or not filter.strip():
                raise CastSQLError(f'table {self.name}: filter must be SQL text such as "id < 100", not {filter!r}')
            _check_one_condition(self.name, filter)
            q += f" WHERE ({filter}\n)"  # the newline ends a trailing -- comment inside the filter
        return q

    def to_arrow(self, columns: Sequence[str] | None = None, filter: str | None = None) -> pa.Table:
        """The live rows as an Arrow table: only ``columns`` (default all), only
        rows where the SQL condition ``filter`` holds (it prunes files and row
        groups as a ``WHERE`` does).

        >>> events.to_arrow(["id", "kind"], filter="kind = 'click' AND id < 100")  # doctest: +SKIP
        """
        return self._session.sql(self._query(columns, filter))

    def to_batches(
        self, columns: Sequence[str] | None = None, filter: str | None = None, batch_size: int = 122_880
    ) -> pa.RecordBatchReader:
        """As :meth:`to_arrow`, streamed: a ``pyarrow.RecordBatchReader``."""
        return self._session.reader(self._query(columns, filter), batch_size)

    def to_pandas(self, columns: Sequence[str] | None = None, filter: str | None = None) -> pd.DataFrame:
        """As :meth:`to_arrow`, as a pandas DataFrame (``pip install 'castsql[pandas]'``)."""
        require("pandas", "pandas", "Table.to_pandas")
        return self.to_arrow(columns, filter).to_pandas()

    def to_polars(self, columns: Sequence[str] | None = None, filter: str | None = None) -> pl.DataFrame:
        """As :meth:`to_arrow`, as a polars DataFrame (``pip install 'castsql[polars]'``)."""
        require("polars", "polars", "Table.to_polars")
        import polars

        frame = polars.from_arrow(self.to_arrow(columns, filter))
        assert isinstance(frame, polars.DataFrame)  # an Arrow table makes a frame, never a series
        return frame

    def to_duckdb(self, con: duckdb.DuckDBPyConnection | None = None) -> duckdb.DuckDBPyRelation:
        """This version as a DuckDB relation that stays at this version.

        Without ``con``: a relation of the table's own session (the version's
        view, deletes applied in the scan). With ``con``, the caller's own
        connection: a temporary view ``<name>_v<version>`` there over the
        version's Parquet files (S3 tables get an S3 secret in it), deleted
        rows dropped by position; no CastSQL catalog is attached to it.

        >>> import duckdb                                            # doctest: +SKIP
        >>> con = duckdb.connect()                                   # doctest: +SKIP
        >>> events.to_duckdb(con).aggregate("count(*)").fetchone()  # doctest: +SKIP
        """
        from castsql.engine.views import Views, ident

        if con is None:
            view = self._session.version_view(self.name, self.version)
            return self._session.con.sql(f"SELECT * FROM {ident(view)}")
        snap = self._session.snapshot(self.name, self.version)
        if "://" in snap.table_uri:
            from castsql.engine.duckdb.stores import make_readable

            storage = self._session.log(self.name).storage
            make_readable(con, storage, self._session.s3_config(storage))
        name = f"{self.name}_v{self.version}"
        Views(con, self._session._workdir).create(name, snap, lake=False)
        return con.sql(f"SELECT * FROM {ident(name)}")

    # ------------------------------------------------------------------ writes (embedded engine, no Spark)

    def _writer(self) -> Writer:
        from castsql.embedded.engine import Writer

        if self._pinned:
            raise CastSQLError(
                f"table {self.name} is pinned at version {self.version}; writes go to the newest version: "
                f"castsql.open({self.uri!r})"
            )
        return Writer(self._session, self.name)

    @property
    def properties(self) -> dict[str, str]:
        """The table properties of this version (:mod:`castsql.format.properties`).

        >>> events.properties                                         # doctest: +SKIP
        {'castsql.autoCompact': 'true'}
        """
        return dict(self._session.snapshot(self.name, self.version).manifest.properties)

    def set_properties(self, properties: dict[str, str | None]) -> Manifest | None:
        """Set table properties (None removes one) as one version (operation
        ``SET PROPERTIES``); None when nothing changes. ``castsql.*`` names are
        checked (:mod:`castsql.format.properties`); others are kept as given.

        >>> events.set_properties({"castsql.autoCompact": "true"}).version  # doctest: +SKIP
        7
        """
        self._writer()  # refuses a pinned table
        m = self._session.log(self.name).set_properties(properties)
        self._moved(m.version if m is not None else None)
        return m

    def _wrote(self, version: int | None) -> None:
        """After a data write committed ``version``: as :meth:`_moved` (the
        automatic compaction and the mirrors ran in the commit itself)."""
        self._moved(version)

    def _moved(self, version: int | None) -> None:
        """After this object committed ``version``: read it from now on (like
        deltalake's DeltaTable), or the version the after-commit point committed
        right after it (castsql.commits: an automatic compaction). The mirrors
        and the compaction ran in the commit itself."""
        if version is not None:
            self.version = self._session.log(self.name).followed(version)

    def append(self, data: Any, *, merge_schema: bool = False, allow_duplicate_keys: bool = False) -> Manifest | None:
        """Append Arrow, pandas or polars ``data`` (the table's columns; input
        types every value of which the column's type holds exactly are cast, any
        other is refused naming the column and both types) as one version;
        returns its manifest, or None when ``data`` has no rows. This object then
        reads the new version. Table columns ``data`` lacks are stored as NULL
        (Delta's rule); a missing primary-key column is refused.

        ``merge_schema=True``: columns the table lacks are added (nullable, at
        the end) and columns whose input type is an allowed widening are
        widened, in the same version. A table with a primary key refuses rows
        whose key is NULL, repeated in ``data`` or already in the table, unless
        ``allow_duplicate_keys=True``.

        >>> events.append(pa.table({"id": [10, 11], "kind": ["a", "b"]})).version   # doctest: +SKIP
        2
        """
        m = self._writer().append(data, merge_schema=merge_schema, allow_duplicate_keys=allow_duplicate_keys)
        self._wrote(m.version if m is not None else None)
        return m

    def add_columns(self, columns: dict[str, Any]) -> Manifest | None:
        """Add nullable columns at the end (name -> type: ``"int64"``, ``"BIGINT"``,
        ``"decimal128(10, 2)"`` or an Arrow type) as one version (operation
        ``ALTER``, no file rewritten: older rows read NULL there); returns its
        manifest.

        >>> events.add_columns({"country": "string"}).version          # doctest: +SKIP
        3
        """
        self._writer()  # refuses a pinned table
        m = self._session.log(self.name).alter(add=columns)
        self._moved(m.version if m is not None else None)
        return m

    def widen_columns(self, columns: dict[str, Any]) -> Manifest | None:
        """Widen column types (name -> wider type) as one version, without
        rewriting files: int8 → int16 → int32 → int64, float → double, decimal
        precision up with the same scale, date32[day] → timestamp[us]. Anything
        else (a rename, a drop, a narrowing) is refused naming the column and both
        types. Returns the manifest, or None when the types already are those.

        >>> events.widen_columns({"user_id": "int64"}).version            # doctest: +SKIP
        4
        """
        self._writer()
        m = self._session.log(self.name).alter(widen=columns)
        self._moved(m.version if m is not None else None)
        return m

    def compact(
        self,
        *,
        threshold: float = 0.5,
        target_file_size: int | None = None,
        row_group_size: int | None = None,
        sort_by: str | None = None,
    ) -> Manifest | None:
        """Compact the newest version in this process (no JVM), one ``COMPACT``
        version that changes no query's result: small data files packed into
        files of ``target_file_size`` bytes (default 256 MB) with row groups of
        ``row_group_size`` rows (default 122,880), files whose deleted fraction
        is at least ``threshold`` rewritten without their deleted rows,
        tombstone files folded; ``sort_by`` orders each new file by a column
        (event time: min/max pruning then skips the files a range cannot
        reach). A concurrent write makes it plan again; nothing is lost. None
        when there is nothing to do. Old versions keep their files for time
        travel until ``castsql gc``.

        >>> events.compact(sort_by="ts").summary["removed_files"]          # doctest: +SKIP
        301
        """
        from castsql.embedded.compactor import compact
        from castsql.format.datafiles import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES

        self._writer()  # refuses a pinned table
        m = compact(
            self._session,
            self.name,
            threshold=threshold,
            target_file_bytes=target_file_size or DEFAULT_TARGET_FILE_BYTES,
            row_group_size=row_group_size or DEFAULT_ROW_GROUP_SIZE,
            sort_by=sort_by,
        )
        self._moved(m.version if m is not None else None)
        return m

    def gc(
        self,
        *,
        keep_versions: int | None = None,
        older_than: timedelta | None = None,
        grace: timedelta = timedelta(days=7),
        dry_run: bool = False,
    ) -> GCReport:
        """Drop old versions and the files only they need, in this process (no
        JVM): Delta's ``VACUUM`` with snapshot expiry. Keeps the latest version,
        the last ``keep_versions``, every version younger than ``older_than``
        (with neither, every version: only orphans go), and anything younger
        than ``grace``; ``dry_run`` deletes nothing. Time travel to a dropped
        version is refused afterwards. The rules are
        :mod:`castsql.write.garbage`'s, as for ``castsql gc``.

        >>> print(events.gc(keep_versions=10, dry_run=True).summary())     # doctest: +SKIP
        would drop versions 0-31 (32 manifests), 30 data files, 12 tombstone files, 0 orphans: 4.1 MB
        """
        from castsql.write.garbage import gc

        self._writer()  # refuses a pinned table
        return gc(
            self._session.log(self.name).storage,
            keep_versions=keep_versions,
            older_than=older_than,
            grace=grace,
            dry_run=dry_run,
        )

    def export_delta(self, version: int | None = None) -> DeltaExport:
        """Mirror this table's versions as a Delta log next to it (``_delta_log/``,
        Delta version N = CastSQL version N) up to ``version`` (default: the
        newest), over the table's own Parquet files: deletes become deletion
        vectors, nothing is copied. Only versions not mirrored yet are written.
        DuckDB's ``delta_scan``, deltalake and polars then read the table
        (docs/OTHER_ENGINES.md).

        >>> events.export_delta().latest                                  # doctest: +SKIP
        12
        """
        from castsql.mirror.delta import export_delta

        log = self._session.log(self.name)
        return export_delta(log, self.version if version is None and self._pinned else version)

    def export_iceberg(self, version: int | None = None) -> IcebergExport:
        """Mirror this table's versions as Iceberg metadata next to it
        (``_iceberg/metadata/``, snapshot id N = CastSQL version N) up to
        ``version`` (default: the newest), over the table's own Parquet files:
        deletes become position delete files. Needs ``castsql[iceberg]``
        (PyIceberg). DuckDB's ``iceberg_scan`` and PyIceberg's ``StaticTable``
        then read it (docs/OTHER_ENGINES.md).

        >>> events.export_iceberg().latest                                # doctest: +SKIP
        12
        """
        from castsql.mirror.iceberg import export_iceberg

        log = self._session.log(self.name)
        return export_iceberg(log, self.version if version is None and self._pinned else version)

    def delete(self, where: str) -> Manifest | None:
        """Delete the rows where the SQL condition ``where`` holds: one
        tombstone, one version (no data file rewritten); None when no row
        matches. ``"true"`` deletes every row.

        >>> events.delete("kind = 'test' AND id < 100").summary["deleted_rows"]     # doctest: +SKIP
        12
        """
        m = self._writer().delete(where)
        self._wrote(m.version if m is not None else None)
        return m

    def update(self, set: dict[str, str], where: str | None = None, *, merge_schema: bool = False) -> Manifest | None:
        """Set columns to SQL expressions over the row, where ``where`` holds
        (every row without it): the old rows tombstoned and the new ones
        appended in one version; None when no row matches.

        ``merge_schema=True``: a ``set`` column the table lacks is added (of the
        expression's type: ``CAST(… AS BIGINT)`` to choose it; rows not updated
        read NULL) and a column whose expression's type is an allowed widening
        is widened, in the same version.

        >>> events.update(set={"amount": "amount * 2"}, where="kind = 'x'").summary["updated_rows"]  # doctest: +SKIP
        40
        """
        m = self._writer().update(set, where, merge_schema=merge_schema)
        self._wrote(m.version if m is not None else None)
        return m

    def merge(
        self,
        source: Any,
        on: str | Sequence[str],
        *,
        source_alias: str = "source",
        target_alias: str = "target",
        merge_schema: bool = False,
        allow_duplicate_keys: bool = False,
    ) -> MergeBuilder:
        """Merge ``source`` (Arrow, pandas or polars) into the table, with Delta
        Lake's semantics: ``on`` is the key column(s) (``"id"``, ``["id", "day"]``)
        or a predicate over ``target`` and ``source``; add clauses, then
        ``execute()`` commits one version and returns :class:`castsql.write.merge.MergeMetrics`.
        ``merge_schema=True`` adds the source's new columns (and widens) in that
        version; inserted rows with a NULL or repeated primary key are refused
        unless ``allow_duplicate_keys=True``.

        >>> (events.merge(changes, on="id")                          # doctest: +SKIP
        ...     .when_matched_update_all()
        ...     .when_not_matched_insert_all()
        ...     .execute()).num_target_rows_updated
        5000
        """
        from castsql.write.merge import MergeBuilder

        writer = self._writer()

        def run(spec: MergeSpec, src: Any) -> MergeMetrics:
            metrics = writer.merge(spec, src, merge_schema=merge_schema, allow_duplicate_keys=allow_duplicate_keys)
            self._wrote(metrics.version)
            return metrics

        return MergeBuilder(self.name, source, on, run, source_alias=source_alias, target_alias=target_alias)

    def apply_cdc(
        self,
        batch: Any,
        *,
        key: str | Sequence[str],
        op_column: str | None = None,
        sequence: str | Sequence[str] | None = None,
        delete_values: Sequence[str] | None = None,
        upsert_values: Sequence[str] | None = None,
        partial: bool | None = None,
        unavailable: str | None = None,
        app_id: str | None = None,
        batch_id: int | None = None,
        merge_schema: bool = False,
        format: str = "rows",
    ) -> CdcMetrics:
        """Apply a batch of change data capture (Arrow, pandas or polars: the
        table's columns plus ``op_column``) as one version, delivered in any
        order and any number of times (:mod:`castsql.write.cdc`).

        ``sequence`` (one column or several, compared in order) orders each
        key's changes across batches: a change applies only if it is later
        than the last one the table applied to its key, a delete included
        (delete markers are kept for ``castsql.cdc.deleteRetention``), so a
        late or replayed batch never rolls a row back or brings a deleted key
        back; ties: a delete wins, then the greater values. Operations
        (``op_column``, any case): upserts ``i u c r insert update upsert``,
        deletes ``d delete`` (or ``upsert_values`` / ``delete_values``);
        any other value is refused. The sequence
        columns are stored (table columns, or ``merge_schema=True`` adds
        them); the operation column is not. ``partial=True``: columns the
        batch lacks keep their stored values (Debezium's default); ``unavailable``: a text that
        means "unchanged" (Debezium's ``castsql.write.cdc.DEBEZIUM_UNAVAILABLE``).
        ``app_id`` and ``batch_id``: the batch's name (Delta's ``txnAppId`` /
        ``txnVersion``); a batch id at or below the last one the table
        committed for ``app_id`` commits nothing (``batch_replayed``).

        ``format="debezium"``: ``batch`` is Debezium change events (a
        JSON-lines file, a list of events, or an Arrow table of ``op``,
        ``before``, ``after``, ``source``): the operation, the sequence (from
        ``source``: ``lsn``, the binlog position, …) and ``unavailable`` come
        from the envelope (:mod:`castsql.write.debezium`).

        >>> m = events.apply_cdc(batch, key="id", op_column="op", sequence="lsn")   # doctest: +SKIP
        >>> m.num_changes_applied, m.num_changes_stale, m.version                     # doctest: +SKIP
        (38, 2, 12)
        >>> events.apply_cdc("orders.jsonl", key="id", format="debezium", merge_schema=True)  # doctest: +SKIP
        """
        from castsql.write.cdc import Cdc, batch_of, debezium_defaults

        schema = self.schema if format == "debezium" else None  # typing the events' values
        batch, op_column, sequence, unavailable, partial = debezium_defaults(
            f"table {self.name}: cdc", format, batch, op_column, sequence, unavailable, schema, partial
        )
        cdc = Cdc.of(key, op_column, sequence, delete_values, upsert_values, partial, unavailable)
        stream = batch_of(f"table {self.name}: cdc", app_id, batch_id)
        metrics = self._writer().apply_cdc(cdc, batch, merge_schema=merge_schema, stream=stream)
        self._wrote(metrics.version)
        return metrics

    def close(self) -> None:
        """Close the session behind this table (and every Table made from it by ``at``)."""
        self._session.close()

    def __enter__(self) -> Table:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["MissingExtra", "Table", "connect", "open", "write_table"]
