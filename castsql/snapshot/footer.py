"""Row-group sizes of a data file whose manifest entry does not list them
(manifests written by other tools): read from the Parquet footer with two
ranged reads, never the whole file."""

from __future__ import annotations

import pyarrow.parquet as pq

from castsql.errors import FormatError
from castsql.storage import Storage
from castsql.storage.ranged import open_ranged


def row_group_rows(storage: Storage, key: str, size: int) -> tuple[int, ...]:
    try:
        md = pq.read_metadata(open_ranged(storage, key, size))
    except (OSError, ValueError) as e:
        raise FormatError(f"{storage.uri(key)}: cannot read the Parquet footer ({e})") from None
    return tuple(md.row_group(i).num_rows for i in range(md.num_row_groups))
