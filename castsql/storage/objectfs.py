"""The fsspec filesystem through which DuckDB reads GCS and Azure objects:
CastSQL's own storage (its credentials, timeouts and errors), registered on a
connection by :func:`castsql.engine.duckdb.stores.make_readable`. Kept apart so a
process that reads no such store does not import fsspec.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from castsql.errors import CastSQLError
from castsql.storage import Storage
from castsql.storage.azure import AzureStorage
from castsql.storage.gcs import GCSStorage
from castsql.storage.uris import AZURE, GCS, canonical_uri

# The objects under a table root that are overwritten in place: the pointer,
# and the mirrors' hints (FORMAT.md §10). Everything else there is immutable.
_MOVING = ("/_latest_manifest", "/version-hint.text", "/_last_checkpoint")
BLOCK = 256 * 1024  # bytes of an immutable object fetched and kept together
CACHED = 256 * 2**20  # at most this many bytes of blocks kept per filesystem (least recently used dropped)


class Blocks:
    """Aligned blocks of immutable objects, shared by every handle DuckDB opens
    on one filesystem (each of its threads opens its own): a warm query reads
    data files from here, as DuckDB's external file cache serves S3 reads, so
    its only requests are the freshness check's. A read fetches each run of
    missing blocks it spans with one ranged request.

    >>> calls = []
    >>> b = Blocks(block=4, limit=64)
    >>> fetch = lambda s, e: calls.append((s, e)) or bytes(range(s, e))
    >>> b.read("f", 10, 3, 9, fetch), calls
    (b'\\x03\\x04\\x05\\x06\\x07\\x08', [(0, 10)])
    >>> b.read("f", 10, 5, 7, fetch), len(calls)
    (b'\\x05\\x06', 1)
    """

    def __init__(self, block: int = BLOCK, limit: int = CACHED) -> None:
        self.block, self.limit = block, limit
        self._held: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def read(self, path: str, size: int, start: int, end: int, fetch: Callable[[int, int], bytes]) -> bytes:
        """Bytes [start, end) of ``path`` (``size`` bytes long); ``fetch(s, e)`` reads a range of it."""
        end = min(end, size)
        if start >= end:
            return b""
        b = self.block
        first, last = start // b, (end - 1) // b
        with self._lock:
            got = {i: self._held.get((path, i)) for i in range(first, last + 1)}
            for i, v in got.items():
                if v is not None:
                    self._held.move_to_end((path, i))
        i = first
        while i <= last:
            if got[i] is not None:
                i += 1
                continue
            j = i
            while j + 1 <= last and got[j + 1] is None:
                j += 1
            data = fetch(i * b, min((j + 1) * b, size))
            for k in range(i, j + 1):
                got[k] = data[(k - i) * b : (k - i + 1) * b]
            self._keep(path, {k: got[k] for k in range(i, j + 1)})  # type: ignore[misc]
            i = j + 1
        joined = b"".join(got[k] for k in range(first, last + 1))  # type: ignore[misc]
        return joined[start - first * b : end - first * b]

    def _keep(self, path: str, blocks: dict[int, bytes]) -> None:
        with self._lock:
            for i, v in blocks.items():
                old = self._held.pop((path, i), None)
                self._bytes += len(v) - (len(old) if old is not None else 0)
                self._held[(path, i)] = v
            while self._bytes > self.limit and self._held:
                self._bytes -= len(self._held.popitem(last=False)[1])


class _ObjectFile(AbstractBufferedFile):
    immutable = False  # reads go to the filesystem's shared blocks (set by StorageFileSystem._open)

    def _fetch_range(self, start: int, end: int) -> bytes:
        storage, key = self.fs.storage_of(self.path)
        if self.immutable:
            return self.fs.blocks.read(self.path, self.size, start, end, lambda s, e: storage.get_range(key, s, e - s))
        return storage.get_range(key, start, end - start)


class StorageFileSystem(AbstractFileSystem):
    """A read-only fsspec filesystem over CastSQL's own storage, for DuckDB.

    DuckDB hands it ``bucket/key`` paths; each bucket (or container) gets one
    storage. The size of an object under an opened table root is asked once
    per process: the format never rewrites such an object in place (data,
    tombstone, metadata and manifest objects have names of their own; only
    ``_latest_manifest`` and the mirrors' hints move); a data file's
    size is usually not asked at all, as its manifest told it
    (:meth:`know_size`). Every other object's size is asked each time DuckDB
    opens it.
    """

    cachable = False

    def __init__(self, scheme: str, storage: Storage, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.scheme = scheme
        self.protocol = GCS.names if scheme == GCS.name else AZURE.names
        self.config = storage.config  # type: ignore[attr-defined]
        self._base = storage
        self._buckets: dict[str, Storage] = {}
        self._tables: set[str] = set()
        self._sizes: dict[str, int] = {}
        self.blocks = Blocks()

    def know_size(self, uri: str, size: int) -> None:
        self._sizes[self._strip_protocol(uri)] = size

    def add_table(self, storage: Storage) -> None:
        self._tables.add(storage.root.split("://", 1)[1].rstrip("/") + "/")

    def _immutable(self, path: str) -> bool:
        return not path.endswith(_MOVING) and any(path.startswith(t) for t in self._tables)

    def _strip_protocol(self, path: str) -> str:
        return canonical_uri(path if "://" in path else f"{self.scheme}://{path}").split("://", 1)[1]

    def storage_of(self, path: str) -> tuple[Storage, str]:
        path = self._strip_protocol(path)
        bucket, _, key = path.partition("/")
        st = self._buckets.get(bucket)
        if st is None:
            st = self._buckets[bucket] = _sibling(self._base, bucket)
        return st, key

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        path = self._strip_protocol(path)
        size = self._sizes.get(path)
        if size is None:
            st, key = self.storage_of(path)
            size = st.size(key)  # type: ignore[attr-defined]
            if self._immutable(path):
                self._sizes[path] = size
        return {"name": path, "size": size, "type": "file"}

    def size(self, path: str) -> int:
        return self.info(path)["size"]

    def modified(self, path: str) -> datetime:
        return datetime.fromtimestamp(0, UTC)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Any]:
        st, key = self.storage_of(path)
        bucket = self._strip_protocol(path).partition("/")[0]
        prefix = key.rstrip("/") + "/" if key else ""
        found = [
            {"name": f"{bucket}/{o.key}", "size": o.size, "type": "file"}
            for o in st.list(prefix)
            if "/" not in o.key[len(prefix) :]
        ]
        if not found and key:
            found = [self.info(path)]
        return found if detail else [f["name"] for f in found]

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, **kwargs: Any) -> _ObjectFile:
        if mode != "rb":
            raise CastSQLError(
                f"{self.scheme}://{self._strip_protocol(path)}: CastSQL reads objects here, it does not write them"
            )
        path = self._strip_protocol(path)
        # An immutable object's reads go to the shared blocks, which fetch
        # aligned runs; others keep fsspec's read-ahead of the handle.
        immutable = self._immutable(path)
        f = _ObjectFile(
            self, path, mode, block_size=block_size or 4 * 2**20,
            cache_type="none" if immutable else "readahead", size=self.size(path),
        )  # fmt: skip
        f.immutable = immutable
        return f


def _sibling(storage: Storage, bucket: str) -> Storage:
    """A storage rooted at ``bucket`` with ``storage``'s settings and connections."""
    if isinstance(storage, GCSStorage):
        return GCSStorage(f"{GCS.prefix}{bucket}", storage.config, _http=storage._http)
    if isinstance(storage, AzureStorage):
        if bucket == storage.container:
            return AzureStorage(f"{AZURE.prefix}{bucket}", storage.config, _store=storage._store)
        return AzureStorage(f"{AZURE.prefix}{bucket}", storage.config)
    raise TypeError(storage)
