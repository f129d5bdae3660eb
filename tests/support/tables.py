"""Builders of real tables for engine tests (single-node writer, no Spark)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pyarrow as pa
from pyroaring import BitMap

from castsql.format import KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog, write_data_files
from castsql.storage import Storage

SCHEMA = pa.schema(
    [("id", pa.int64()), ("grp", pa.string()), ("val", pa.float64()), ("ts", pa.timestamp("us", tz="UTC"))]
)
T0 = datetime(2025, 1, 1, tzinfo=UTC)


def rows(lo: int, hi: int) -> pa.Table:
    ids = list(range(lo, hi))
    return pa.table(
        {
            "id": ids,
            "grp": [f"g{i % 7}" for i in ids],
            "val": [i * 0.5 for i in ids],
            "ts": [T0 + timedelta(minutes=i) for i in ids],
        },
        schema=SCHEMA,
    )


@dataclass
class Events:
    """The ``events`` table, with the ids live at each version (the model)."""

    log: TableLog
    live: dict[int, set[int]] = field(default_factory=dict)


def build_events(storage: Storage) -> Events:
    """v1, v2: appends of ids 0-999 and 1000-1999 (row groups of 100);
    v3: row group 2 of the first file (ids 200-299); v4: key range 1500-1599;
    v5: positions 0, 5, 17 of row group 0 of file 1 and file position 999 of
    file 2 (id 1999); v6: append 2000-2099."""
    log = TableLog.create(storage, SCHEMA, primary_key="id")
    ev = Events(log, {0: set()})
    f1 = log.append(write_data_files(storage, rows(0, 1000), row_group_size=100)).data_files[0]
    ev.live[1] = set(range(1000))
    m2 = log.append(write_data_files(storage, rows(1000, 2000), row_group_size=100))
    f2 = next(f for f in m2.data_files if f.path != f1.path)
    ev.live[2] = ev.live[1] | set(range(1000, 2000))
    log.delete([RowGroupDelete(f1.name, 2)])
    ev.live[3] = ev.live[2] - set(range(200, 300))
    log.delete([KeyRangeDelete(f2.name, 1500, 1599)])
    ev.live[4] = ev.live[3] - set(range(1500, 1600))
    log.delete([PositionDelete(f1.name, 0, BitMap([0, 5, 17])), PositionDelete(f2.path, None, BitMap([999]))])
    ev.live[5] = ev.live[4] - {0, 5, 17, 1999}
    log.append(write_data_files(storage, rows(2000, 2100), row_group_size=100))
    ev.live[6] = ev.live[5] | set(range(2000, 2100))
    return ev
