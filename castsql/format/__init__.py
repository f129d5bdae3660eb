"""The table format: layout, manifests, tombstones, commits, and data file writing.

Nothing here imports DuckDB, Spark or the shell.
"""

from castsql.format.change import Change
from castsql.format.datafiles import write_data_files
from castsql.format.log import TableLog
from castsql.format.manifest import DataFile, Manifest
from castsql.format.metadata import RetryPolicy, TableMetadata
from castsql.format.schema import Column, Schema
from castsql.format.tombstone import KeyRangeDelete, PositionDelete, RowGroupDelete, TombstoneRecord

__all__ = [
    "Change",
    "Column",
    "DataFile",
    "KeyRangeDelete",
    "Manifest",
    "PositionDelete",
    "RetryPolicy",
    "RowGroupDelete",
    "Schema",
    "TableLog",
    "TableMetadata",
    "TombstoneRecord",
    "write_data_files",
]
