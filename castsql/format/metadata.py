"""A table's metadata, read and cached: the pointer, the manifests, and the
metadata objects and tombstone files they name.

Everything here is read-only. Manifests, metadata objects and tombstone files
never change once written, so each is parsed once and kept (bounded); only
the pointer is read afresh. The commit protocol builds on this in
:mod:`castsql.format.log`; :mod:`castsql.format.change` and
:mod:`castsql.format.fold` plan a commit from what this reads.

Example::

    >>> import pyarrow as pa, tempfile
    >>> from castsql.storage import open_storage
    >>> from castsql.format import TableLog, write_data_files
    >>> st = open_storage(tempfile.mkdtemp())
    >>> log = TableLog.create(st, pa.schema([("id", pa.int64())]), primary_key="id")
    >>> _ = log.append(write_data_files(st, pa.table({"id": [1, 2, 3]}), log.latest().schema))
    >>> meta = TableMetadata(st)
    >>> meta.latest().version, meta.totals(meta.latest()).rows
    (1, 3)
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa

from castsql.errors import FormatError, StorageError, TableNotFound, VersionNotFound
from castsql.format.jsonio import load_json
from castsql.format.layout import MANIFEST_DIR, MAX_VERSION, POINTER_KEY, manifest_key, manifest_version, to_table_key
from castsql.format.manifest import (
    Manifest,
    MetaRef,
    Totals,
    VersionRecord,
    format_time,
    no_gc,
    parse_manifest,
    parse_record,
    parse_schema,
)
from castsql.format.markers import read_markers
from castsql.format.metafiles import read_deletes_object
from castsql.format.schema import Schema
from castsql.format.state import FilePart, VersionState, read_part, read_records
from castsql.format.tombstone import TombstoneRecord, parse_tombstones
from castsql.storage import ObjectNotFound, Storage
from castsql.storage.base import ObjectStore, overlapped


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded retries with full-jitter exponential backoff."""

    max_attempts: int = 200
    base_delay: float = 0.002
    max_delay: float = 0.25

    def sleep(self, attempt: int) -> None:
        time.sleep(random.uniform(0, min(self.max_delay, self.base_delay * 2**attempt)))


_PART_ROWS_CACHED = 4_000_000  # file entries of metadata objects kept parsed, per table
_HOLDERS = 200_000  # data files whose files object a log remembers


def parse_pointer(data: bytes, where: str) -> int:
    obj = load_json(data, where, "pointer")
    v = obj.get("version") if isinstance(obj, dict) else None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_VERSION:
        raise FormatError(
            f'{where}: pointer must be {{"version": <integer from 0 to 2^63-1>}}, got {data[:80]!r}'
            + ("…" if len(data) > 80 else "")
        )
    return v


def _schema_key(m: Manifest) -> str:
    return _schema_text(m.schema)


_schema_texts: dict[int, tuple[Schema, str]] = {}


def _schema_text(schema: Schema) -> str:
    # Asked on every lookup of a files object (a stepped resolve makes
    # hundreds a version): the JSON once per schema object, found by identity
    # (hashing a schema costs as much as the JSON); the entry holds the
    # schema, so its id is not reused while cached.
    hit = _schema_texts.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    text = json.dumps(schema.to_json(), sort_keys=True)
    if len(_schema_texts) >= 4096:
        _schema_texts.clear()
    _schema_texts[id(schema)] = (schema, text)
    return text


# How long a pointer read at open stands in for the first head read's own GET.
PRIMED_FOR = 1.0


class TableMetadata:
    """What the table rooted at ``storage`` has committed, read on demand and cached."""

    def __init__(self, storage: Storage, *, retry: RetryPolicy | None = None) -> None:
        self.storage = storage
        self.retry = retry or RetryPolicy()
        self._manifests: OrderedDict[int, Manifest] = OrderedDict()
        self._tombstones: OrderedDict[str, list[TombstoneRecord]] = OrderedDict()
        # Metadata objects never change: parsed ones are kept by key (bounded by rows held).
        self._parts: OrderedDict[tuple[str, str], FilePart] = OrderedDict()
        self._deletes: OrderedDict[str, pa.Table] = OrderedDict()
        self._records: OrderedDict[str, list[tuple[str, TombstoneRecord]]] = OrderedDict()
        self._object_tombs: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._markers: OrderedDict[str, pa.Table] = OrderedDict()
        # Data file key -> a files object found to list it (VersionState.contains).
        self.holders: dict[str, str] = {}
        # The last head read, with the pointer's version and ETag: a commit
        # planned on it starts from there instead of reading the pointer again.
        self._seen: tuple[Manifest, int | None, str | None] | None = None
        self._primed: tuple[bytes, str, float] | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.storage.root!r})"

    @property
    def uri(self) -> str:
        return self.storage.root

    # ------------------------------------------------------------------ read

    def _read_manifest(self, version: int) -> Manifest:
        """Manifest ``version`` or ObjectNotFound; cached (manifests never change)."""
        with self._lock:
            m = self._manifests.get(version)
            if m is not None:
                self._manifests.move_to_end(version)
                return m
        key = manifest_key(version)
        data = self.storage.get(key)
        with no_gc():  # a 100,000-file manifest is millions of small objects: see no_gc
            m = parse_manifest(data, self.storage.uri(key), expected_version=version)
        with self._lock:
            self._manifests[version] = m
            while len(self._manifests) > 64:
                self._manifests.popitem(last=False)
        return m

    def record(self, version: int) -> VersionRecord | Manifest:
        """What version ``version`` says of its change (:class:`VersionRecord`),
        from the cached manifest or a light parse of it; its full manifest
        for a version-1 one. VersionNotFound as :meth:`manifest`."""
        m, data, uri = self._cached_or_bytes(version)
        if m is None:
            r = parse_record(data, uri, expected_version=version)
            return r if r is not None else self.manifest(version)
        return VersionRecord.of(m) or m

    def schema_of(self, version: int) -> tuple[Schema, str | None]:
        """Version ``version``'s schema and primary key, from the cached
        manifest or a parse of those fields alone. VersionNotFound as :meth:`manifest`."""
        m, data, uri = self._cached_or_bytes(version)
        if m is None:
            return parse_schema(data, uri, expected_version=version)
        return m.schema, m.primary_key

    def _cached_or_bytes(self, version: int) -> tuple[Manifest | None, bytes, str]:
        """The cached manifest of ``version``, or its stored bytes and URI for
        a light parse; VersionNotFound (as :meth:`manifest` says it) when it
        is not stored."""
        with self._lock:
            m = self._manifests.get(version)
        if m is not None:
            return m, b"", ""
        key = manifest_key(version)
        try:
            return None, self.storage.get(key), self.storage.uri(key)
        except ObjectNotFound:
            return self.manifest(version), b"", ""  # says why: collected, or never committed

    def kept(self, version: int) -> int:
        """``version``, when its manifest is still stored (one existence check,
        nothing parsed); else VersionNotFound as :meth:`manifest` says it."""
        if isinstance(version, int) and version >= 0 and self.storage.exists(manifest_key(version)):
            return version
        return self.manifest(version, probe=True).version

    def prefetch_records(self, versions: Sequence[int]) -> dict[int, VersionRecord | Manifest]:
        """:meth:`record` of each of ``versions`` that reads, their manifests
        fetched 16 at a time: a walk over many versions on an object store
        waits for one round trip per 16 versions, not one per version. A
        version that does not read is left out, for :meth:`record` to say why
        where the walk reaches it."""
        with self._lock:
            out = {v: VersionRecord.of(m) or m for v in versions if (m := self._manifests.get(v)) is not None}
        todo = [v for v in versions if v not in out]

        def fetch(v: int) -> bytes | None:
            try:
                return self.storage.get(manifest_key(v))
            except (ObjectNotFound, StorageError):
                return None

        for v, data in zip(todo, overlapped(fetch, todo), strict=True):
            if data is None:
                continue
            try:
                r = parse_record(data, self.storage.uri(manifest_key(v)), expected_version=v)
            except FormatError:
                continue
            if r is not None:
                out[v] = r
        return out

    def where(self, version: int) -> str:
        """``<manifest URI> (version N)``: how errors about a version's metadata name it."""
        return f"{self.storage.uri(manifest_key(version))} (version {version})"

    def manifest_raw(self, version: int) -> Manifest:
        """Manifest ``version`` (cached), or ObjectNotFound: no listing, no pointer read."""
        return self._read_manifest(version)

    # ------------------------------------------------------------------ what a version holds

    def state(self, m: Manifest) -> VersionState:
        """The files and tombstones of version ``m`` (format version 1 or 2)."""
        return VersionState(self, m)

    def hold(self, key: str, ref_path: str) -> None:
        """Remember that files object ``ref_path`` lists data file ``key`` (bounded)."""
        if len(self.holders) >= _HOLDERS:
            self.holders.clear()
        self.holders[key] = ref_path

    def has_part(self, ref: MetaRef, m: Manifest) -> bool:
        with self._lock:
            return (ref.path, _schema_key(m)) in self._parts

    def part(self, ref: MetaRef, m: Manifest) -> FilePart:
        """The entries of files object ``ref`` of version ``m`` (cached by key and schema)."""
        ck = (ref.path, _schema_key(m))
        with self._lock:
            p = self._parts.get(ck)
            if p is not None:
                self._parts.move_to_end(ck)
                return p
        p = read_part(self.storage, ref, m, self.where(m.version))
        self._keep_part(ck, p)
        return p

    def wrote_part(self, ref: MetaRef, table: pa.Table, schema: Schema) -> None:
        """A files object this process just wrote (``table``, conformed to
        ``schema``, the schema of the version that will reference it): kept as
        if read, so the next read of that version (a stream's next commit, a
        compaction) costs no request for it."""
        self._keep_part((ref.path, _schema_text(schema)), FilePart(ref, table))

    def _keep_part(self, ck: tuple[str, str], p: FilePart) -> None:
        with self._lock:
            self._parts[ck] = p
            held = sum(x.table.num_rows for x in self._parts.values())
            while held > _PART_ROWS_CACHED and len(self._parts) > 1:
                held -= self._parts.popitem(last=False)[1].table.num_rows

    def deletes_table(self, ref: MetaRef, where: str | None = None) -> pa.Table:
        """The rows of deletes object ``ref`` (cached by key); ``where`` names the version in errors."""
        with self._lock:
            t = self._deletes.get(ref.path)
            if t is not None:
                self._deletes.move_to_end(ref.path)
                return t
        t = read_deletes_object(self.storage, ref, where or self.storage.root)
        with self._lock:
            self._deletes[ref.path] = t
            while len(self._deletes) > 256:
                self._deletes.popitem(last=False)
        return t

    def markers_table(self, ref: MetaRef, where: str | None = None) -> pa.Table:
        """The rows of CDC markers object ``ref`` (cached by key; FORMAT.md §3.7)."""
        with self._lock:
            t = self._markers.get(ref.path)
            if t is not None:
                self._markers.move_to_end(ref.path)
                return t
        t = read_markers(self.storage, ref, where or self.storage.root)
        self.wrote_markers(ref, t)
        return t

    def wrote_markers(self, ref: MetaRef, table: pa.Table) -> None:
        """A markers object this process wrote or read: the next batch's read of it costs no request."""
        with self._lock:
            self._markers[ref.path] = table
            while len(self._markers) > 256:
                self._markers.popitem(last=False)

    def object_tombstones(self, ref: MetaRef, where: str | None = None) -> frozenset[str]:
        """The keys of the tombstone files whose records deletes object ``ref`` holds (cached by key)."""
        with self._lock:
            keys = self._object_tombs.get(ref.path)
            if keys is not None:
                self._object_tombs.move_to_end(ref.path)
                return keys
        keys = frozenset(self.deletes_table(ref, where).column("tombstone").to_pylist())
        with self._lock:
            self._object_tombs[ref.path] = keys
            while len(self._object_tombs) > 1024:
                self._object_tombs.popitem(last=False)
        return keys

    def delete_records(self, ref: MetaRef, where: str) -> list[tuple[str, TombstoneRecord]]:
        """The records of deletes object ``ref``, with the tombstone file of each (cached by key)."""
        with self._lock:
            recs = self._records.get(ref.path)
            if recs is not None:
                self._records.move_to_end(ref.path)
                return recs
        self.deletes_table(ref, where)  # read and checked once
        recs = read_records(self.storage, ref, where)
        with self._lock:
            self._records[ref.path] = recs
            while len(self._records) > 256:
                self._records.popitem(last=False)
        return recs

    def totals(self, m: Manifest) -> Totals:
        """What ``m`` holds: its own totals (version 2), or counted from its lists (version 1)."""
        if m.totals is not None:
            return m.totals
        return Totals(
            files=len(m.data_files),
            rows=sum(f.total_rows for f in m.data_files),
            bytes=sum(f.size_bytes for f in m.data_files),
            tombstones=len(m.tombstones),
        )

    def prime_pointer(self, data: bytes, etag: str) -> None:
        """The pointer's bytes and ETag as whoever opened the table just read
        them (the catalog's check that a URI is a table): the next head read
        uses them instead of a GET of its own, if it comes within
        ``PRIMED_FOR`` seconds. An older pointer is still right, as any
        pointer is: the head read rolls forward past it (FORMAT.md §6), and
        the window bounds what that costs."""
        self._primed = (data, etag, time.monotonic())

    def _read_pointer(self) -> tuple[int | None, str | None]:
        primed, self._primed = self._primed, None
        if primed is not None and time.monotonic() - primed[2] < PRIMED_FOR:
            data, etag = primed[0], primed[1]
        else:
            try:
                data, etag = self.storage.get_with_etag(POINTER_KEY)
            except ObjectNotFound:
                return None, None
        return parse_pointer(data, self.storage.uri(POINTER_KEY)), etag

    def _head(self, roll_forward: bool = True) -> tuple[Manifest, int | None, str | None]:
        """The latest committed manifest, with the pointer's version and ETag;
        without ``roll_forward``, the pointer's manifest (see :meth:`write_base`)."""
        seen = self._seen
        if roll_forward and seen is not None and self._primed is None and isinstance(self.storage, ObjectStore):
            # Every query asks this of a table it read before, and most of the
            # time nothing was committed since: the pointer and the manifest
            # past the last head are read together, one round trip, not two.
            done: list[Any] = overlapped(lambda f: f(), [self._read_pointer, lambda: self._probe(seen[0].version + 1)])
            (pv, etag), probe = done
            if pv is not None and pv == seen[1]:
                if probe is None:
                    self._seen = (seen[0], pv, etag)
                    return seen[0], pv, etag
                if isinstance(probe, Manifest):
                    return self._roll_forward(probe, pv, etag)
                raise probe
        else:
            pv, etag = self._read_pointer()
        if pv is None:
            # The creator may have died between manifest 0 and the pointer.
            try:
                m = self._read_manifest(0)
            except ObjectNotFound:
                raise TableNotFound(f"{self.storage.root}: no table here (no {POINTER_KEY})") from None
        else:
            for _ in range(self.retry.max_attempts):
                try:
                    m = self._read_manifest(pv)
                    break
                except ObjectNotFound:
                    # GC may drop it between our pointer GET and this one, once
                    # the pointer has moved on (FORMAT.md §8 keeps only versions
                    # from the pointer's current one): read the pointer again.
                    again, again_etag = self._read_pointer()
                    if again is None or again == pv:
                        raise FormatError(
                            f"{self.storage.uri(POINTER_KEY)}: names version {pv}, "
                            f"but {manifest_key(pv)} does not exist"
                        ) from None
                    pv, etag = again, again_etag
            else:
                raise FormatError(f"{self.storage.uri(POINTER_KEY)}: kept moving to garbage-collected versions")
        if not roll_forward:
            self._seen = (m, pv, etag)
            return m, pv, etag
        return self._roll_forward(m, pv, etag)

    def _roll_forward(self, m: Manifest, pv: int | None, etag: str | None) -> tuple[Manifest, int | None, str | None]:
        """``m`` or the last of the versions committed after it (the pointer may lag)."""
        while True:
            try:
                m = self._read_manifest(m.version + 1)
            except ObjectNotFound:
                self._seen = (m, pv, etag)
                return m, pv, etag

    def _probe(self, version: int) -> Manifest | Exception | None:
        """Manifest ``version``, None if it does not exist, or the error reading it raised."""
        try:
            return self._read_manifest(version)
        except ObjectNotFound:
            return None
        except Exception as e:  # raised only if the pointer says this probe was the one to make
            return e

    def seen_head(self, m: Manifest) -> tuple[Manifest, int | None, str | None] | None:
        """``m`` with the pointer version and ETag it was read with, if ``m`` is
        the last head this object read; else None. Possibly stale: a commit
        planned on it still loses cleanly (the next manifest exists already)."""
        seen = self._seen
        return seen if seen is not None and seen[0].version == m.version else None

    def latest(self) -> Manifest:
        """The latest committed version (one pointer GET, then one manifest GET
        per version past the pointer, plus one that finds none)."""
        return self._head()[0]

    def known_head(self) -> Manifest | None:
        """The head the last look at an object store's pointer found (no
        request; possibly stale), or None: none yet, a pointer read ahead
        (:meth:`prime`), or a local table, whose look costs less than a thread.
        A reader may run a query on it while :meth:`latest` checks in the
        background, and run it again if that finds a newer version."""
        seen = self._seen
        if seen is None or self._primed is not None or not isinstance(self.storage, ObjectStore):
            return None
        return seen[0]

    def write_base(self) -> Manifest:
        """The version a writer plans its first attempt on: the pointer's, without
        the probe past it that :meth:`latest` makes (one request fewer per write).
        A version committed past a lagging pointer makes the writer's create-only
        put of the next manifest fail, and the commit then reads the head as
        :meth:`latest` does, so nothing is lost and nothing is forked."""
        return self._head(roll_forward=False)[0]

    def latest_version(self) -> int:
        return self.latest().version

    def manifest(self, version: int, *, probe: bool = False) -> Manifest:
        """Manifest of a committed version; VersionNotFound if there is none.

        Manifests are cached, as they never change, but GC may drop one: with
        ``probe`` a cached manifest is returned only if it is still stored
        (one existence check), so a collected version is refused.
        """
        if not isinstance(version, int) or isinstance(version, bool) or not 0 <= version <= MAX_VERSION:
            shown = repr(version) if len(repr(version)) <= 40 else repr(version)[:40] + "…"
            raise VersionNotFound(f"{self.storage.root}: version {shown} is not a version number")
        try:
            if probe and not self.storage.exists(manifest_key(version)):
                with self._lock:
                    self._manifests.pop(version, None)
                raise ObjectNotFound(manifest_key(version))
            return self._read_manifest(version)
        except ObjectNotFound:
            pass
        # Listing, not the pointer: a version is told apart from a collected one
        # even when the latest version is unreadable (audits of old versions
        # must keep working exactly then).
        kept = self.versions()
        if not kept or version > kept[-1]:
            latest = f" (latest is {kept[-1]})" if kept else ""
            raise VersionNotFound(f"{self.storage.root}: version {version} does not exist{latest}") from None
        raise VersionNotFound(
            f"{self.storage.root}: version {version} was garbage-collected (oldest kept is {kept[0]})"
        ) from None

    def earliest_version(self) -> int:
        """The oldest kept version: 0 while its manifest is kept (one request,
        or none when it is cached: GC keeps a contiguous run of versions up to
        the latest), else the first of :meth:`versions` (a listing of every
        manifest). VersionNotFound when no manifest is kept at all."""
        with self._lock:
            if 0 in self._manifests:
                return 0
        if self.storage.exists(manifest_key(0)):
            return 0
        kept = self.versions()
        if not kept:
            raise VersionNotFound(f"{self.storage.root}: no version is kept")
        return kept[0]

    def versions(self) -> list[int]:
        """Committed versions whose manifests are still kept, ascending.

        A manifest that exists is committed (the create-only put is the commit
        point), so this is a listing of ``manifest/`` alone: it needs neither
        the pointer nor the latest manifest to be readable.
        """
        return sorted(
            v for info in self.storage.list(MANIFEST_DIR + "/") if (v := manifest_version(info.key)) is not None
        )

    def history(self) -> list[Manifest]:
        """Every kept version's manifest, oldest first."""
        return [self._read_manifest(v) for v in self.versions()]

    def version_at(self, when: datetime) -> int:
        """The latest version committed at or before ``when``."""
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        vs = self.versions()
        lo, hi, found = 0, len(vs) - 1, None
        # created_at never decreases along the chain (commit() enforces it).
        while lo <= hi:
            mid = (lo + hi) // 2
            if self._read_manifest(vs[mid]).created_at <= when:
                found, lo = vs[mid], mid + 1
            else:
                hi = mid - 1
        if found is None:
            first = self._read_manifest(vs[0]).created_at if vs else None
            raise VersionNotFound(
                f"{self.storage.root}: no version at or before {format_time(when)}"
                + (f" (the oldest kept version was committed at {format_time(first)})" if first else "")
            )
        return found

    def tombstones(self, key: str) -> list[TombstoneRecord]:
        """Records of one tombstone file (cached; tombstones never change)."""
        key = to_table_key(key, self.storage.root, what="tombstone")
        with self._lock:
            recs = self._tombstones.get(key)
            if recs is not None:
                self._tombstones.move_to_end(key)
                return recs
        try:
            data = self.storage.get(key)
        except ObjectNotFound:
            raise FormatError(f"{self.storage.uri(key)}: tombstone file is missing") from None
        recs = parse_tombstones(data, self.storage.uri(key))
        with self._lock:
            self._tombstones[key] = recs
            while len(self._tombstones) > 4096:
                self._tombstones.popitem(last=False)
        return recs
