"""What a DuckDB connection needs to read each object store's Parquet files.

- S3: httpfs, with CastSQL's secret (:func:`castsql.engine.duckdb.duck.configure_s3`).
- GCS and Azure: an fsspec filesystem registered on the connection, which
  reads through CastSQL's own storage (the same credentials, timeouts and
  errors): :class:`castsql.storage.objectfs.StorageFileSystem`. Measured
  against the alternatives (``bench/requests_bench.py``, 20 ms per request):
  DuckDB's ``azure`` extension opened the one data file of a selective query
  16 times (29 requests before the column reads, against 5 here, and 1.6x
  the time); DuckDB's own ``gs://`` goes through GCS's S3-interoperability
  API with HMAC keys, which application default credentials do not give and
  emulators do not serve.

Credentials never land in a setting a query can read: S3's live in DuckDB's
secret manager, which redacts them; GCS's and Azure's stay in Python, in the
registered filesystem.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import duckdb

from castsql.storage import S3Config, Storage
from castsql.storage.uris import AZURE, GCS, S3, canonical_scheme

if TYPE_CHECKING:
    from castsql.storage.objectfs import StorageFileSystem

# The stores DuckDB reads through a registered filesystem, by canonical scheme.
_REGISTERED = (GCS.name, AZURE.name)


# One filesystem per store and process: what it caches (the sizes of immutable
# table objects) holds for every connection.
_FILESYSTEMS: dict[str, StorageFileSystem] = {}


def make_readable(con: duckdb.DuckDBPyConnection, storage: Storage, s3: S3Config | None = None) -> None:
    """Let ``con`` read the objects of ``storage`` (idempotent)."""
    root = storage.root
    if root.startswith(S3.prefix):
        from castsql.engine.duckdb.duck import configure_s3

        configure_s3(con, getattr(storage, "config", None) or s3 or S3Config.from_env())
    elif (scheme := canonical_scheme(root)) in _REGISTERED:
        register(con, scheme, storage)


def register(con: duckdb.DuckDBPyConnection, scheme: str, storage: Storage) -> None:
    """Read the store's URLs (``gs://``, ``az://``) on ``con`` through CastSQL's storage."""
    from castsql.storage.objectfs import StorageFileSystem

    fs = _FILESYSTEMS.get(scheme)
    if fs is None or fs.config != storage.config:  # type: ignore[attr-defined]
        fs = _FILESYSTEMS[scheme] = StorageFileSystem(scheme, storage)
    fs.add_table(storage)
    if scheme not in con.list_filesystems():
        con.register_filesystem(fs)


def know_sizes(files: Iterable[tuple[str, int]]) -> None:
    """Tell the registered filesystems the sizes of data files, as their
    manifest records them, so that DuckDB's first open of each costs no
    request for its size. Data files are immutable: a manifest's size is the
    object's (a wrong one fails the read of that file, as a wrong footer
    would). Files of other stores are passed over.

    >>> know_sizes([("/tmp/t/data/a.parquet", 10)])  # a local file: nothing to tell
    """
    for uri, size in files:
        fs = _FILESYSTEMS.get(canonical_scheme(uri))
        if fs is None:
            return  # a view's files are on one store: none registered, nothing to tell
        fs.know_size(uri, size)
