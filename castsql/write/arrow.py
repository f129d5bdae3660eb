"""Data handed to a writer, as one Arrow table: what every write path accepts.

Example::

    >>> import pyarrow as pa
    >>> as_arrow(pa.record_batch({"id": [1]}), "append").num_rows
    1
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from castsql.errors import CastSQLError


def as_arrow(data: Any, where: str) -> pa.Table:
    """Arrow, pandas, polars or anything with ``__arrow_c_stream__`` as one Arrow table."""
    if isinstance(data, pa.Table):
        return data
    if isinstance(data, pa.RecordBatch):
        return pa.Table.from_batches([data])
    if isinstance(data, pa.RecordBatchReader):
        return data.read_all()
    mod = type(data).__module__.split(".", 1)[0]
    if mod == "pandas":
        return pa.Table.from_pandas(data, preserve_index=False)
    if mod == "polars":
        return data.to_arrow()
    if hasattr(data, "__arrow_c_stream__"):
        return pa.table(data)
    raise CastSQLError(f"{where}: expected Arrow, pandas or polars data, got {type(data).__name__}")
