"""Storage backends behind one interface: a local directory, S3 and Azure Blob
Storage / ADLS Gen2 (obstore), and Google Cloud Storage (its JSON API)."""

from __future__ import annotations

from castsql.storage.base import (
    ObjectInfo,
    ObjectNotFound,
    PreconditionFailed,
    Storage,
    StorageError,
    StorageUnreachable,
)
from castsql.storage.config import S3Config
from castsql.storage.uris import AZURE, GCS, OBJECT_STORE_SCHEMES, S3, SCHEMES, is_file_uri, local_path, scheme_of

__all__ = [
    "OBJECT_STORE_SCHEMES",
    "ObjectInfo",
    "ObjectNotFound",
    "PreconditionFailed",
    "S3Config",
    "Storage",
    "StorageError",
    "StorageUnreachable",
    "open_storage",
]


def open_storage(uri: str, *, s3: S3Config | None = None) -> Storage:
    """The storage rooted at ``uri``: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``az://container/prefix`` (or ADLS Gen2's ``abfss://container@account.dfs.core.windows.net/prefix``)
    or a local path (``file:`` URIs accepted); every spelling of each is in
    :mod:`castsql.storage.uris`. GCS and Azure take their
    settings from each cloud's usual environment variables
    (:class:`~castsql.storage.gcs.GCSConfig`, :class:`~castsql.storage.azure.AzureConfig`).

    Example::

        >>> open_storage("/tmp/t").root
        '/tmp/t'
    """
    scheme = scheme_of(uri)
    if scheme is S3:
        from castsql.storage.s3 import S3Storage

        return S3Storage(uri, s3 or S3Config.from_env())
    if scheme is GCS:
        from castsql.storage.gcs import GCSConfig, GCSStorage

        return GCSStorage(uri, GCSConfig.from_env())
    if scheme is AZURE:
        from castsql.storage.azure import AzureConfig, AzureStorage

        return AzureStorage(uri, AzureConfig.from_env())
    if not is_file_uri(uri):
        raise StorageError(
            f"{uri}: unsupported URI scheme (use a local path, "
            + ", ".join(s.example for s in SCHEMES[:-1])
            + f" or {SCHEMES[-1].example})"
        )
    from castsql.storage.local import LocalStorage

    return LocalStorage(local_path(uri))
