"""Manifests: one immutable JSON document per table version.

Format version 1 (the seed's): ``data_files`` lists every data file and
``tombstones`` every tombstone file; its fields (``version``, ``previous``,
``created_at``, ``schema``, ``data_files``, ``tombstones``) are all a reader
needs, and CastSQL's optional ones (``format_version``, ``primary_key``,
``operation``, ``summary``, ``commit_id``, ``writer``, per file
``row_group_rows``) come on top.

Format version 2 (what CastSQL writes): the data files and tombstones of a
version are immutable metadata objects under ``meta/`` (:class:`MetaRef`,
:mod:`castsql.format.metafiles`) plus a short *inline* list of each not yet
folded into one; ``totals`` count them and ``change`` says what this version
changed. In memory both versions are one :class:`Manifest`: a version-1
manifest is a version-2 one whose every file and tombstone is inline.

Unknown fields are kept when a manifest is rewritten. See docs/FORMAT.md.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from castsql.errors import FormatError
from castsql.format.jsonio import load_json, pk_value
from castsql.format.layout import MAX_VERSION
from castsql.format.schema import Schema, type_from_name
from castsql.storage.base import is_normal_key, key_problem

FORMAT_VERSION = 2  # the newest this code reads, and what it writes

_KNOWN_FIELDS = {
    "files",
    "deletes",
    "totals",
    "change",
    "format_version",
    "version",
    "previous",
    "created_at",
    "schema",
    "primary_key",
    "data_files",
    "tombstones",
    "operation",
    "summary",
    "commit_id",
    "writer",
    "streams",
    "properties",
    "cdc",
}
_FILE_KNOWN = {"path", "size_bytes", "row_group_count", "total_rows", "min", "max", "row_group_rows"}


@contextlib.contextmanager
def no_gc() -> Iterator[None]:
    """Pause the cyclic GC while building many small acyclic objects (parsing a
    manifest, resolving a version): with a 100,000-file manifest alive, every
    gen-2 pass walks millions of objects, and the passes that the allocations
    trigger cost more than the work itself (3x in bench/read_bench.py)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def format_time(t: datetime) -> str:
    """UTC, microseconds, ``Z`` suffix: ``2025-10-04T13:45:12.123456Z``."""
    # isoformat, not strftime: strftime("%Y") writes year 201 as "201", which
    # sorts after "2000" and made statistics prune files holding such times.
    return t.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"


def parse_time(s: str) -> datetime:
    """Parse an ISO-8601 time; a time without a zone is taken as UTC."""
    t = datetime.fromisoformat(s.replace("Z", "+00:00"))
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


@dataclass(frozen=True, slots=True)
class DataFile:
    """One Parquet data file as a manifest lists it. ``path`` is as written:
    a key relative to the table root (CastSQL's writers) or a full URI (seed)."""

    path: str
    size_bytes: int
    row_group_count: int
    total_rows: int
    min: dict[str, Any] = field(default_factory=dict)
    max: dict[str, Any] = field(default_factory=dict)
    row_group_rows: tuple[int, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "path": self.path,
            "size_bytes": self.size_bytes,
            "row_group_count": self.row_group_count,
            "total_rows": self.total_rows,
            "min": self.min,
            "max": self.max,
        }
        if self.row_group_rows is not None:
            d["row_group_rows"] = list(self.row_group_rows)
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, obj: Any, where: str) -> DataFile:
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: must be an object")
        path = obj.get("path")
        if not isinstance(path, str) or not path:
            raise FormatError(f"{where}: 'path' must be a non-empty string")
        ints = {}
        for k in ("size_bytes", "row_group_count", "total_rows"):
            v = obj.get(k)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise FormatError(f"{where} ({path}): {k!r} must be a non-negative integer, got {v!r}")
            ints[k] = v
        mins, maxs = obj.get("min", {}), obj.get("max", {})
        if not isinstance(mins, dict) or not isinstance(maxs, dict):
            raise FormatError(f"{where} ({path}): 'min' and 'max' must be objects")
        rgr = obj.get("row_group_rows")
        if rgr is not None:
            if (
                not isinstance(rgr, list)
                or len(rgr) != ints["row_group_count"]
                or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in rgr)
                or sum(rgr) != ints["total_rows"]
            ):
                raise FormatError(
                    f"{where} ({path}): 'row_group_rows' must list row_group_count counts summing to total_rows"
                )
            rgr = tuple(rgr)
        extra = {k: v for k, v in obj.items() if k not in _FILE_KNOWN}
        return cls(path=path, min=mins, max=maxs, row_group_rows=rgr, extra=extra, **ints)


@dataclass(frozen=True, slots=True)
class MetaRef:
    """A metadata object a version-2 manifest references, with the summary a
    reader uses to skip it (FORMAT.md §3.2).

    ``kind`` is ``files`` (one row per data file) or ``deletes`` (one row per
    tombstone record) or ``markers`` (one row per CDC delete marker,
    FORMAT.md §3.7). ``entries`` counts its rows; ``level`` is its merge
    tier (None: full, never merged again). For ``files``: ``rows`` and
    ``bytes`` sum its files' ``total_rows`` and ``size_bytes``; ``min`` and
    ``max`` bound every column statistic of its files (``extra["paths"]``
    bounds their paths). For ``deletes``: ``tombstones`` counts the tombstone
    files whose records it holds (their keys are in the object, not here: a
    manifest stays the same size however many deletes came before). For
    ``markers``: ``min`` and ``max`` bound its key columns, ``extra["oldest"]``
    is when its oldest marker was written.
    """

    path: str
    kind: str
    entries: int
    level: int | None = 0
    rows: int = 0
    bytes: int = 0
    min: dict[str, Any] = field(default_factory=dict)
    max: dict[str, Any] = field(default_factory=dict)
    tombstones: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"path": self.path, "entries": self.entries, "level": self.level}
        if self.kind == "files":
            d.update(rows=self.rows, bytes=self.bytes, min=self.min, max=self.max)
        elif self.kind == "markers":
            d.update(min=self.min, max=self.max)
        else:
            d["tombstones"] = self.tombstones
        d.update(self.extra)
        return d

    @classmethod
    def from_json(cls, obj: Any, kind: str, where: str) -> MetaRef:
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: must be an object")
        path = obj.get("path")
        if not isinstance(path, str) or not path:
            raise FormatError(f"{where}: 'path' must be a non-empty string")
        if not is_normal_key(path):
            if (problem := key_problem(path)) is not None:
                raise FormatError(f"{where}: metadata object {path!r} is not a plain object key: it {problem}")
            # Metadata objects are written by version-2 writers: relative, normalised keys only.
            raise FormatError(f"{where}: metadata object {path!r} lies outside the table root or is not a normal key")
        at = f"{where} ({path})"
        entries = _nonneg(obj.get("entries"), "entries", at)
        level = obj.get("level")
        if level is not None:
            level = _nonneg(level, "level", at)
        known = {"path", "entries", "level"}
        if kind in ("files", "markers"):
            mins, maxs = obj.get("min", {}), obj.get("max", {})
            if not isinstance(mins, dict) or not isinstance(maxs, dict):
                raise FormatError(f"{at}: 'min' and 'max' must be objects")
            if kind == "files":
                rows, size = _nonneg(obj.get("rows"), "rows", at), _nonneg(obj.get("bytes"), "bytes", at)
                ref = cls(path, kind, entries, level, rows, size, mins, maxs)
                known |= {"rows", "bytes"}
            else:
                ref = cls(path, kind, entries, level, min=mins, max=maxs)
            known |= {"min", "max"}
        else:
            ref = cls(path, kind, entries, level, tombstones=_nonneg(obj.get("tombstones"), "tombstones", at))
            known.add("tombstones")
        extra = {k: v for k, v in obj.items() if k not in known}
        return replace(ref, extra=extra) if extra else ref


def _nonneg(v: Any, name: str, where: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise FormatError(f"{where}: {name!r} must be a non-negative integer, got {v!r}")
    return v


def stat_kinds(schema: Schema) -> dict[str, str]:
    """Column -> how its JSON statistics compare: ``num``, ``str``, ``bool``,
    ``time`` (ISO text, compared as instants) or ``date``; columns without
    statistics are left out."""
    out = {}
    for c in schema.columns:
        try:
            t = type_from_name(c.type)
        except FormatError:
            continue
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            out[c.name] = "num"
        elif pa.types.is_string(t):
            out[c.name] = "str"
        elif pa.types.is_boolean(t):
            out[c.name] = "bool"
        elif pa.types.is_timestamp(t):
            out[c.name] = "time"
        elif pa.types.is_date(t):
            out[c.name] = "date"
    return out


def _instant(v: str) -> datetime:
    t = datetime.fromisoformat(v)
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t


def _inverted(lo: Any, hi: Any, kind: str) -> bool:
    """``lo > hi`` for two JSON statistics of a column of ``kind``; False when
    either is not a statistic of that kind (such a statistic prunes nothing)."""
    if kind == "num":
        ok = all(isinstance(v, int | float) and not isinstance(v, bool) for v in (lo, hi))
    elif kind == "bool":
        ok = isinstance(lo, bool) and isinstance(hi, bool)
    else:
        ok = isinstance(lo, str) and isinstance(hi, str)
    if not ok:
        return False
    if kind == "time" and not (len(lo) == len(hi) and lo[-1] == hi[-1] == "Z"):
        # Text compares like instants only in one fixed form (what CastSQL writes).
        try:
            return _instant(lo) > _instant(hi)
        except ValueError:
            return False
    return bool(lo > hi)


def check_bounds(mins: dict[str, Any], maxs: dict[str, Any], kinds: dict[str, str], what: str) -> None:
    """FormatError naming ``what`` and the column where a min is above its max:
    pruning would skip the file (or object) for every value."""
    for col, lo in mins.items():
        kind = kinds.get(col)
        if kind is not None and col in maxs and _inverted(lo, maxs[col], kind):
            raise FormatError(f"{what}: column {col!r} has min {lo!r} above max {maxs[col]!r}")


_TOTALS = ("files", "rows", "bytes", "tombstones")


@dataclass(frozen=True, slots=True)
class Totals:
    """What a version holds, counted without reading its metadata objects."""

    files: int = 0
    rows: int = 0  # stored rows (before tombstones)
    bytes: int = 0
    tombstones: int = 0  # tombstone files in force

    def to_json(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in _TOTALS}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> Totals:
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: 'totals' must be an object")
        return cls(**{k: _nonneg(obj.get(k, 0), k, f"{where}: totals") for k in _TOTALS})


@dataclass(frozen=True, slots=True)
class MarkerBounds:
    """How many CDC delete markers a version added, and the bounds of their key columns."""

    entries: int
    min: dict[str, Any] = field(default_factory=dict)
    max: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"entries": self.entries, "min": self.min, "max": self.max}

    @classmethod
    def from_json(cls, obj: Any, where: str) -> MarkerBounds:
        if (
            not isinstance(obj, dict)
            or not isinstance(obj.get("min", {}), dict)
            or not isinstance(obj.get("max", {}), dict)
        ):
            raise FormatError(f"{where}: must be an object with 'entries', 'min' and 'max'")
        return cls(_nonneg(obj.get("entries"), "entries", where), dict(obj.get("min", {})), dict(obj.get("max", {})))


@dataclass(frozen=True, slots=True)
class ChangeLog:
    """What one version changed against ``previous`` (version 2): the entries
    of the data files it added, the keys it removed, the tombstone files it
    added and removed. Readers use it to step from one version to the next,
    writers to check what concurrent commits did, audits to count."""

    added_files: tuple[DataFile, ...] = ()
    removed_files: tuple[str, ...] = ()
    added_tombstones: tuple[str, ...] = ()
    removed_tombstones: tuple[str, ...] = ()
    # The change-data file (FORMAT.md §3.5): the rows this version's tombstones
    # delete, as they were, written under ``castsql.changeDataFeed``; and the
    # primary keys of every row it inserted or deleted (JSON statistics,
    # sorted), when they are few (KEYS_MAX).
    preimages: DataFile | None = None
    keys: tuple[Any, ...] | None = None
    # The change file (FORMAT.md §3.5): every row this version inserted or
    # deleted, each with its Delta change type; written instead of
    # ``preimages`` by writers since the format had it.
    change_file: DataFile | None = None
    # The CDC delete markers this version added (FORMAT.md §3.7): their
    # count and key bounds, which a concurrent writer's conflict check reads.
    markers: MarkerBounds | None = None

    def to_json(self) -> dict[str, Any]:
        d = {
            "added_files": [f.to_json() for f in self.added_files],
            "removed_files": list(self.removed_files),
            "added_tombstones": list(self.added_tombstones),
            "removed_tombstones": list(self.removed_tombstones),
        }
        if self.preimages is not None:
            d["preimages"] = self.preimages.to_json()
        if self.change_file is not None:
            d["change_file"] = self.change_file.to_json()
        if self.keys is not None:
            d["keys"] = list(self.keys)
        if self.markers is not None:
            d["markers"] = self.markers.to_json()
        return d

    @classmethod
    def from_json(cls, obj: Any, where: str) -> ChangeLog:
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: 'change' must be an object")
        added = obj.get("added_files", [])
        if not isinstance(added, list):
            raise FormatError(f"{where}: change.added_files must be a list")
        lists = {}
        for k in ("removed_files", "added_tombstones", "removed_tombstones"):
            v = obj.get(k, [])
            if not isinstance(v, list) or not all(isinstance(x, str) and x for x in v):
                raise FormatError(f"{where}: change.{k} must be a list of paths")
            lists[k] = tuple(v)
        files = tuple(DataFile.from_json(f, f"{where}: change.added_files[{i}]") for i, f in enumerate(added))
        pre = obj.get("preimages")
        preimages = None if pre is None else DataFile.from_json(pre, f"{where}: change.preimages")
        cf = obj.get("change_file")
        change_file = None if cf is None else DataFile.from_json(cf, f"{where}: change.change_file")
        if preimages is not None and change_file is not None:
            raise FormatError(f"{where}: change has both 'preimages' and 'change_file' (a version has one)")
        keys = obj.get("keys")
        if keys is not None and not is_key_list(keys):
            raise FormatError(f"{where}: change.keys must be a list of numbers or strings")
        if keys is not None and not ascending(keys):
            keys = None  # a lookup bisects the list: one out of order would hide keys, so it says nothing
        mk = obj.get("markers")
        markers = None if mk is None else MarkerBounds.from_json(mk, f"{where}: change.markers")
        return cls(
            added_files=files,
            preimages=preimages,
            change_file=change_file,
            keys=None if keys is None else tuple(keys),
            markers=markers,
            **lists,
        )


@dataclass(frozen=True, slots=True)
class CdcState:
    """How CDC batches are ordered on this table (FORMAT.md §3.7): the key
    and sequence columns the first sequenced batch named, and the objects
    holding the delete markers (the last sequence of keys a delete removed).

    >>> CdcState(("id",), ("lsn",)).to_json()
    {'key': ['id'], 'sequence': ['lsn'], 'markers': []}
    """

    key: tuple[str, ...]
    sequence: tuple[str, ...]
    markers: tuple[MetaRef, ...] = ()
    # Markers not yet folded into an object (at most 32): {"key": [...], "sequence": [...], "at": time},
    # values as JSON statistics (castsql.format.markers reads them).
    inline: tuple[dict[str, Any], ...] = ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"key": list(self.key), "sequence": list(self.sequence)}
        d["markers"] = [r.to_json() for r in self.markers]
        if self.inline:
            d["inline"] = list(self.inline)
        return d

    @classmethod
    def from_json(cls, obj: Any, schema: Schema, where: str) -> CdcState:
        if not isinstance(obj, dict):
            raise FormatError(f"{where}: 'cdc' must be an object")
        names = {c.lower() for c in schema.names}
        cols: dict[str, tuple[str, ...]] = {}
        for part in ("key", "sequence"):
            v = obj.get(part)
            if not isinstance(v, list) or not v or not all(isinstance(c, str) and c for c in v):
                raise FormatError(f"{where}: cdc.{part} must be a non-empty list of column names")
            missing = [c for c in v if c.lower() not in names]
            if missing:
                raise FormatError(f"{where}: cdc.{part} names {missing[0]!r}, which is not a column of the table")
            cols[part] = tuple(v)
        refs = obj.get("markers", [])
        if not isinstance(refs, list):
            raise FormatError(f"{where}: cdc.markers must be a list")
        markers = tuple(MetaRef.from_json(r, "markers", f"{where}: cdc.markers[{i}]") for i, r in enumerate(refs))
        inline = obj.get("inline", [])
        widths = (("key", len(cols["key"])), ("sequence", len(cols["sequence"])))
        if not isinstance(inline, list) or not all(
            isinstance(m, dict) and isinstance(m.get("at"), str)
            and all(isinstance(m.get(p), list) and len(m[p]) == n for p, n in widths)
            for m in inline
        ):  # fmt: skip
            raise FormatError(f"{where}: cdc.inline must list markers {{'key': [...], 'sequence': [...], 'at': time}}")
        return cls(cols["key"], cols["sequence"], markers, tuple(inline))


@dataclass(frozen=True, slots=True)
class Manifest:
    """A committed (or about-to-be-committed) version of a table.

    ``data_files`` and ``tombstones`` are the *inline* parts: every file and
    tombstone of a version-1 manifest; in version 2 only those not yet folded
    into the metadata objects ``file_objects`` and ``delete_objects``.
    """

    version: int
    previous: int | None
    created_at: datetime
    schema: Schema
    data_files: tuple[DataFile, ...] = ()
    tombstones: tuple[str, ...] = ()
    primary_key: str | None = None
    operation: str | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    commit_id: str | None = None
    writer: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    file_objects: tuple[MetaRef, ...] = ()
    delete_objects: tuple[MetaRef, ...] = ()
    totals: Totals | None = None
    change: ChangeLog | None = None
    # Stream query -> its highest micro-batch id committed at or before this
    # version; carried into every later version, so a replayed batch is known
    # after GC has dropped the version that committed it (FORMAT.md §3.2).
    streams: dict[str, int] = field(default_factory=dict)
    # Table properties (FORMAT.md §3.2, castsql.format.properties): carried
    # into every later version unless a change sets them.
    properties: dict[str, str] = field(default_factory=dict)
    # How CDC batches are ordered, and the delete markers (FORMAT.md §3.7):
    # carried into every later version (a restore takes the restored one's).
    cdc: CdcState | None = None

    @property
    def total_rows(self) -> int:
        """Rows in the data files, before tombstones."""
        if self.totals is not None:
            return self.totals.rows
        return sum(f.total_rows for f in self.data_files)

    @property
    def file_count(self) -> int:
        """Data files of the version."""
        return self.totals.files if self.totals is not None else len(self.data_files)

    @property
    def tombstone_count(self) -> int:
        """Tombstone files in force at the version."""
        return self.totals.tombstones if self.totals is not None else len(self.tombstones)

    def evolve(self, **changes: Any) -> Manifest:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format_version": self.format_version,
            "version": self.version,
            "previous": self.previous,
            "created_at": format_time(self.created_at),
            "operation": self.operation,
            "schema": self.schema.to_json(),
            "primary_key": self.primary_key,
        }
        if self.format_version == 1:
            d["data_files"] = [f.to_json() for f in self.data_files]
            d["tombstones"] = list(self.tombstones)
        else:
            # No seed keys: a reader that knows only version 1 fails instead of
            # reading the inline part as if it were every file.
            d["files"] = {
                "objects": [r.to_json() for r in self.file_objects],
                "inline": [f.to_json() for f in self.data_files],
            }
            d["deletes"] = {"objects": [r.to_json() for r in self.delete_objects], "inline": list(self.tombstones)}
            d["totals"] = (self.totals or Totals()).to_json()
            d["change"] = (self.change or ChangeLog()).to_json()
        d.update(summary=self.summary, commit_id=self.commit_id, writer=self.writer)
        if self.streams:
            d["streams"] = self.streams
        if self.properties:
            d["properties"] = self.properties
        if self.cdc is not None:
            d["cdc"] = self.cdc.to_json()
        d.update(self.extra)
        return d

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False).encode()


def _format_and_version(obj: dict, where: str, expected_version: int | None) -> tuple[int, int]:
    """The manifest's format version (one this CastSQL reads) and version (the
    one its key names, where given), once the fields its format needs are there."""
    fv = obj.get("format_version", 1)
    if not isinstance(fv, int) or isinstance(fv, bool) or fv < 1:
        raise FormatError(f"{where}: format_version must be a positive integer, got {fv!r}")
    if fv > FORMAT_VERSION:
        raise FormatError(f"{where}: format_version {fv} is newer than this CastSQL reads ({FORMAT_VERSION})")
    for k in ("version", "schema", "created_at", *(("files", "deletes") if fv == 2 else ("data_files", "tombstones"))):
        if k not in obj:
            raise FormatError(f"{where}: manifest has no {k!r} field")
    version = obj["version"]
    if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= MAX_VERSION:
        raise FormatError(f"{where}: 'version' must be an integer from 0 to 2^63-1, got {str(version)[:40]!r}")
    if expected_version is not None and version != expected_version:
        raise FormatError(f"{where}: holds version {version}, but its key names version {expected_version}")
    return fv, version


def _v2_parts(obj: dict, where: str) -> tuple[tuple[MetaRef, ...], tuple[MetaRef, ...], Any, Any]:
    """A version 2 manifest's files and deletes: the objects it references and
    the inline files and tombstones (checked by the caller)."""
    files_part, deletes_part = obj["files"], obj["deletes"]
    for name, part in (("files", files_part), ("deletes", deletes_part)):
        if not isinstance(part, dict) or not isinstance(part.get("objects"), list):
            raise FormatError(f"{where}: {name!r} must be an object with 'objects' and 'inline' lists")
        if not isinstance(part.get("inline"), list):
            raise FormatError(f"{where}: {name!r} must be an object with 'objects' and 'inline' lists")
    file_objects = tuple(
        MetaRef.from_json(r, "files", f"{where}: files.objects[{i}]") for i, r in enumerate(files_part["objects"])
    )
    delete_objects = tuple(
        MetaRef.from_json(r, "deletes", f"{where}: deletes.objects[{i}]") for i, r in enumerate(deletes_part["objects"])
    )
    return file_objects, delete_objects, files_part["inline"], deletes_part["inline"]


def _check_listed_once(where: str, files: tuple[DataFile, ...], tombs: Any) -> None:
    """No data file listed twice; the tombstones a list of paths, each once."""
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise FormatError(f"{where}: data file {f.path} is listed twice")
        seen.add(f.path)
    if not isinstance(tombs, list) or not all(isinstance(t, str) and t for t in tombs):
        raise FormatError(f"{where}: 'tombstones' must be a list of paths")
    if len(set(tombs)) != len(tombs):
        twice = next(t for i, t in enumerate(tombs) if t in tombs[:i])
        raise FormatError(f"{where}: tombstone {twice} is listed twice")


def _annotations(obj: dict, where: str) -> tuple[dict, dict, dict]:
    """The manifest's summary, streams and properties, checked; its operation,
    commit id and writer strings where present."""
    summary = obj.get("summary") or {}
    if not isinstance(summary, dict):
        raise FormatError(f"{where}: 'summary' must be an object")
    for k in ("operation", "commit_id", "writer"):
        if obj.get(k) is not None and not isinstance(obj[k], str):
            raise FormatError(f"{where}: {k!r} must be a string")
    streams = obj.get("streams", {})
    if not isinstance(streams, dict) or not all(
        q and isinstance(b, int) and not isinstance(b, bool) and b >= 0 for q, b in streams.items()
    ):
        raise FormatError(f"{where}: 'streams' must map stream queries to micro-batch ids (integers >= 0)")
    properties = obj.get("properties", {})
    if not isinstance(properties, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in properties.items()
    ):
        raise FormatError(f"{where}: 'properties' must map names to strings")
    return summary, streams, properties


def parse_manifest(data: bytes, where: str, *, expected_version: int | None = None) -> Manifest:
    """Parse and validate a manifest; ``where`` names it in errors.

    ``expected_version`` is the version its key names: a manifest holding
    another version is refused before anything else is checked.
    """
    obj = _manifest_object(data, where)
    fv, version = _format_and_version(obj, where, expected_version)
    v2 = fv == 2
    previous, created_at = _lineage(obj, version, where)
    schema = Schema.from_json(obj["schema"], where)
    file_objects: tuple[MetaRef, ...] = ()
    delete_objects: tuple[MetaRef, ...] = ()
    totals = change = None
    if v2:
        file_objects, delete_objects, raw_files, tombs = _v2_parts(obj, where)
        totals = Totals.from_json(obj.get("totals", {}), where)
        change = ChangeLog.from_json(obj.get("change", {}), where)
    else:
        raw_files, tombs = obj["data_files"], obj["tombstones"]
        if not isinstance(raw_files, list):
            raise FormatError(f"{where}: 'data_files' must be a list")
    files = tuple(DataFile.from_json(f, f"{where}: data file {i}") for i, f in enumerate(raw_files))
    _check_listed_once(where, files, tombs)
    _check_statistics(where, version, schema, files, file_objects, change)
    if totals is not None:
        found = (
            len(files) + sum(r.entries for r in file_objects),
            sum(f.total_rows for f in files) + sum(r.rows for r in file_objects),
            sum(f.size_bytes for f in files) + sum(r.bytes for r in file_objects),
        )
        _check_totals(where, version, totals, found)
    for kind, paths in (("data file", (f.path for f in files)), ("tombstone", tombs)):
        for p in paths:
            if not is_normal_key(p) and (problem := key_problem(p)) is not None:
                raise FormatError(f"{where}: {kind} {p!r} is not a plain object key: it {problem}")
    pk = _primary_key(obj, schema, where)
    summary, streams, properties = _annotations(obj, where)
    cdc = obj.get("cdc")
    if cdc is not None and not v2:
        raise FormatError(f"{where}: 'cdc' needs format_version 2")
    return Manifest(
        version=version,
        previous=previous,
        created_at=created_at,
        schema=schema,
        data_files=files,
        tombstones=tuple(tombs),
        primary_key=pk,
        operation=obj.get("operation"),
        summary=summary,
        commit_id=obj.get("commit_id"),
        writer=obj.get("writer"),
        extra={k: v for k, v in obj.items() if k not in _KNOWN_FIELDS},
        format_version=fv,
        file_objects=file_objects,
        delete_objects=delete_objects,
        totals=totals,
        change=change,
        streams=dict(streams),
        properties=dict(properties),
        cdc=None if cdc is None else CdcState.from_json(cdc, schema, where),
    )


def _check_statistics(
    where: str,
    version: int,
    schema: Schema,
    files: tuple[DataFile, ...],
    refs: tuple[MetaRef, ...],
    change: ChangeLog | None,
) -> None:
    """No min above its max: in an entry, an object's summary or a change
    record (pruning would skip the file or object for every value)."""
    kinds = stat_kinds(schema)
    if not kinds:
        return
    at = f"{where} (version {version})"
    for f in (*files, *(change.added_files if change is not None else ())):
        if f.min and f.max:
            check_bounds(f.min, f.max, kinds, f"{at}: data file {f.path}")
    for r in refs:
        check_bounds(r.min, r.max, kinds, f"{at}: summary of metadata object {r.path}")


def _lineage(obj: dict[str, Any], version: int, where: str) -> tuple[int | None, datetime]:
    """A manifest's ``previous`` (below ``version``) and ``created_at``."""
    previous = obj.get("previous")
    if previous is not None and (not isinstance(previous, int) or isinstance(previous, bool) or previous >= version):
        raise FormatError(f"{where}: 'previous' must be an integer below version {version}, got {previous!r}")
    try:
        return previous, parse_time(obj["created_at"])
    except (KeyError, TypeError, ValueError, AttributeError):
        raise FormatError(f"{where}: 'created_at' is not an ISO-8601 time: {obj.get('created_at')!r}") from None


def _check_totals(where: str, version: int, totals: Totals, found: tuple[int, int, int]) -> None:
    """A version-2 manifest's totals are the sums of its objects' summaries and
    its inline entries (``found``: files, rows, bytes; the summaries are
    checked against the objects when they are read): what a count answered
    from metadata relies on."""
    said = (totals.files, totals.rows, totals.bytes)
    if found != said:
        raise FormatError(
            f"{where} (version {version}): totals say {said[0]} files, {said[1]} rows, {said[2]} bytes; "
            f"its files objects and inline entries hold {found[0]} files, {found[1]} rows, {found[2]} bytes"
        )


def added_summary(files: Iterable[DataFile]) -> dict[str, int]:
    """The summary counts of a commit that adds ``files``: ``added_files``, ``added_rows``, ``added_bytes``."""
    files = list(files)
    return {
        "added_files": len(files),
        "added_rows": sum(f.total_rows for f in files),
        "added_bytes": sum(f.size_bytes for f in files),
    }


def json_stat(value: Any) -> Any:
    """A min/max statistic as JSON: numbers and strings as they are, times as
    ISO-8601 (UTC, ``Z``), dates as ``YYYY-MM-DD``, decimals as strings.
    Returns None for values that cannot be ordered in JSON (NaN, bytes)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return value.isoformat(timespec="microseconds")  # four-digit years (see format_time)
        return format_time(value)
    if hasattr(value, "isoformat"):  # date
        return value.isoformat()
    if type(value).__name__ == "Decimal":
        return str(value)
    return None


def is_key_list(v: Any) -> bool:
    """A list of primary keys as JSON statistics (numbers or strings): what
    ``change.keys`` (§3.5) and a key index's entries (§3.6) hold."""
    return isinstance(v, list) and all(pk_value(k) for k in v)


def ascending(keys: Sequence[Any]) -> bool:
    """Whether ``keys`` are strictly ascending (numbers by value, strings by
    code point), as FORMAT.md §3.5 lists a version's keys."""
    try:
        return all(a < b for a, b in itertools.pairwise(keys))
    except TypeError:  # numbers and strings mixed
        return False


KEYS_MAX = 1024  # a version records the keys it changed when at most this many (FORMAT.md §3.5)


@dataclass(frozen=True, slots=True)
class ChangeData:
    """What a write under ``castsql.changeDataFeed`` commits beside its
    tombstones: its change-data file and, when few, the keys it changed."""

    file: DataFile
    keys: tuple[Any, ...] | None = None
    typed: bool = False  # a change file (every changed row, typed), not a file of pre-images


@dataclass(frozen=True, slots=True)
class VersionRecord:
    """What a version-2 manifest says of itself and of its change, without its
    file lists: what an audit's walk over many versions needs of each."""

    version: int
    previous: int | None
    created_at: datetime
    operation: str | None
    totals: Totals
    change: ChangeLog

    @classmethod
    def of(cls, m: Manifest) -> VersionRecord | None:
        if m.format_version < 2 or m.totals is None or m.change is None:
            return None
        return cls(m.version, m.previous, m.created_at, m.operation, m.totals, m.change)


def _ref_counts(ref: Any, where: str) -> tuple[int, int, int]:
    if not isinstance(ref, dict):
        raise FormatError(f"{where}: must be an object")
    return tuple(_nonneg(ref.get(k), k, where) for k in ("entries", "rows", "bytes"))  # type: ignore[return-value]


def parse_schema(data: bytes, where: str, *, expected_version: int) -> tuple[Schema, str | None]:
    """A manifest's schema and primary key, checked as :func:`parse_manifest`
    checks them, its file lists not parsed: what an audit of a version's
    change needs of its last version (a full parse costs ~1 ms a manifest)."""
    obj = _manifest_object(data, where)
    _check_version(obj, where, expected_version)
    if "schema" not in obj:
        raise FormatError(f"{where}: manifest has no 'schema' field")
    schema = Schema.from_json(obj["schema"], where)
    return schema, _primary_key(obj, schema, where)


def _manifest_object(data: bytes, where: str) -> dict[str, Any]:
    obj = load_json(data, where, "manifest")
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: manifest must be a JSON object")
    return obj


def _check_version(obj: dict[str, Any], where: str, expected_version: int) -> None:
    """A light parse's check that the manifest holds the version its key names."""
    version = obj.get("version")
    if version != expected_version or isinstance(version, bool):
        raise FormatError(f"{where}: holds version {version!r}, but its key names version {expected_version}")


def _primary_key(obj: dict[str, Any], schema: Schema, where: str) -> str | None:
    pk = obj.get("primary_key")
    if pk is not None and (not isinstance(pk, str) or schema.column(pk) is None):
        raise FormatError(f"{where}: primary_key {pk!r} is not a column of the schema")
    return pk


def parse_record(data: bytes, where: str, *, expected_version: int) -> VersionRecord | None:
    """The :class:`VersionRecord` of a manifest, checked as :func:`parse_manifest`
    checks those fields (the totals against the objects' summaries and the
    inline entries' counts); None for a version-1 manifest. The inline
    entries' statistics and the schema are not parsed: a walk over thousands
    of versions reads each one's change, not its files."""
    obj = _manifest_object(data, where)
    if obj.get("format_version", 1) != 2:
        return None
    _check_version(obj, where, expected_version)
    version = expected_version
    previous, created_at = _lineage(obj, version, where)
    op = obj.get("operation")
    if op is not None and not isinstance(op, str):
        raise FormatError(f"{where}: 'operation' must be a string")
    files = obj.get("files")
    if (
        not isinstance(files, dict)
        or not isinstance(files.get("objects"), list)
        or not isinstance(files.get("inline"), list)
    ):
        raise FormatError(f"{where}: 'files' must be an object with 'objects' and 'inline' lists")
    # The references' counts only: their bounds and paths are checked when a
    # reader of the version's files reads them.
    refs = [_ref_counts(r, f"{where}: files.objects[{i}]") for i, r in enumerate(files["objects"])]
    inline = files["inline"]
    counts = [(e.get("total_rows"), e.get("size_bytes")) if isinstance(e, dict) else (None, None) for e in inline]
    rows = [_nonneg(r, "total_rows", f"{where}: data file {i}") for i, (r, _) in enumerate(counts)]
    size = [_nonneg(b, "size_bytes", f"{where}: data file {i}") for i, (_, b) in enumerate(counts)]
    totals = Totals.from_json(obj.get("totals", {}), where)
    found = (
        len(inline) + sum(r[0] for r in refs),
        sum(rows) + sum(r[1] for r in refs),
        sum(size) + sum(r[2] for r in refs),
    )
    _check_totals(where, version, totals, found)
    change = ChangeLog.from_json(obj.get("change", {}), where)
    return VersionRecord(version, previous, created_at, op, totals, change)
