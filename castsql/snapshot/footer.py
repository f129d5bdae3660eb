"""Row-group sizes of a data file whose manifest entry does not list them
(manifests written by other tools): read from the Parquet footer with two
ranged reads, never the whole file."""

from __future__ import annotations

import io

import pyarrow.parquet as pq

from castsql.errors import FormatError
from castsql.storage import Storage


class _RangeFile(io.RawIOBase):
    """A read-only seekable file over ranged GETs of one object."""

    def __init__(self, storage: Storage, key: str, size: int) -> None:
        self._st, self._key, self._size, self._pos = storage, key, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, b) -> int:  # type: ignore[override]
        n = min(len(b), max(0, self._size - self._pos))
        if n == 0:
            return 0
        data = self._st.get_range(self._key, self._pos, n)
        b[: len(data)] = data
        self._pos += len(data)
        return len(data)


def row_group_rows(storage: Storage, key: str, size: int) -> tuple[int, ...]:
    try:
        md = pq.read_metadata(io.BufferedReader(_RangeFile(storage, key, size), buffer_size=64 * 1024))
    except (OSError, ValueError) as e:
        raise FormatError(f"{storage.uri(key)}: cannot read the Parquet footer ({e})") from None
    return tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
