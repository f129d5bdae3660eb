"""Garbage collection: drop old versions and the objects no kept version needs.

It needs no engine: it lists, reads manifests and deletes through
:mod:`castsql.storage`. ``castsql gc``, :meth:`castsql.Table.gc` and
:func:`castsql.spark.gc` all run this.

Rules (docs/SPARK.md, "Garbage collection", says why each is safe while
writers commit concurrently):

1. List ``data/``, ``tombstone/`` and ``manifest/`` first; only objects seen
   by this listing are candidates.
2. Then read the head (pointer, rolled forward). Kept versions: the latest,
   the last ``keep_versions``, every version committed after
   ``now - older_than``, and every version at or after the one the pointer
   names (a reader starting at the pointer must find its manifest). With
   neither ``keep_versions`` nor ``older_than`` every version is kept and only
   orphans go. Whatever these say, a version whose manifest is younger than
   ``grace`` is kept (FORMAT.md §8 rule 5).
3. An object referenced by a kept version is never deleted. One referenced
   only by versions being dropped is deleted. One referenced by no manifest at
   all (an orphan: a failed or retried task's file, an uncommitted or
   conflicting writer's file, or a file whose manifests an interrupted GC
   already deleted) is deleted only when older than ``grace`` by its storage
   modification time; the local backend's ``.tmp-*`` files likewise.
4. Manifests of dropped versions are deleted first, oldest first, then the
   objects: an interrupted GC leaves orphans, never a manifest that names a
   missing object.

Example::

    >>> report = gc("/data/events", keep_versions=3, dry_run=True)   # doctest: +SKIP
    >>> print(report.summary())                                       # doctest: +SKIP
    would drop versions 0-6 (7 manifests), 12 data files, 4 tombstone files, 0 orphans: 18.2 MB
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from castsql.errors import CastSQLError, VersionNotFound
from castsql.format import Manifest, TableLog, changeblocks, keyindex
from castsql.format.layout import (
    CDC_DIR,
    DATA_DIR,
    MANIFEST_DIR,
    META_DIR,
    POINTER_KEY,
    TOMBSTONE_DIR,
    manifest_version,
    to_table_key,
)
from castsql.format.metadata import parse_pointer
from castsql.storage import ObjectInfo, ObjectNotFound, S3Config, Storage, open_storage

TMP_PREFIX = ".tmp-"  # the local backend's not-yet-linked temporary files


@dataclass
class GCReport:
    """What a garbage collection removed (or, in a dry run, would remove)."""

    table: str
    latest: int
    kept_versions: list[int]
    removed_versions: list[int] = field(default_factory=list)
    removed_data_files: list[str] = field(default_factory=list)
    removed_tombstones: list[str] = field(default_factory=list)
    removed_metadata: list[str] = field(default_factory=list)  # metadata objects (format version 2)
    removed_orphans: list[str] = field(default_factory=list)  # never referenced, older than grace
    removed_temp_files: list[str] = field(default_factory=list)
    bytes_freed: int = 0
    dry_run: bool = False
    held_by_grace: int = 0  # versions and objects the other rules would remove, kept as younger than grace
    grace: timedelta = timedelta(days=7)

    @property
    def removed_keys(self) -> list[str]:
        """Every key removed, in the order GC deletes them."""
        return (
            [_manifest_key(v) for v in self.removed_versions]
            + self.removed_data_files
            + self.removed_tombstones
            + self.removed_metadata
            + self.removed_orphans
            + self.removed_temp_files
        )

    def summary(self) -> str:
        """One line for people."""
        verb = "would remove" if self.dry_run else "removed"
        kept = _span(self.kept_versions)
        parts = [
            f"{len(self.removed_versions)} version(s) {_span(self.removed_versions)}".rstrip(),
            f"{len(self.removed_data_files)} data file(s)",
            f"{len(self.removed_tombstones)} tombstone file(s)",
            f"{len(self.removed_orphans)} orphan(s)",
        ]
        if self.removed_metadata:
            parts.insert(3, f"{len(self.removed_metadata)} metadata object(s)")
        if self.removed_temp_files:
            parts.append(f"{len(self.removed_temp_files)} temp file(s)")
        freed = format_bytes(self.bytes_freed)
        line = f"{verb} {', '.join(parts)}; {freed}; kept versions {kept} (latest {self.latest})"
        if self.held_by_grace:
            line += (
                f"; {self.held_by_grace} version(s) or object(s) kept because they are younger than the grace period "
                f"({_age(self.grace)}): a shorter --grace (e.g. --grace 0 when no writer is running) removes them"
            )
        return line


def _manifest_key(v: int) -> str:
    from castsql.format.layout import manifest_key

    return manifest_key(v)


def _age(t: timedelta) -> str:
    secs = int(t.total_seconds())
    for unit, n in (("d", 86400), ("h", 3600), ("m", 60)):
        if secs and secs % n == 0:
            return f"{secs // n}{unit}"
    return f"{secs}s"


def _span(vs: list[int]) -> str:
    if not vs:
        return ""
    if len(vs) > 1 and vs == list(range(vs[0], vs[-1] + 1)):
        return f"{vs[0]}-{vs[-1]}"
    return ",".join(map(str, vs)) if len(vs) <= 6 else f"{vs[0]}..{vs[-1]}"


def format_bytes(n: int) -> str:
    """``1536`` -> ``'1.5 KB'``."""
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _references(log: TableLog, m: Manifest) -> set[str]:
    """Every object version ``m`` needs: its data files, its inline tombstone
    files and its metadata objects (format version 2)."""
    root = log.storage.root
    refs = set(log.state(m).keys().to_pylist())
    refs |= {to_table_key(t, root, what="tombstone") for t in m.tombstones}
    refs |= {r.path for r in (*m.file_objects, *m.delete_objects)}
    if m.cdc is not None:  # its CDC delete markers (FORMAT.md §3.7)
        refs |= {r.path for r in m.cdc.markers}
    if m.change is not None and m.change.preimages is not None:  # its change-data file (FORMAT.md §3.5)
        refs.add(to_table_key(m.change.preimages.path, root, what="change-data file"))
    if m.change is not None and m.change.change_file is not None:  # its change file (FORMAT.md §3.5)
        refs.add(to_table_key(m.change.change_file.path, root, what="change file"))
    return refs


def _pointer_version(storage: Storage) -> int | None:
    try:
        return parse_pointer(storage.get(POINTER_KEY), storage.uri(POINTER_KEY))
    except ObjectNotFound:
        return None


def _temp_files(storage: Storage) -> list[ObjectInfo]:
    """The local backend's ``.tmp-*`` files (a writer killed mid-put leaves them)."""
    root = storage.root
    if "://" in root or not os.path.isdir(root):
        return []  # S3 puts are atomic: nothing half-written is ever visible
    out = []
    for dirpath, _, names in os.walk(root):
        for name in names:
            if name.startswith(TMP_PREFIX):
                full = os.path.join(dirpath, name)
                try:
                    st = os.stat(full)
                except FileNotFoundError:
                    continue  # linked into place and unlinked while we walked
                out.append(ObjectInfo(os.path.relpath(full, root).replace(os.sep, "/"), st.st_size, st.st_mtime))
    return out


def gc(
    uri: str | Storage,
    *,
    keep_versions: int | None = None,
    older_than: timedelta | None = None,
    grace: timedelta = timedelta(days=7),
    dry_run: bool = False,
    s3: S3Config | None = None,
    now: datetime | None = None,
) -> GCReport:
    """Remove the versions of the table at ``uri`` (a URI, or its opened
    storage) that are not kept and every
    object no kept version references (see the module docs for the rules).

    ``keep_versions``: keep the last N versions; ``older_than``: drop versions
    committed longer ago than this; with both, a version is kept if either
    keeps it; the latest is always kept. ``grace``, longer than any writer's
    job: objects no manifest references are removed only when older than this
    (they may belong to a writer that has not committed yet), and manifests
    younger than this are kept (a writer that read an older head may still try
    to create them). ``dry_run`` deletes nothing.

    Example::

        >>> gc("s3://bucket/events", older_than=timedelta(days=30)).removed_versions   # doctest: +SKIP
        [0, 1, 2]
    """
    _check_rules(keep_versions, older_than, grace)
    now = (now or datetime.now(UTC)).astimezone(UTC)
    storage = uri if isinstance(uri, Storage) else open_storage(uri, s3=s3)
    log = TableLog(storage)
    log.latest()  # TableNotFound before anything else, for a path that is no table

    # 1. Candidates first: whatever is written after this listing is not ours to judge.
    objects = {
        i.key: i
        for prefix in (DATA_DIR + "/", TOMBSTONE_DIR + "/", META_DIR + "/", CDC_DIR + "/")
        for i in storage.list(prefix)
    }
    manifests = {v: i for i in storage.list(MANIFEST_DIR + "/") if (v := manifest_version(i.key)) is not None}
    indexes = list(storage.list(keyindex.INDEX_DIR + "/"))
    blocks = list(storage.list(changeblocks.BLOCKS_DIR + "/"))
    temps = _temp_files(storage)

    # 2. The chain as it is now.
    head = log.latest()
    pointer = _pointer_version(storage)
    listed = sorted(v for v in manifests if v <= head.version)
    # Versions committed after the listing exist too (the chain has no holes past it).
    versions = listed + list(range((listed[-1] + 1) if listed else head.version, head.version + 1))
    keep = _kept_by_rules(log, versions, head.version, keep_versions, older_than, now)
    if pointer is not None:
        keep |= {v for v in versions if v >= pointer}
    # A manifest younger than the grace period stays, whatever the version
    # rules say: a writer that read its head before that version was committed
    # may still be about to create the same key, and with the manifest gone its
    # create-only put would succeed and fork the history (FORMAT.md §8 rule 5).
    old = now.timestamp() - grace.total_seconds()
    by_rules = set(keep)
    keep |= {v for v in versions if v not in manifests or manifests[v].mtime >= old}
    held = len([v for v in keep - by_rules if v in manifests])
    kept_refs: set[str] = set()
    for v in sorted(keep):
        kept_refs |= _references(log, log.manifest(v))
    dropped = [v for v in versions if v not in keep]
    dropped_refs: set[str] = set()
    for v in dropped:
        try:
            dropped_refs |= _references(log, log.manifest(v))
        except VersionNotFound:
            continue  # another GC removed it meanwhile

    # 3. Decide.
    report = GCReport(storage.root, head.version, sorted(keep), dry_run=dry_run, grace=grace)
    report.removed_versions = dropped
    report.bytes_freed = sum(manifests[v].size for v in dropped if v in manifests)
    held += _judge_objects(report, objects, kept_refs, dropped_refs, old)
    oldest = min(keep)
    for info in indexes:
        # A key index serves only its block's versions (FORMAT.md §3.6).
        end = keyindex.index_version(info.key)
        if end is not None and end < oldest:
            report.removed_metadata.append(info.key)
            report.bytes_freed += info.size
    for info in blocks:
        # A change block serves only its versions (FORMAT.md §3.8).
        found = changeblocks.block_version(info.key)
        if found is not None and found[1] < oldest:
            report.removed_metadata.append(info.key)
            report.bytes_freed += info.size
    for info in temps:
        if info.mtime < old:
            report.removed_temp_files.append(info.key)
            report.bytes_freed += info.size
        else:
            held += 1
    report.held_by_grace = held

    # 4. Delete: manifests oldest first, then what only they referenced, then the rest.
    if not dry_run:
        _delete(log, report, indexes, head.version, oldest)
    return report


def _check_rules(keep_versions: int | None, older_than: timedelta | None, grace: timedelta) -> None:
    if keep_versions is not None and keep_versions < 1:
        raise CastSQLError(f"keep_versions must be at least 1 (the latest version is always kept), got {keep_versions}")
    if older_than is not None and older_than < timedelta(0):
        raise CastSQLError(f"older_than must not be negative, got {older_than}")
    if grace < timedelta(0):
        raise CastSQLError(f"grace must not be negative, got {grace}")


def _kept_by_rules(
    log: TableLog,
    versions: list[int],
    head: int,
    keep_versions: int | None,
    older_than: timedelta | None,
    now: datetime,
) -> set[int]:
    """The versions ``keep_versions`` and ``older_than`` keep (all without
    either); the latest always."""
    if keep_versions is None and older_than is None:
        return set(versions)
    keep = {head}
    if keep_versions is not None:
        keep |= set(versions[-keep_versions:])
    if older_than is not None:
        cutoff = now - older_than
        keep |= {v for v in versions if log.manifest(v).created_at > cutoff}
    return keep


def _judge_objects(
    report: GCReport, objects: dict[str, ObjectInfo], kept_refs: set[str], dropped_refs: set[str], old: float
) -> int:
    """Put each listed object no kept version references on the report's
    lists: what only dropped versions referenced, and orphans older than the
    grace period. Returns how many the grace period holds."""
    held = 0
    for key, info in sorted(objects.items()):
        if key in kept_refs:
            continue
        if key in dropped_refs:
            if key.startswith(DATA_DIR + "/"):
                report.removed_data_files.append(key)
            elif key.startswith((META_DIR + "/", CDC_DIR + "/")):
                report.removed_metadata.append(key)
            else:
                report.removed_tombstones.append(key)
        elif info.mtime < old:
            report.removed_orphans.append(key)
        else:
            held += 1
            continue
        report.bytes_freed += info.size
    return held


def _delete(log: TableLog, report: GCReport, indexes: list[ObjectInfo], head: int, oldest: int) -> None:
    """Remove what ``report`` lists, in its order, then write the key
    indexes writers may have left out (FORMAT.md §3.6): every whole kept
    block has its key index."""
    for key in report.removed_keys:
        log.storage.delete(key)
    have = {keyindex.index_version(i.key) for i in indexes}
    for end in range(keyindex.BLOCK, head + 1, keyindex.BLOCK):
        if end not in have and end - keyindex.BLOCK >= oldest:
            keyindex.write_index(log, end)
