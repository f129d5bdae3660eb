"""Manifests: one immutable JSON document per table version.

The seed's fields (``version``, ``previous``, ``created_at``, ``schema``,
``data_files``, ``tombstones``) are all a reader needs; CastSQL adds optional
fields (``format_version``, ``primary_key``, ``operation``, ``summary``,
``commit_id``, ``writer``, and per file ``row_group_rows``) and keeps any field
it does not know when it rewrites a manifest. See docs/FORMAT.md.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from castsql.errors import FormatError
from castsql.format.jsonio import load_json
from castsql.format.schema import Schema
from castsql.storage.base import is_normal_key, key_problem

FORMAT_VERSION = 1

_KNOWN_FIELDS = {
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
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


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
class Manifest:
    """A committed (or about-to-be-committed) version of a table."""

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

    @property
    def total_rows(self) -> int:
        """Rows in the data files, before tombstones."""
        return sum(f.total_rows for f in self.data_files)

    def evolve(self, **changes: Any) -> Manifest:
        return replace(self, **changes)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format_version": FORMAT_VERSION,
            "version": self.version,
            "previous": self.previous,
            "created_at": format_time(self.created_at),
            "operation": self.operation,
            "schema": self.schema.to_json(),
            "primary_key": self.primary_key,
            "data_files": [f.to_json() for f in self.data_files],
            "tombstones": list(self.tombstones),
            "summary": self.summary,
            "commit_id": self.commit_id,
            "writer": self.writer,
        }
        d.update(self.extra)
        return d

    def to_bytes(self) -> bytes:
        return json.dumps(self.to_json(), separators=(",", ":"), allow_nan=False).encode()


def parse_manifest(data: bytes, where: str, *, expected_version: int | None = None) -> Manifest:
    """Parse and validate a manifest; ``where`` names it in errors.

    ``expected_version`` is the version its key names: a manifest holding
    another version is refused before anything else is checked.
    """
    obj = load_json(data, where, "manifest")
    if not isinstance(obj, dict):
        raise FormatError(f"{where}: manifest must be a JSON object")
    fv = obj.get("format_version", FORMAT_VERSION)
    if not isinstance(fv, int) or fv > FORMAT_VERSION:
        raise FormatError(f"{where}: format_version {fv!r} is newer than this CastSQL reads ({FORMAT_VERSION})")
    for k in ("version", "schema", "data_files", "tombstones", "created_at"):
        if k not in obj:
            raise FormatError(f"{where}: manifest has no {k!r} field")
    version = obj["version"]
    if not isinstance(version, int) or isinstance(version, bool) or version < 0:
        raise FormatError(f"{where}: 'version' must be a non-negative integer, got {version!r}")
    if expected_version is not None and version != expected_version:
        raise FormatError(f"{where}: holds version {version}, but its key names version {expected_version}")
    previous = obj.get("previous")
    if previous is not None and (not isinstance(previous, int) or isinstance(previous, bool) or previous >= version):
        raise FormatError(f"{where}: 'previous' must be an integer below version {version}, got {previous!r}")
    try:
        created_at = parse_time(obj["created_at"])
    except (TypeError, ValueError, AttributeError):
        raise FormatError(f"{where}: 'created_at' is not an ISO-8601 time: {obj['created_at']!r}") from None
    schema = Schema.from_json(obj["schema"], where)
    if not isinstance(obj["data_files"], list):
        raise FormatError(f"{where}: 'data_files' must be a list")
    files = tuple(DataFile.from_json(f, f"{where}: data_files[{i}]") for i, f in enumerate(obj["data_files"]))
    seen: set[str] = set()
    for f in files:
        if f.path in seen:
            raise FormatError(f"{where}: data file {f.path} is listed twice")
        seen.add(f.path)
    tombs = obj["tombstones"]
    if not isinstance(tombs, list) or not all(isinstance(t, str) and t for t in tombs):
        raise FormatError(f"{where}: 'tombstones' must be a list of paths")
    for kind, paths in (("data file", (f.path for f in files)), ("tombstone", tombs)):
        for p in paths:
            if not is_normal_key(p) and (problem := key_problem(p)) is not None:
                raise FormatError(f"{where}: {kind} {p!r} is not a plain object key: it {problem}")
    pk = obj.get("primary_key")
    if pk is not None and (not isinstance(pk, str) or schema.column(pk) is None):
        raise FormatError(f"{where}: primary_key {pk!r} is not a column of the schema")
    summary = obj.get("summary") or {}
    if not isinstance(summary, dict):
        raise FormatError(f"{where}: 'summary' must be an object")
    for k in ("operation", "commit_id", "writer"):
        if obj.get(k) is not None and not isinstance(obj[k], str):
            raise FormatError(f"{where}: {k!r} must be a string")
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
    )


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
            return value.strftime("%Y-%m-%dT%H:%M:%S.%f")
        return format_time(value)
    if hasattr(value, "isoformat"):  # date
        return value.isoformat()
    if type(value).__name__ == "Decimal":
        return str(value)
    return None
