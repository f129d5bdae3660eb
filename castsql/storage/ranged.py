"""A seekable, read-only file over ranged GETs of one object, for readers
(Parquet footers and row groups) that must not download whole objects.

Example::

    >>> import tempfile
    >>> from castsql.storage import open_storage
    >>> st = open_storage(tempfile.mkdtemp())
    >>> _ = st.put("x.bin", b"0123456789")
    >>> f = open_ranged(st, "x.bin", 10)
    >>> _ = f.seek(-3, 2); f.read()
    b'789'
"""

from __future__ import annotations

import io
from typing import Any

from castsql.storage.base import Storage

TAIL_BYTES = 256 * 1024


class RangedFile(io.RawIOBase):
    """Reads of ``key`` as ranged GETs. The first read that falls into the
    object's last ``TAIL_BYTES`` fetches that whole tail in one request: it
    holds the Parquet footer, which readers parse in several small reads."""

    def __init__(self, storage: Storage, key: str, size: int) -> None:
        self._st, self._key, self._size, self._pos = storage, key, size, 0
        self._tail_start = max(0, size - TAIL_BYTES)
        self._tail: bytes | None = None

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = {0: 0, 1: self._pos, 2: self._size}[whence] + offset
        return self._pos

    def readinto(self, b: Any) -> int:
        n = min(len(b), max(0, self._size - self._pos))
        if n == 0:
            return 0
        if self._pos >= self._tail_start:
            if self._tail is None:
                self._tail = self._st.get_range(self._key, self._tail_start, self._size - self._tail_start)
            off = self._pos - self._tail_start
            data = self._tail[off : off + n]
        else:
            data = self._st.get_range(self._key, self._pos, n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def open_ranged(storage: Storage, key: str, size: int, buffer_size: int = 64 * 1024) -> io.BufferedReader:
    """``key`` (``size`` bytes) as a buffered, seekable binary file."""
    return io.BufferedReader(RangedFile(storage, key, size), buffer_size=buffer_size)
