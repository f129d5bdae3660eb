"""A table on a local directory: the embedded default, no server needed.

Create-only puts write a temporary file and ``link()`` it into place, which
fails atomically if the name exists, so no reader ever sees a half-written
object. Compare-and-swap holds an exclusive ``flock`` on the key's directory
while it compares and ``rename()``s, which is safe across processes on one
machine. ETags are the MD5 of the content, as on S3.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import posixpath
import stat
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from castsql.storage.base import ObjectInfo, ObjectNotFound, PreconditionFailed, Storage, StorageError, is_normal_key

_TMP_PREFIX = ".tmp-"


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def _shown(uri: str) -> str:
    # A hostile key (a 400-digit version's manifest) stays readable in a one-line error.
    return uri if len(uri) <= 200 else uri[:200] + "…"


class LocalStorage(Storage):
    """Objects as files below a directory."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self._root = Path(root).expanduser().resolve()
        self.root = str(self._root)

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
        path = (self._root / key).resolve()
        if path != self._root and self._root not in path.parents:
            raise StorageError(f"{key!r}: key escapes the storage root {self.root}")
        return path

    def uri(self, key: str) -> str:
        # Lexical, no file-system calls: resolving a version names every data
        # file, and one realpath() per key made 100,000 files take ~8 s.
        # get()/put() still go through _path(), which resolves symlinks; DuckDB
        # opens data files by this name and follows a symlink planted inside the
        # root (docs/RELIABILITY.md: the table directory itself is trusted).
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

    def _write_tmp(self, path: Path, data: bytes) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f"{_TMP_PREFIX}{path.name}.{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
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

    def list_dirs(self, prefix: str = "") -> list[str]:
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
