"""A table on S3 or any S3-compatible store (MinIO, SeaweedFS, R2, …), through obstore.

The commit protocol rests on S3's conditional writes: a create-only put sends
``If-None-Match: *`` and a compare-and-swap sends ``If-Match: "<etag>"``; the
server decides atomically. A lost race comes back as 412 (or 409 for two
conditional writes in flight at once) and is raised as
:class:`PreconditionFailed`; anything else is a :class:`StorageError` naming
the ``s3://`` URI.

Every request goes straight to the S3 API (no listing cache, no HEAD + GET
pairs), so a read's ETag always describes exactly the bytes returned.
obstore replaced s3fs here (issue 36): a fresh process no longer pays ~0.4 s
to import s3fs and build botocore's client, and the requests are the same
(``bench/requests_bench.py``).

Example::

    >>> from castsql.storage import S3Config
    >>> st = S3Storage("s3://bucket/warehouse", S3Config(endpoint_url="http://127.0.0.1:8333"))
    >>> st.uri("t/_pointer")
    's3://bucket/warehouse/t/_pointer'
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from castsql.storage.base import StorageError, split_bucket_uri
from castsql.storage.config import S3Config
from castsql.storage.obstore_base import ObstoreStorage, retry_config
from castsql.storage.uris import S3

if TYPE_CHECKING:
    from obstore.store import ClientConfig

# Any S3 bucket name, legacy ones (uppercase, underscores, up to 255) included.
_BUCKET_NAME = (r"[A-Za-z0-9._-]{1,255}", "up to 255 letters, digits, '.', '-' or '_'")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``.

    >>> parse_s3_uri("s3a://b/x/y/")
    ('b', 'x/y')
    """
    return split_bucket_uri(uri, S3.prefixes, S3.example, _BUCKET_NAME)


def _make_store(bucket: str, config: S3Config) -> Any:
    from obstore.store import S3Store

    options: ClientConfig = {
        "connect_timeout": timedelta(seconds=config.connect_timeout),
        "timeout": timedelta(seconds=config.read_timeout),
    }
    kwargs: dict[str, Any] = {"region": config.region}
    if config.key and config.secret:
        # Given keys are a whole identity: obstore would otherwise add an
        # AWS_SESSION_TOKEN of the environment to them (empty means none).
        kwargs["access_key_id"] = config.key
        kwargs["secret_access_key"] = config.secret
        kwargs["session_token"] = config.session_token or ""
    if config.endpoint_url:
        kwargs["endpoint"] = config.endpoint_url
        # S3-compatible servers on an IP or localhost have no per-bucket DNS names.
        kwargs["virtual_hosted_style_request"] = False
        options["allow_http"] = config.endpoint_url.startswith("http://")
    return S3Store(
        bucket,
        client_options=options,
        retry_config=retry_config(config.max_attempts, config.connect_timeout, config.read_timeout),
        # If-Match / If-None-Match on PutObject: AWS S3 since 2024, MinIO, SeaweedFS, R2.
        conditional_put="etag",
        **kwargs,
    )


class S3Storage(ObstoreStorage):
    """Objects under ``s3://bucket/prefix``; keys are relative to the prefix.

    ``config`` stays available so other layers (DuckDB's httpfs secrets, Spark)
    can reach the same store as the same identity.
    """

    def __init__(self, uri: str, config: S3Config, *, _store: Any = None) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.root = f"{S3.prefix}{self.bucket}/{self.prefix}" if self.prefix else f"{S3.prefix}{self.bucket}"
        self.config = config
        try:
            self._store = _store if _store is not None else _make_store(self.bucket, config)
        except Exception as e:  # a malformed setting: obstore says which
            raise StorageError(f"{self.root}: cannot reach S3: {e}") from None

    @property
    def _endpoint(self) -> str:
        return self.config.endpoint_url or f"S3 ({self.config.region})"

    def child(self, prefix: str) -> S3Storage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        return S3Storage(self.uri(prefix), self.config, _store=self._store)
