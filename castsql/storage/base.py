"""The storage interface every backend implements.

A :class:`Storage` is rooted at one URI (a table or a warehouse) and speaks in
keys relative to that root, always ``/``-separated. It knows nothing of
manifests, Parquet or DuckDB: it moves bytes, and offers the two conditional
writes the commit protocol is built on.

Example::

    >>> import tempfile
    >>> from castsql.storage import open_storage
    >>> st = open_storage(tempfile.mkdtemp())
    >>> etag = st.put_if_absent("hello.txt", b"hi")
    >>> st.get("hello.txt")
    b'hi'
    >>> st.put_if_absent("hello.txt", b"again")   # doctest: +ELLIPSIS
    Traceback (most recent call last):
    castsql.errors.PreconditionFailed: .../hello.txt: object already exists
"""

from __future__ import annotations

import abc
import builtins
import concurrent.futures
import os
import re
import threading
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

from castsql.errors import ObjectNotFound, PreconditionFailed, StorageError, StorageUnreachable

T = TypeVar("T")
R = TypeVar("R")

__all__ = [
    "ObjectInfo",
    "ObjectNotFound",
    "ObjectStore",
    "PreconditionFailed",
    "Storage",
    "StorageError",
    "StorageUnreachable",
    "allow_waits",
    "cancel_waits",
    "is_normal_key",
    "key_problem",
    "split_bucket_uri",
    "waits_cancelled",
]

# Characters a table's object key may not hold. Readers hand keys to DuckDB,
# which expands glob characters and honours a URL's query string (one
# ``?s3_endpoint=`` sends the signed request, credentials and all, to another
# host), so keys must be plain: no query or fragment, no glob, no escapes, no
# control characters or NUL.
_NOT_PLAIN = re.compile(r"[?#*\[\]{}\\\x00-\x1f\x7f]")


def key_problem(key: str) -> str | None:
    """Why ``key`` is not a plain object key, or None if it is.

    >>> key_problem("data/a.parquet"), key_problem("data/a.parquet?s3_endpoint=evil")
    (None, "holds '?' (keys may not hold ? # * [ ] { } \\\\ or control characters)")
    """
    m = _NOT_PLAIN.search(key)
    if m is None:
        return None
    return f"holds {m.group(0)!r} (keys may not hold ? # * [ ] {{ }} \\ or control characters)"


def is_normal_key(key: str) -> bool:
    """True for a plain key that needs no normalising: relative, no ``.``/``..``
    or empty segment, no trailing ``/`` (names starting with ``.`` take the
    slow, exact path too), none of the characters :func:`key_problem` refuses.
    Checked without touching the file system.

    >>> is_normal_key("data/2026/a.parquet"), is_normal_key("data/../x"), is_normal_key("/abs"), is_normal_key("a*")
    (True, False, False, False)
    """
    return (
        bool(key)
        and key[0] not in "/."
        and key[-1] != "/"
        and "/." not in key
        and "//" not in key
        and _NOT_PLAIN.search(key) is None
    )


_cancel = threading.Event()


def cancel_waits() -> None:
    """Make every storage call now waiting on the network give up (the shell's
    Ctrl-C: its queries run in a worker thread, out of KeyboardInterrupt's reach)."""
    _cancel.set()


def allow_waits() -> None:
    """Undo :func:`cancel_waits` (before the next command)."""
    _cancel.clear()


def waits_cancelled() -> bool:
    return _cancel.is_set()


_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_worker = threading.local()


def _mark_worker() -> None:
    _worker.active = True


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child has none of the parent's threads


os.register_at_fork(after_in_child=_forget_pool)


def _shared_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="castsql-io", initializer=_mark_worker)
        return _pool


def overlapped(fn: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """``fn`` of each item, in order, up to 16 at a time when there are
    several: on an object store each is a round trip, and they overlap.
    The threads are shared by the process (starting 16 of them per call
    cost an audit's walk more than its reads); a call made from one of
    them runs its items in turn, so nested calls cannot wait on each other.

    >>> overlapped(lambda v: v * 2, [1, 2, 3])
    [2, 4, 6]
    """
    if len(items) <= 1 or getattr(_worker, "active", False):
        return [fn(x) for x in items]
    return list(_shared_pool().map(fn, items))


def overlapped_iter(fn: Callable[[T], R], items: Sequence[T]) -> Generator[R, None, None]:
    """:func:`overlapped` for a caller that may stop early: ``fn`` of each
    item, in order, as each is ready, on the same threads. Closing the
    iterator (``with contextlib.closing(…)``, or an error) cancels the items
    not started and waits for those running, so none still reads after the
    caller has gone on (a key check stops at its limit, not after every
    file). Made from one of the threads, it runs its items in turn, one per
    ``next``.

    >>> import contextlib
    >>> with contextlib.closing(overlapped_iter(lambda v: v * 2, [1, 2, 3, 4])) as doubled:
    ...     [next(doubled), next(doubled)]
    [2, 4]
    """
    if len(items) <= 1 or getattr(_worker, "active", False):
        yield from map(fn, items)  # lazily: what the caller never asks for is never run
        return
    pool = _shared_pool()
    futures = [pool.submit(fn, x) for x in items]
    try:
        for f in futures:
            yield f.result()
    finally:
        running = [f for f in futures if not f.cancel()]  # a finished or running one cannot be cancelled
        concurrent.futures.wait(running)


def in_background(fn: Any, *args: Any, **kwargs: Any) -> concurrent.futures.Future:
    """``fn(*args, **kwargs)`` on a daemon thread of its own: one a wait was
    abandoned on must not hold up the interpreter's exit, as a pool's
    threads would (they are joined at exit).

    >>> in_background(sum, [1, 2]).result()
    3
    """
    future: concurrent.futures.Future = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:  # handed to the waiting thread
            future.set_exception(e)

    threading.Thread(target=run, name="castsql-store", daemon=True).start()
    return future


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float  # seconds since the epoch, UTC


class Storage(abc.ABC):
    """Bytes under one root URI, with create-only and compare-and-swap puts."""

    root: str

    @abc.abstractmethod
    def uri(self, key: str) -> str:
        """The absolute URI (local path or ``s3://…``) of ``key``."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object. Raises :class:`ObjectNotFound`."""

    @abc.abstractmethod
    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        """The whole object and the ETag of exactly those bytes."""

    @abc.abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` bytes from ``start`` (fewer at the end of the object)."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Unconditional put, for objects whose name no one else can pick (uuid names)."""

    @abc.abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> str:
        """Create ``key`` only if it does not exist; atomic. Returns the new ETag.

        Raises :class:`PreconditionFailed` if it exists.
        """

    @abc.abstractmethod
    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        """Replace ``key`` only if its ETag is still ``etag``. Returns the new ETag.

        Raises :class:`PreconditionFailed` if it changed or is missing.
        """

    @abc.abstractmethod
    def exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix`` (recursive)."""

    @abc.abstractmethod
    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        """Names of the immediate "sub-directories" below ``prefix`` (for warehouses)."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Remove ``key``; a missing key is not an error (GC may race itself)."""

    def repeated(self, write: Callable[[str, bytes], T], key: str, data: bytes) -> T:
        """``write(key, data)``, one of this storage's puts, tried again after a
        try whose answer never came, while the store's attempts last. Only for
        a write a repeat cannot harm (an overwrite, a unique key's create) or
        whose caller checks what landed: a repeat of a create that did land
        answers :class:`PreconditionFailed`.

        >>> storage.repeated(storage.put_if_absent, "manifest/v00000007.json", body)  # doctest: +SKIP
        """
        return write(key, data)

    def put_hint(self, key: str, data: bytes) -> None:
        """Unconditional put of an object readers take only as a hint, one
        they can do without (Iceberg's ``version-hint.text``: a reader that
        cannot use it lists the versions): visible to every reader at once,
        but not made durable on its own. After a power loss it may hold what
        it held before. On an object store every put is durable anyway; a
        local directory skips the fsync, as Iceberg's Hadoop tables do.

        >>> storage.put_hint("_iceberg/metadata/version-hint.text", b"7")  # doctest: +SKIP
        """
        self.put(key, data)

    def put_new(self, key: str, data: bytes) -> None:
        """Create-only put of an object with a unique (uuid) name.

        A client that retries a put which did land sees its own object and a
        412; an object holding exactly ``data`` is therefore a success.
        """
        try:
            self.put_if_absent(key, data)
        except PreconditionFailed:
            try:
                if self.get(key) == data:
                    return
            except ObjectNotFound:
                pass
            raise

    def uris(self, keys: Iterable[str]) -> builtins.list[str]:
        """``uri()`` of many normalised keys (as ``to_table_key`` returns them)."""
        return [self.uri(k) for k in keys]

    def data_uri(self, key: str) -> str:
        """What a Parquet reader opens for data file ``key`` (see :meth:`data_uris`)."""
        return self.uri(key)

    def data_uris(self) -> Callable[[str], str]:
        """The function that gives, for a data file's normalised key, what a
        Parquet reader (DuckDB, pyarrow, Spark) opens. On an object store, its
        URI; a local store also refuses a key that leads out of its root
        through a symbolic link (:class:`castsql.storage.local.LocalStorage`)."""
        prefix = self.root.rstrip("/") + "/"
        if self.uri("k") == prefix + "k":
            return lambda key: prefix + key  # resolving a version names every data file: no call per key
        return self.uri

    def child(self, prefix: str) -> Storage:
        """A storage rooted at ``prefix`` below this one (a table in a warehouse)."""
        raise NotImplementedError

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""


def split_bucket_uri(
    uri: str, schemes: tuple[str, ...], example: str, name_rule: tuple[str, str] | None = None
) -> tuple[str, str]:
    """``scheme://bucket/some/prefix/`` -> ``("bucket", "some/prefix")`` for one
    of ``schemes``; ``example`` spells a good URI in the error. ``name_rule``:
    a pattern every bucket (or container) name of the store matches, and how
    the error says it; a name no store could hold is refused before any
    request (the store would answer with a 403 or a 400 that names neither).

    >>> split_bucket_uri("s3a://bkt/x/y/", ("s3://", "s3a://"), "s3://bucket/prefix")
    ('bkt', 'x/y')
    """
    for scheme in schemes:
        if uri.startswith(scheme):
            rest = uri[len(scheme) :]
            break
    else:
        raise StorageError(f"{uri}: not a {schemes[0]} URI")
    bucket, _, prefix = rest.partition("/")
    what = example.split("://")[1].split("/")[0]
    if not bucket:
        raise StorageError(f"{uri}: no {what} in the URI (use {example})")
    if name_rule is not None:
        check_bucket_name(uri, bucket, what, name_rule)
    return bucket, prefix.strip("/")


def check_bucket_name(uri: str, name: str, what: str, rule: tuple[str, str]) -> None:
    """StorageError naming ``uri`` unless ``name`` (its bucket or container,
    ``what``) matches ``rule``'s pattern; the error says the rule."""
    if not re.fullmatch(rule[0], name):
        raise StorageError(f"{uri}: {name!r} cannot be a {what} name ({rule[1]})")


class ObjectStore(Storage):
    """What every object store backend shares: keys below ``prefix`` in one
    bucket (or container), and URIs under ``root``."""

    prefix: str

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

    def _key(self, key: str) -> str:
        key = key.lstrip("/")
        if not key:
            raise StorageError(f"{self.root}: empty object key")
        return f"{self.prefix}/{key}" if self.prefix else key

    def uri(self, key: str) -> str:
        key = key.lstrip("/")
        return f"{self.root}/{key}" if key else self.root

    def get(self, key: str) -> bytes:
        return self.get_with_etag(key)[0]

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise StorageError(f"{self.uri(key)}: invalid range start={start} length={length}")
        if length == 0:  # no store answers an empty range: ask whether the object is there
            if not self.exists(key):
                raise ObjectNotFound(self.uri(key))
            return b""
        return self._read_range(key, start, length)

    @abc.abstractmethod
    def _read_range(self, key: str, start: int, length: int) -> bytes:
        """``length`` (> 0) bytes from ``start``: fewer at the end, none past it."""
