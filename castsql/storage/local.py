"""A table on a local directory: the embedded default, no server needed.

Create-only puts write a temporary file and ``link()`` it into place, which
fails atomically if the name exists, so no reader ever sees a half-written
object. Compare-and-swap holds an exclusive ``flock`` on the key's directory
while it compares and ``rename()``s, which is safe across processes on one
machine. ETags are the MD5 of the content, as on S3.
"""

from __future__ import annotations

import builtins
import errno
import fcntl
import hashlib
import os
import posixpath
import stat
import uuid
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from castsql.storage.base import ObjectInfo, ObjectNotFound, PreconditionFailed, Storage, StorageError, is_normal_key

_TMP_PREFIX = ".tmp-"


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _shown(uri: str) -> str:
    # A hostile key (a 400-digit version's manifest) stays readable in a one-line error.
    return uri if len(uri) <= 200 else uri[:200] + "…"


_ALONE = 8  # files of a data directory resolved one by one before it is listed (see data_uri)


class _Listing:
    """One data directory as LocalStorage.data_uri() found it."""

    __slots__ = ("inside", "leads_in", "outside")

    def __init__(self, leads_in: bool) -> None:
        self.leads_in = leads_in  # the directory itself resolves inside the root
        self.inside: set[str] = set()  # names that resolve inside the root
        self.outside: dict[str, str] = {}  # names that lead out, and where


class LocalStorage(Storage):
    """Objects as files below a directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).expanduser().resolve()
        self.root = str(self._root)
        # Directory (relative) -> (names in it that stay inside the root,
        # names that are links leading out, with where they lead), as one
        # scandir found them: data_uri() looks a data file up here.
        self._listings: dict[str, _Listing] = {}
        self._single: dict[str, int] = {}  # data directory -> names checked alone, before it is listed

    def __repr__(self) -> str:
        return f"LocalStorage({self.root!r})"

    def _path(self, key: str) -> Path:
        key = key.lstrip("/")
        if is_normal_key(key):
            # A key without "." segments leaves the (resolved) root only
            # through a symbolic link: look for one below the root, one lstat
            # per component, instead of resolve()'s walk from "/" (a query
            # reads two objects; this was a tenth of its Python time).
            path = self.root
            for part in key.split("/"):
                path = f"{path}/{part}"
                try:
                    if stat.S_ISLNK(os.lstat(path).st_mode):
                        break  # the exact check below
                except OSError:
                    return Path(f"{self.root}/{key}")  # nothing past a missing component
            else:
                return Path(path)
        resolved = (self._root / key).resolve()
        if resolved != self._root and self._root not in resolved.parents:
            raise StorageError(f"{key!r}: key escapes the storage root {self.root}")
        return resolved

    def uri(self, key: str) -> str:
        # Lexical, no file-system calls: resolving a version names every data
        # file, and one realpath() per key made 100,000 files take ~8 s.
        # get()/put() still go through _path(), which resolves symlinks; what
        # readers open for a data file comes from data_uri(), which refuses a
        # link leading out of the root.
        k = key.lstrip("/")
        if not k:
            return self.root
        if not is_normal_key(k):
            k = posixpath.normpath(k)
            if k == ".":
                return self.root
            if k == ".." or k.startswith("../"):
                raise StorageError(f"{key!r}: key escapes the storage root {self.root}")
        return f"{self.root}/{k}"

    def uris(self, keys: Iterable[str]) -> list[str]:
        prefix = self.root + "/"
        return [prefix + k for k in keys]

    def data_uris(self) -> Callable[[str], str]:
        return self.data_uri

    def data_uri(self, key: str) -> str:
        """The path a Parquet reader opens for data file ``key``; StorageError
        naming it when it resolves outside the root through a symbolic link
        (a data file replaced by a link to someone else's Parquet file, or a
        directory above it that is one). CastSQL's own reads check every key
        (``_path``); DuckDB, pyarrow and Spark open data files by this path
        and would follow the link, so it is checked here, where a version's
        files get their paths.

        Cost: the first few files of a data directory (the
        ``data/YYYY/MM/DD/HH`` hour a writer used) are resolved alone (one
        ``realpath`` each: an audit of one version opens one file of a
        directory of thousands, whose listing costs ~2 ms); past
        ``_ALONE`` the directory is listed once — one ``realpath`` and one
        ``scandir``, whose entries say which are links without a stat each —
        and every file after that is a set lookup; a name the listing did not
        hold (the next write of the same hour) costs one ``lstat``. What was
        looked up is kept for this store's life, so a link made after a
        version's files were looked up (a session that resolved the version
        before) is not seen: the directory is trusted between two looks, as it
        is while a read runs."""
        d, _, name = key.rpartition("/")
        listing = self._listings.get(d)
        if listing is not None and name in listing.inside:
            return f"{self.root}/{key}"  # the common case: a dict and a set lookup
        k = key.lstrip("/")
        if not is_normal_key(k):
            self._path(k)  # the exact check: resolve() and compare
            return self.uri(k)
        if listing is None:
            seen = self._single.get(d, 0)
            if seen < _ALONE:
                self._single[d] = seen + 1
                real = os.path.realpath(f"{self.root}/{k}")
                if not self._inside(real):
                    raise StorageError(
                        f"{self.root}/{k}: a symbolic link to {real}, outside the table root {self.root}; "
                        "a table's data files must lie inside it"
                    )
                return f"{self.root}/{k}"
            listing = self._list_dir(d)
        out = listing.outside.get(name)
        if out is None and name not in listing.inside:
            out = self._look(listing, f"{self.root}/{k}", name)
        if out is not None:
            raise StorageError(
                f"{self.root}/{k}: a symbolic link to {out}, outside the table root {self.root}; "
                "a table's data files must lie inside it"
            )
        return f"{self.root}/{k}"

    def _list_dir(self, d: str) -> _Listing:
        """Directory ``d`` listed for data_uri(): its names that stay inside the
        root and those that lead out (every name, when ``d`` itself is reached
        through a link leading out). Not kept for a directory that is not
        there (yet): what a reader opens there fails on its own."""
        base = f"{self.root}/{d}" if d else self.root
        listing = _Listing(self._inside(os.path.realpath(base)) if d else True)
        try:
            entries = list(os.scandir(base))
        except (FileNotFoundError, NotADirectoryError):
            return listing
        except OSError as e:
            raise self._failed(d, "list", e) from None
        for entry in entries:
            if not listing.leads_in or entry.is_symlink():
                real = os.path.realpath(entry.path)
                if listing.leads_in and self._inside(real):
                    listing.inside.add(entry.name)
                else:
                    listing.outside[entry.name] = real
            else:
                listing.inside.add(entry.name)
        self._listings[d] = listing
        return listing

    def _look(self, listing: _Listing, path: str, name: str) -> str | None:
        """One name a listing did not hold: where it leads when that is outside
        the root, else None (added to the listing when it exists)."""
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except OSError as e:
            raise self._failed(path.removeprefix(self.root + "/"), "look up", e) from None
        if not listing.leads_in or stat.S_ISLNK(st.st_mode):
            real = os.path.realpath(path)
            if not listing.leads_in or not self._inside(real):
                listing.outside[name] = real
                return real
        listing.inside.add(name)
        return None

    def _inside(self, real: str) -> bool:
        return real == self.root or real.startswith(self.root + "/")

    def _failed(self, key: str, action: str, e: OSError) -> StorageError:
        """Any other error of the file system (a name too long, no permission,
        a loop of links) as CastSQL's, naming the object: every storage error
        a caller sees is a :class:`StorageError`, as on the object stores."""
        try:
            where = _shown(self.uri(key))
        except StorageError:
            where = _shown(f"{self.root}/{key}")
        return StorageError(f"{where}: cannot {action}: {e.strerror or e}")

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(self.uri(key)) from None
        except OSError as e:
            raise self._failed(key, "read", e) from None

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        data = self.get(key)
        return data, _etag(data)

    def get_range(self, key: str, start: int, length: int) -> bytes:
        try:
            with open(self._path(key), "rb") as f:
                f.seek(start)
                return f.read(length)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(self.uri(key)) from None
        except OSError as e:
            raise self._failed(key, "read", e) from None

    def _write_tmp(self, path: Path, data: bytes, durable: bool = True) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f"{_TMP_PREFIX}{path.name}.{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    def put(self, key: str, data: bytes) -> None:
        try:
            path = self._path(key)
            tmp = self._write_tmp(path, data)
            os.replace(tmp, path)
        except OSError as e:
            raise self._failed(key, "write", e) from None

    def put_hint(self, key: str, data: bytes) -> None:
        # Renamed over, so a reader sees the old bytes or the new, never a part.
        try:
            path = self._path(key)
            os.replace(self._write_tmp(path, data, durable=False), path)
        except OSError as e:
            raise self._failed(key, "write", e) from None

    def put_if_absent(self, key: str, data: bytes) -> str:
        try:
            path = self._path(key)
            tmp = self._write_tmp(path, data)
        except OSError as e:
            raise self._failed(key, "write", e) from None
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise PreconditionFailed(self.uri(key), "object already exists") from None
        except OSError as e:
            raise self._failed(key, "write", e) from None
        finally:
            tmp.unlink(missing_ok=True)
        return _etag(data)

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        try:
            return self._put_if_match(key, data, etag)
        except OSError as e:
            raise self._failed(key, "write", e) from None

    def _put_if_match(self, key: str, data: bytes, etag: str) -> str:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_tmp(path, data)
        try:
            dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                fcntl.flock(dir_fd, fcntl.LOCK_EX)
                try:
                    current = path.read_bytes()
                except FileNotFoundError:
                    raise PreconditionFailed(self.uri(key), "object does not exist") from None
                if _etag(current) != etag:
                    raise PreconditionFailed(self.uri(key), "object changed (ETag mismatch)")
                os.replace(tmp, path)
            finally:
                os.close(dir_fd)  # closing releases the flock
        finally:
            tmp.unlink(missing_ok=True)
        return _etag(data)

    def exists(self, key: str) -> bool:
        try:
            return self._path(key).is_file()
        except OSError as e:
            raise self._failed(key, "look up", e) from None

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        try:
            yield from self._list(prefix)
        except OSError as e:
            raise self._failed(prefix, "list", e) from None

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        prefix = prefix.lstrip("/")
        # Walk only the directory part of the prefix, then filter by the rest.
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self._path(base) if base else self._root
        if not start.is_dir():
            return
        root = str(self._root)
        for dirpath, dirnames, filenames in os.walk(start):
            dirnames.sort()
            # Keys by string, not pathlib: an audit lists a thousand manifests,
            # and a Path per file cost ~0.1 ms each.
            rel = os.path.relpath(dirpath, root).replace(os.sep, "/")
            head = "" if rel == "." else rel + "/"
            for name in sorted(filenames):
                if name.startswith(_TMP_PREFIX):
                    continue
                key = head + name
                if not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue  # deleted while we walked
                yield ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        try:
            start = self._path(prefix) if prefix.strip("/") else self._root
            if not start.is_dir():
                return []
            return sorted(e.name for e in os.scandir(start) if e.is_dir() and not e.name.startswith("."))
        except OSError as e:
            raise self._failed(prefix, "list", e) from None

    def delete(self, key: str) -> None:
        try:
            self._path(key).unlink()
        except FileNotFoundError:
            pass
        except OSError as e:
            if e.errno != errno.ENOENT:
                raise self._failed(key, "delete", e) from None

    def child(self, prefix: str) -> LocalStorage:
        try:
            return LocalStorage(self._path(prefix))
        except OSError as e:
            raise self._failed(prefix, "open", e) from None
