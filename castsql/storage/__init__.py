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


OBJECT_STORE_SCHEMES = ("s3://", "s3a://", "gs://", "gcs://", "az://", "azure://", "abfss://", "abfs://")


def open_storage(uri: str, *, s3: S3Config | None = None) -> Storage:
    """The storage rooted at ``uri``: ``s3://bucket/prefix``, ``gs://bucket/prefix``,
    ``az://container/prefix`` (or ADLS Gen2's ``abfss://container@account.dfs.core.windows.net/prefix``)
    or a local path (``file:`` URIs accepted). GCS and Azure take their
    settings from each cloud's usual environment variables
    (:class:`~castsql.storage.gcs.GCSConfig`, :class:`~castsql.storage.azure.AzureConfig`).

    Example::

        >>> open_storage("/tmp/t").root
        '/tmp/t'
    """
    if uri.startswith(("s3://", "s3a://")):
        from castsql.storage.s3 import S3Storage

        return S3Storage(uri, s3 or S3Config.from_env())
    if uri.startswith(("gs://", "gcs://")):
        from castsql.storage.gcs import GCSConfig, GCSStorage

        return GCSStorage(uri, GCSConfig.from_env())
    if uri.startswith(("az://", "azure://", "abfss://", "abfs://")):
        from castsql.storage.azure import AzureConfig, AzureStorage

        return AzureStorage(uri, AzureConfig.from_env())
    if "://" in uri and not uri.startswith("file://"):
        raise StorageError(
            f"{uri}: unsupported URI scheme (use a local path, s3://bucket/prefix, gs://bucket/prefix "
            "or az://container/prefix)"
        )
    from castsql.storage.local import LocalStorage

    return LocalStorage(_local_path(uri))


def _local_path(uri: str) -> str:
    """The path of a ``file:`` URI in any of its spellings (``file:///t``,
    ``file://localhost/t``, and ``file:/t``, which is how Spark qualifies a
    path); anything else is a path as it is."""
    for prefix in ("file://localhost/", "file:///"):
        if uri.startswith(prefix):
            return "/" + uri[len(prefix) :]
    if uri.startswith("file:/") and not uri.startswith("file://"):
        return uri.removeprefix("file:")
    return uri.removeprefix("file://")
