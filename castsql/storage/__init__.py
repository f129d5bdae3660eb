"""Storage backends: a local directory and S3 (s3fs), behind one interface."""

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
    """The storage rooted at ``uri``: ``s3://bucket/prefix`` or a local path
    (``file:`` URIs accepted).

    Example::

        >>> open_storage("/tmp/t").root
        '/tmp/t'
    """
    if uri.startswith(("s3://", "s3a://")):
        from castsql.storage.s3 import S3Storage

        return S3Storage(uri, s3 or S3Config.from_env())
    if "://" in uri and not uri.startswith("file://"):
        raise StorageError(f"{uri}: unsupported URI scheme (use a local path or s3://bucket/prefix)")
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
