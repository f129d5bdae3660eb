"""``spark.read.format("castsql")`` and ``df.write.format("castsql")`` as a
Python data source (PySpark ≥ 4.0's ``pyspark.sql.datasource``): what
:func:`castsql.spark.register` registers where the JVM data source
(:mod:`castsql.spark.bridge`, rows never leaving the JVM) is not built. The
option checks, write planning and commit here serve both.

Registered, it reads and writes as::

    spark.read.format("castsql").option("versionAsOf", 3).load("s3://bucket/events")
    spark.read.format("castsql").option("timestampAsOf", "2025-06-01T00:00:00Z").load(uri)
    df.write.format("castsql").mode("append").option("primaryKey", "id").save(uri)
    df.write.format("castsql").mode("append").option("mergeSchema", "true").save(uri)

Reading: the version is resolved when the DataFrame is made (``load``), so
later commits do not change it. The version's live row groups are cut into
input partitions of whole files or groups of row groups; the workers read
them with :func:`castsql.spark.tasks.live_row_groups` (tombstones applied,
fully deleted row groups never opened) and hand Spark Arrow batches. Filters
pushed by Spark (``spark.sql.python.filterPushdown.enabled``) are left to
Spark: see PRUNE_PUSHED_FILTERS for why PySpark 4.1.1 makes pruning by them
unsafe.

Writing: every task attempt writes its own data files (fresh names) and sends
their manifest entries to the driver in its commit message; the driver's
``commit`` puts exactly those entries in one new version. Files of failed or
denied attempts are in no commit message and so in no version: they are
orphans for :func:`castsql.spark.gc`.

Nothing here runs on import of :mod:`castsql.spark`; this module imports
pyspark.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyroaring import BitMap
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    EqualNullSafe,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from castsql.errors import CommitConflict
from castsql.format import Schema, TableLog
from castsql.format.manifest import added_summary, json_stat, parse_time
from castsql.snapshot import Predicate, Snapshot, resolve
from castsql.snapshot.prune import may_match
from castsql.spark.errors import BadOption
from castsql.spark.tasks import TableRef, Unit, _for_spark, live_row_groups, open_parquet
from castsql.spark.types import spark_schema
from castsql.spark.units import Splits
from castsql.storage import S3Config, Storage, open_storage
from castsql.write.pipeline import last_batch

NAME = "castsql"

# Options (Spark hands them over case-insensitively).
READ_OPTIONS = ("path", "versionAsOf", "timestampAsOf")
WRITE_OPTIONS = (
    "path", "primaryKey", "mergeSchema", "allowDuplicateKeys", "rowGroupSize", "targetFileBytes", "queryId",
    "txnAppId", "txnVersion",
)  # fmt: skip
S3_OPTIONS = {
    "s3.endpoint": "endpoint_url",
    "s3.accessKeyId": "key",
    "s3.secretAccessKey": "secret",
    "s3.sessionToken": "session_token",
    "s3.region": "region",
}
# Set by Spark itself on some paths (__streamQueryId: by the JVM source); never the user's typo.
SPARK_OPTIONS = ("paths", "checkpointLocation", "queryName", "__partition_columns", "__streamQueryId")
KNOWN = {o.lower() for o in (*READ_OPTIONS, *WRITE_OPTIONS, *S3_OPTIONS, *SPARK_OPTIONS)}


# ---------------------------------------------------------------------- options


def _get(options: Any, name: str) -> str | None:
    for k, v in options.items():
        if k.lower() == name.lower():
            return v
    return None


def _check_known(options: Any) -> None:
    for k in options:
        if k.lower() not in KNOWN:
            names = ", ".join((*READ_OPTIONS[1:], *WRITE_OPTIONS[1:], *S3_OPTIONS))
            raise BadOption(f"format('castsql'): unknown option {k!r} (known: {names})")


def option_spelling(text: str) -> str:
    """An error of the writers every interface shares, with its remedies
    spelled as ``format("castsql")``'s options rather than Python's keywords
    and the CLI's flags."""
    text = text.replace("allow_duplicate_keys=True / --allow-duplicate-keys", "option allowDuplicateKeys=true")
    return text.replace("merge_schema=True (--merge-schema)", "option mergeSchema=true")


def _path(options: Any) -> str:
    path = _get(options, "path")
    if not path:
        raise BadOption(
            "format('castsql'): no table path: use .load(uri) / .save(uri) or .option('path', uri) "
            "(one table: Spark hands a source none of the paths of a load of several)"
        )
    return path


def _int_option(options: Any, name: str, minimum: int = 0) -> int | None:
    raw = _get(options, name)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BadOption(f"format('castsql'): option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise BadOption(f"format('castsql'): option {name} must be at least {minimum}, got {raw!r}")
    return value


def _bool_option(options: Any, name: str) -> bool:
    raw = _get(options, name)
    if raw is None:
        return False
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise BadOption(f"format('castsql'): option {name} must be true or false, got {raw!r}")
    return value == "true"


def s3_config(options: Any) -> S3Config | None:
    """S3 settings from the ``s3.*`` options, falling back to the AWS
    environment variables; None when none is given (then storage reads the
    environment of whichever process opens it)."""
    given = {field: _get(options, opt) for opt, field in S3_OPTIONS.items()}
    if all(v is None for v in given.values()):
        return None
    base = S3Config.from_env()
    return S3Config(
        endpoint_url=given["endpoint_url"] or base.endpoint_url,
        key=given["key"] or base.key,
        secret=given["secret"] or base.secret,
        session_token=given["session_token"] or base.session_token,
        region=given["region"] or base.region,
        connect_timeout=base.connect_timeout,
        read_timeout=base.read_timeout,
        max_attempts=base.max_attempts,
    )


def version_at_time(log: TableLog, when: str | datetime) -> int:
    """The newest version committed at or before ``when``, as Delta's
    ``timestampAsOf``: a time after the latest commit or before the oldest
    kept version is an error naming both times."""
    if isinstance(when, str):
        try:
            t = parse_time(when.strip())
        except ValueError:
            raise BadOption(
                f"timestampAsOf: {when!r} is not a timestamp (use ISO-8601, e.g. 2025-06-01T12:00:00Z)"
            ) from None
    else:
        t = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    latest = log.latest()
    if t > latest.created_at:
        raise BadOption(
            f"{log.storage.root}: timestampAsOf {_iso(t)} is after the latest version {latest.version} "
            f"(committed at {_iso(latest.created_at)}); use a time at or before it"
        )
    versions = log.versions()
    oldest = log.manifest(versions[0]) if versions else latest
    if t < oldest.created_at:
        raise BadOption(
            f"{log.storage.root}: timestampAsOf {_iso(t)} is before the oldest kept version {oldest.version} "
            f"(committed at {_iso(oldest.created_at)}); use a time at or after it"
        )
    return log.version_at(t)


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def resolve_read(log: TableLog, version: int | None, timestamp: str | datetime | None, where: str = "read") -> Snapshot:
    """The snapshot of ``version`` or of ``timestamp`` (not both), else the latest."""
    if version is not None and timestamp is not None:
        raise BadOption(f"{where}: give versionAsOf or timestampAsOf, not both")
    if timestamp is not None:
        version = version_at_time(log, timestamp)
    return resolve(log, version)


# ---------------------------------------------------------------------- pushdown

_OPS = {
    EqualTo: "=",
    EqualNullSafe: "=",
    GreaterThan: ">",
    GreaterThanOrEqual: ">=",
    LessThan: "<",
    LessThanOrEqual: "<=",
}
_Compared = EqualTo | EqualNullSafe | GreaterThan | GreaterThanOrEqual | LessThan | LessThanOrEqual


def _column(schema: Schema, attribute: tuple[str, ...]) -> Any:
    if len(attribute) != 1:
        return None
    name = attribute[0]
    col = schema.column(name)
    if col is None:
        col = next((c for c in schema.columns if c.name.lower() == name.lower()), None)
    return col


def _prunable(type_name: str, value: Any) -> Any:
    """``value`` as a statistic of a column of ``type_name`` can be compared
    with, or None when pruning on it could be wrong (floats: Spark orders NaN
    above everything, statistics leave it out; decimals and booleans: JSON
    statistics do not order them exactly)."""
    t = type_name
    if value is None or isinstance(value, bool | float | Decimal | bytes | bytearray):
        return None
    if t.startswith(("int", "uint")) and isinstance(value, int):
        return value
    if t in ("string", "large_string") and isinstance(value, str):
        return value
    if t.startswith("date") and isinstance(value, date) and not isinstance(value, datetime):
        return value
    if t.startswith("timestamp") and isinstance(value, datetime):
        zoned = "tz=" in t
        if zoned and value.tzinfo is None:
            return None  # a wall-clock time in some zone: no instant to compare with
        if not zoned and value.tzinfo is not None:
            return None
        return value.astimezone(UTC) if zoned else value
    return None


def predicates(schema: Schema, filters: Sequence[Filter]) -> list[Predicate]:
    """The pruning predicates implied by Spark's pushed filters (a subset:
    whatever cannot be used safely is left to Spark alone)."""
    out: list[Predicate] = []
    for f in filters:
        if not isinstance(f, _Compared | In):
            continue  # Not, IsNull, string matches: nothing min/max statistics can prune by
        col = _column(schema, f.attribute)
        if col is None:
            continue
        if type(f) in _OPS:
            v = _prunable(col.type, f.value)
            if v is not None:
                out.append(Predicate(col.name, _OPS[type(f)], v))
        elif isinstance(f, In):
            vals = [_prunable(col.type, v) for v in f.value]
            if vals and all(v is not None for v in vals):
                with contextlib.suppress(TypeError):
                    out += [Predicate(col.name, ">=", min(vals)), Predicate(col.name, "<=", max(vals))]
    return out


@dataclass
class _Stats:
    min: dict[str, Any]
    max: dict[str, Any]


def row_group_may_match(pf: Any, rg: int, preds: list[Predicate], types: dict[str, str]) -> bool:
    """Whether row group ``rg``'s footer statistics allow a row matching every predicate."""
    md = pf.metadata.row_group(rg)
    index = {md.column(i).path_in_schema: i for i in range(md.num_columns)}
    lo: dict[str, Any] = {}
    hi: dict[str, Any] = {}
    for p in preds:
        i = index.get(p.column)
        if i is None or p.column in lo:
            continue
        st = md.column(i).statistics
        if st is None or not st.has_min_max:
            continue
        a, b = json_stat(st.min), json_stat(st.max)
        if a is not None and b is not None:
            lo[p.column], hi[p.column] = a, b
    return may_match(_Stats(lo, hi), preds, types)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- reading


class CastSQLPartition(InputPartition):
    """Units (a file's row groups, their deletes) read by one Spark task, as JSON."""

    def __init__(self, units: list[str]) -> None:
        super().__init__(units)
        self.units = units


def _rows(u: Unit) -> int:
    return sum(n for _, _, n in u.row_groups)


def plan_partitions(units: list[Unit], rows_per_partition: int) -> list[list[Unit]]:
    """Row-group units grouped into partitions of about ``rows_per_partition``
    rows: each file's row groups are cut into that many near-equal runs of
    consecutive row groups (a 10M-row file at 5M rows a partition is two
    halves, not 5M + 5M + a sliver of a row group), and files smaller than
    that share a partition."""
    files: list[Unit] = []
    for u in units:
        last = files[-1] if files else None
        if last is not None and last.key == u.key:
            last.row_groups.extend(u.row_groups)
            last.deleted |= u.deleted
        else:
            files.append(Unit(u.key, u.size, list(u.row_groups), u.deleted.copy(), list(u.ranges)))
    runs: list[Unit] = []
    for f in files:
        rows = _rows(f)
        count = max(1, round(rows / rows_per_partition))
        cut: list[list[tuple[int, int, int]]] = [[] for _ in range(count)]
        seen = 0
        for rg in f.row_groups:
            cut[min(count - 1, seen * count // max(1, rows))].append(rg)
            seen += rg[2]
        for rgs in cut:
            if rgs:
                lo, hi = rgs[0][1], rgs[-1][1] + rgs[-1][2]
                dels = f.deleted & BitMap(range(lo, hi)) if f.deleted else BitMap()
                runs.append(Unit(f.key, f.size, rgs, dels, list(f.ranges)))
    parts: list[list[Unit]] = []
    size = 0
    for u in runs:
        rows = _rows(u)
        if parts and size + rows <= rows_per_partition:
            parts[-1].append(u)
            size += rows
        else:
            parts.append([u])
            size = rows
    return parts


class CastSQLReader(DataSourceReader):
    """Reads one pinned version; without filter pushdown (Spark refuses a
    reader that implements ``pushFilters`` while the setting is off)."""

    def __init__(self, ref: TableRef, version: int, columns: list[str], splits: Splits) -> None:
        self.ref = ref
        self.version = version
        self.columns = columns
        self.splits = splits
        self.preds: list[Predicate] = []

    def partitions(self) -> list[InputPartition]:
        from castsql.spark.units import row_group_units

        storage = self.ref.storage()
        log = TableLog(storage)
        snap = resolve(log, self.version)
        if self.preds:
            snap = snap.prune(self.preds)
        units = row_group_units(log, snap)
        parts = plan_partitions(units, self.splits.for_units(units))
        return [CastSQLPartition([u.to_json() for u in p]) for p in parts]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        storage = self.ref.storage()
        types = {c.name: c.type for c in self.ref.schema.columns}
        # An empty version has no partitions; Spark then reads one ``None``.
        for s in partition.units if partition is not None else []:  # type: ignore[attr-defined]
            unit = Unit.from_json(s)
            if self.preds:
                pf = open_parquet(storage, unit.key, unit.size)
                unit.row_groups = [rg for rg in unit.row_groups if row_group_may_match(pf, rg[0], self.preds, types)]
            for _, t, _ in live_row_groups(self.ref, unit, self.columns, storage):
                if t.num_rows:
                    yield from _for_spark(t).to_batches()


# PySpark 4.1.1 keeps the partitions and read function planned for one
# query's pushed filters (PythonDataSourceV2.setReadInfo) and reuses them for
# the next query of the same DataFrame or view that has no filter to push
# (``df.where("id = 7").count()`` then ``df.count()``): rows pruned for the
# first query would be missing from the second. So pushed filters prune
# nothing until Spark plans each query afresh; the machinery below is kept,
# tested directly, and switched on here.
PRUNE_PUSHED_FILTERS = False


class CastSQLPushdownReader(CastSQLReader):
    """A reader that takes Spark's pushed filters: they prune files (manifest
    statistics) and row groups (footer statistics). All of them are handed
    back to Spark, which still evaluates them on the rows: pruning is never
    trusted for the answer. Used only with PRUNE_PUSHED_FILTERS (see there)."""

    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        self.preds = predicates(self.ref.schema, filters)
        yield from filters


def _pushdown_planning() -> bool:
    """Whether Spark is asking for a reader in its filter-pushdown planner
    (``pyspark.sql.worker.data_source_pushdown_filters``), which runs only
    while the setting is on; the plain planner refuses a reader that
    implements ``pushFilters``."""
    import sys

    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


# ---------------------------------------------------------------------- writing


@dataclass
class FilesWritten(WriterCommitMessage):
    """What one task attempt wrote: manifest entries as JSON."""

    entries: list[str]


@dataclass(frozen=True)
class WritePlan:
    """What every task of a write needs, decided on the driver when the write is planned."""

    ref: TableRef
    row_group_size: int
    target_file_bytes: int
    overwrite: bool
    primary_key: str | None
    exists: bool
    # mergeSchema: the schema this write gives the table (None: the table's stays).
    new_schema: Schema | None = None
    # allowDuplicateKeys: commit rows whose primary key is NULL, repeated or already live.
    allow_duplicate_keys: bool = False
    # txnAppId / txnVersion (Delta's idempotent writes): the batch's name, and
    # whether the table had it already when the write was planned (then no task writes).
    txn: tuple[str, int] | None = None
    replayed: bool = False


def _plan_write(options: Any, spark_struct: StructType, overwrite: bool) -> WritePlan:
    from castsql.errors import SchemaMismatch, TableNotFound
    from castsql.format.datafiles import DEFAULT_ROW_GROUP_SIZE, DEFAULT_TARGET_FILE_BYTES
    from castsql.spark.types import schema_from_spark

    _check_known(options)
    uri = _path(options)
    if _get(options, "versionAsOf") is not None or _get(options, "timestampAsOf") is not None:
        raise BadOption("format('castsql'): versionAsOf and timestampAsOf are read options; a write adds a version")
    pk = _get(options, "primaryKey") or None
    rgs = _int_option(options, "rowGroupSize", 1) or DEFAULT_ROW_GROUP_SIZE
    tfb = _int_option(options, "targetFileBytes", 1) or DEFAULT_TARGET_FILE_BYTES
    merge_schema = _bool_option(options, "mergeSchema")
    allow_dupes = _bool_option(options, "allowDuplicateKeys")
    storage = open_storage(uri, s3=s3_config(options))
    schema = schema_from_spark(spark_struct)
    if pk is not None and schema.column(pk) is None:
        # Spark names columns without case, and a schema holds no two names equal but
        # for case, so option("primaryKey", "ID") can only mean column id.
        pk = next((n for n in schema.names if n.lower() == pk.lower()), pk)
    if pk is not None and schema.column(pk) is None:
        raise SchemaMismatch(f"{storage.root}: primaryKey {pk!r} is not a column of the data {schema.names}")
    try:
        current = TableLog(storage).latest()
    except TableNotFound:
        current = None
    new_schema = None
    if current is not None:
        if pk is not None and pk.lower() != (current.primary_key or "").lower():
            raise SchemaMismatch(f"{storage.root}: the table's primary key is {current.primary_key!r}, not {pk!r}")
        target = current.schema
        if merge_schema:  # new columns added, allowed widenings made, in this version (FORMAT.md §3.4)
            from castsql.format.evolution import merged

            where = f"table {storage.root}: write with mergeSchema"
            target = merged(current.schema, schema.to_arrow(), where, current.primary_key)
            new_schema = target if target != current.schema else None
        _check_schema(storage.root, target, schema, current.primary_key)
        schema, pk = target, current.primary_key  # the files take the table's column order and types
    ref = TableRef(storage.root, getattr(storage, "config", None), schema.to_json(), pk)
    txn = _txn(options)
    replayed = txn is not None and current is not None and last_batch(TableLog(storage), *txn) >= txn[1]
    return WritePlan(ref, rgs, tfb, overwrite, pk, current is not None, new_schema, allow_dupes, txn, replayed)


def _txn(options: Any) -> tuple[str, int] | None:
    """Delta's ``txnAppId`` and ``txnVersion`` options: a batch write's name (both, or neither)."""
    app, version = _get(options, "txnAppId"), _int_option(options, "txnVersion")
    if (app is None) != (version is None):
        raise BadOption("format('castsql'): give txnAppId and txnVersion together (a batch's name), or neither")
    if app is None or version is None:
        return None
    if not app.strip():
        raise BadOption("format('castsql'): txnAppId must not be empty")
    return app, version


def _check_schema(root: str, table: Schema, data: Schema, primary_key: str | None = None) -> None:
    """The data's columns must be the table's, of types that fit them: one line
    naming the first difference. A table column the data lacks is written as
    NULL (FORMAT.md §3.4, Delta's rule), except the primary key."""
    from castsql.errors import SchemaMismatch

    have = {c.name: c.type for c in data.columns}
    for c in table.columns:
        if c.name not in have and c.name == primary_key:
            raise SchemaMismatch(
                f"{root}: the data has no column {c.name} ({c.type}), the table's primary key (every row needs "
                "its key; other missing columns are stored as NULL); nothing was written"
            )
    for c in data.columns:
        want = table.column(c.name)
        if want is None:
            raise SchemaMismatch(
                f"{root}: column {c.name} ({c.type}) is not in the table {table.names} "
                "(option mergeSchema=true adds it)"
            )
    # The one type rule of every writer (castsql.format.evolution.fits): lossless widenings only.
    from castsql.format.evolution import fits, refusal

    have_types, want_types = data.to_arrow(), table.to_arrow()
    for f in want_types:
        if f.name not in have:
            continue  # written as NULL
        src = have_types.field(f.name).type
        if not fits(src, f.type):
            text = str(refusal(f"{root}: written data", f.name, src, f.type))
            raise SchemaMismatch(option_spelling(text))


def write_attempt(plan: WritePlan, batches: Iterator[pa.RecordBatch]) -> FilesWritten:
    """One task attempt: its batches into new data files (names of its own), their entries out."""
    from castsql.format import write_data_files

    if plan.replayed:
        return FilesWritten([])  # the table has this txnVersion already: nothing to write

    files = write_data_files(
        plan.ref.storage(),
        batches,
        plan.ref.schema,
        row_group_size=plan.row_group_size,
        target_file_bytes=plan.target_file_bytes,
        fill_missing=True,  # table columns the data lacks (checked at planning: never the primary key)
    )
    return FilesWritten([json.dumps(f.to_json()) for f in files])


def commit_files(
    plan: WritePlan,
    messages: Sequence[WriterCommitMessage | None],
    summary: dict[str, Any] | None = None,
) -> Any:
    """The driver's commit: one version with exactly the files named in ``messages``
    (an overwrite also removes every file and tombstone of the version it replaces)."""
    from castsql.format import DataFile

    storage = plan.ref.storage()
    files = tuple(
        DataFile.from_json(json.loads(e), "castsql write task")
        for m in messages
        if isinstance(m, FilesWritten)
        for e in m.entries
    )
    from castsql.spark.appends import commit_unique, discard_files, written_keys
    from castsql.write.keys import DuplicateKey, check_input_keys

    keys = None
    if not plan.exists and plan.primary_key is not None and files and not plan.allow_duplicate_keys:
        # A first write's keys are checked before version 0 exists: refused,
        # it leaves no table behind (SPARK.md), and the same write can be retried.
        keys = written_keys(TableLog(storage), list(files), plan.primary_key, plan.ref.schema)
        try:
            check_input_keys(storage.root, plan.primary_key, keys, "overwrite" if plan.overwrite else "append")
        except DuplicateKey:
            discard_files(TableLog(storage), list(files))
            raise
    log = _open_or_create(storage, plan)
    summary = dict(summary or {})
    summary.update(added_summary(files))
    pk = log.latest().primary_key
    if pk != plan.primary_key:
        keys = None  # another writer created the table meanwhile, with its own key
    if pk is not None and files and not plan.allow_duplicate_keys:
        # The keys rule of every writer (castsql.write.keys), on the keys read
        # back from exactly the files this commit names; refused files are removed.
        try:
            if not plan.overwrite:
                return commit_unique(log, list(files), plan.ref.schema, plan.new_schema, summary, pk, keys=keys)
            if keys is None:
                keys = written_keys(log, list(files), pk, plan.ref.schema)
            check_input_keys(storage.root, pk, keys, "overwrite")
        except (DuplicateKey, CommitConflict):
            discard_files(log, list(files))
            raise
    if not plan.overwrite:
        if not files and not summary.get("stream_query"):
            return log.latest()
        from castsql.write import pipeline

        return pipeline.append(log, storage.root, files, schema=plan.ref.schema, new_schema=plan.new_schema,
                               summary=summary)  # fmt: skip
    from castsql.write.commit import commit_overwrite

    return commit_overwrite(log, files, schema=plan.ref.schema, new_schema=plan.new_schema, summary=summary)


def commit_write(plan: WritePlan, messages: Sequence[WriterCommitMessage | None]) -> None:
    """A batch write's commit. With ``txnAppId``/``txnVersion`` (Delta's
    idempotent writes) it is recorded as that app's batch, and a batch the
    table already holds (planned as such, or committed since by a retried
    job) commits nothing: its files, if any, stay orphans for GC."""
    txn = plan.txn
    if txn is None:
        commit_files(plan, messages)
        return
    if plan.replayed or (plan.exists and last_batch(TableLog(plan.ref.storage()), *txn) >= txn[1]):
        return
    commit_files(plan, messages, {"stream_query": txn[0], "stream_batch": txn[1]})


def _open_or_create(storage: Storage, plan: WritePlan) -> TableLog:
    from castsql.errors import SchemaMismatch

    if plan.exists:
        # The commit checks the files against the head's schema (a mergeSchema
        # plan's schema is the table's plus its new columns: not "the same table").
        return TableLog(storage)
    log = TableLog.create(storage, plan.ref.schema, primary_key=plan.primary_key, exist_ok=True)
    latest = log.latest()
    if not plan.exists:
        # Created by someone else since planning: the same checks as at planning.
        _check_schema(storage.root, latest.schema, plan.ref.schema, latest.primary_key)
        if plan.primary_key is not None and latest.primary_key != plan.primary_key:
            raise SchemaMismatch(f"{storage.root}: the table's primary key is {latest.primary_key!r}")
    return log


class CastSQLWriter(DataSourceArrowWriter):
    def __init__(self, plan: WritePlan) -> None:
        self.plan = plan

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        return write_attempt(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_write(self.plan, messages)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        # The files of the attempts are in no version; GC removes them after its grace period.
        pass


class CastSQLStreamWriter(DataSourceStreamArrowWriter):
    """Each micro-batch one version, recorded with its query and batch id:
    a batch already committed (a restart replaying it) is never committed again."""

    def __init__(self, plan: WritePlan, query: str) -> None:
        self.plan = plan
        self.query = query

    def write(self, iterator: Iterator[pa.RecordBatch]) -> FilesWritten:
        return write_attempt(self.plan, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        storage = self.plan.ref.storage()
        log = _open_or_create(storage, self.plan)
        if last_batch(log, self.query) >= batchId:
            return  # committed before a restart: the replay's files stay orphans
        commit_files(self.plan, messages, {"stream_query": self.query, "stream_batch": batchId})

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


# ---------------------------------------------------------------------- the source


class CastSQLDataSource(DataSource):
    """``format("castsql")``: see the module's documentation."""

    # How reads are cut into tasks; set on the class :func:`for_session` makes.
    splits: Splits | None = None

    @classmethod
    def name(cls) -> str:
        return NAME

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self._version: int | None = None
        self._schema_json: dict[str, Any] | None = None

    def _read_target(self) -> tuple[Storage, Snapshot]:
        _check_known(self.options)
        uri = _path(self.options)
        storage = open_storage(uri, s3=s3_config(self.options))
        version = _int_option(self.options, "versionAsOf")
        snap = resolve_read(TableLog(storage), version, _get(self.options, "timestampAsOf"), f"{storage.root}")
        return storage, snap

    def schema(self) -> StructType:
        # Called once, where the DataFrame is made: the version is pinned here
        # (the instance is pickled with it to the planner).
        _, snap = self._read_target()
        self._version, self._schema_json = snap.version, snap.schema.to_json()
        return spark_schema(snap.schema)

    def reader(self, schema: StructType) -> DataSourceReader:
        if self._version is None:
            self.schema()
        storage = open_storage(_path(self.options), s3=s3_config(self.options))
        log = TableLog(storage)
        table_schema = Schema.from_json(self._schema_json, storage.root)
        names = [c.name for c in table_schema.columns]
        wanted = [f.name for f in schema.fields]
        columns = [n for n in names if n in wanted] if set(wanted) <= set(names) else names
        snap_pk = log.manifest(self._version).primary_key  # type: ignore[arg-type]
        ref = TableRef(storage.root, getattr(storage, "config", None), table_schema.to_json(), snap_pk)
        cls = CastSQLPushdownReader if PRUNE_PUSHED_FILTERS and _pushdown_planning() else CastSQLReader
        return cls(ref, self._version, columns, type(self).splits or Splits.local())  # type: ignore[arg-type]

    def writer(self, schema: StructType, overwrite: bool) -> CastSQLWriter:
        return CastSQLWriter(_plan_write(self.options, schema, overwrite))

    def streamWriter(self, schema: StructType, overwrite: bool) -> CastSQLStreamWriter:
        query = _get(self.options, "queryId") or _get(self.options, "checkpointLocation") or _path(self.options)
        return CastSQLStreamWriter(_plan_write(self.options, schema, overwrite), query)


def for_session(splits: Splits, name: str = NAME) -> type[CastSQLDataSource]:
    """The data source class :func:`castsql.spark.register` registers where
    the JVM one (:mod:`castsql.spark.bridge`) cannot be loaded, under
    ``name``: the planner runs in a Python process of its own that cannot ask
    the session how many task slots it has, so the session's split rule rides
    on the class. Spark pickles a registered class; this one is not
    importable by name, so it travels by value, ``splits`` with it."""
    return type(
        CastSQLDataSource.__name__,
        (CastSQLDataSource,),
        {
            "splits": splits,
            "name": classmethod(lambda cls: name),
            "__module__": __name__,
            "__qualname__": CastSQLDataSource.__qualname__,
        },
    )
