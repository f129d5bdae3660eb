"""A table on S3 or any S3-compatible store (MinIO, SeaweedFS, R2, …), via s3fs.

The commit protocol rests on S3's conditional writes: a create-only put sends
``If-None-Match: *`` and a compare-and-swap sends ``If-Match: "<etag>"``; the
server decides atomically. A lost race comes back as 412 (or 409 for two
conditional writes in flight at once, or 404 for ``If-Match`` on a missing
key) and is raised as :class:`PreconditionFailed`; anything else is a
:class:`StorageError` naming the ``s3://`` URI.

Every request goes straight to the S3 API through s3fs's client (no listing
cache, no ``info()`` + ``cat()`` pairs), so a read's ETag always describes
exactly the bytes returned.

Example::

    >>> from castsql.storage import S3Config
    >>> st = S3Storage("s3://bucket/warehouse", S3Config(endpoint_url="http://127.0.0.1:8333"))
    >>> st.uri("t/_pointer")
    's3://bucket/warehouse/t/_pointer'
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterator
from typing import Any

from castsql.errors import CastSQLError
from castsql.storage.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StorageError,
    StorageUnreachable,
    split_bucket_uri,
    waits_cancelled,
)
from castsql.storage.config import S3Config

_SCHEMES = ("s3://", "s3a://")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``.

    >>> parse_s3_uri("s3a://b/x/y/")
    ('b', 'x/y')
    """
    return split_bucket_uri(uri, _SCHEMES, "s3://bucket/prefix")


def _strip_etag(etag: str) -> str:
    return etag.strip().removeprefix("W/").strip('"')


def _client_response(exc: BaseException) -> dict[str, Any] | None:
    """The botocore error response behind ``exc``, however s3fs wrapped it."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        response = getattr(e, "response", None)
        if isinstance(response, dict) and ("Error" in response or "ResponseMetadata" in response):
            return response
        e = e.__cause__ or e.__context__
    return None


def _status(exc: BaseException) -> tuple[int | None, str, str]:
    """(HTTP status, S3 error code, message) of a failed request."""
    response = _client_response(exc)
    if response is None:
        return None, "", f"{type(exc).__name__}: {exc}"
    error = response.get("Error") or {}
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    code = str(error.get("Code") or "")
    if status is None and code.isdigit():
        status = int(code)
    message = error.get("Message") or str(exc)
    return status, code, message


def _is_timeout(exc: BaseException) -> bool:
    """A connect or read timeout, or a connection the server never answered, however wrapped."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        name = type(e).__name__
        if isinstance(e, TimeoutError | asyncio.TimeoutError) or "Timeout" in name or name == "EndpointConnectionError":
            return True
        e = e.__cause__ or e.__context__
    return False


def _make_fs(config: S3Config) -> Any:
    import s3fs

    config_kwargs: dict[str, Any] = {
        "connect_timeout": config.connect_timeout,
        "read_timeout": config.read_timeout,
        # botocore's standard mode retries throttling, 5xx, timeouts and dropped
        # connections with backoff; s3fs's own retry loop (5 more rounds of
        # those) is switched off below, or one stalled server costs 25 waits.
        # ``total_max_attempts`` counts the first try, as AWS_MAX_ATTEMPTS does;
        # botocore's ``max_attempts`` key counts retries only (one attempt more:
        # a stalled server cost 4 x 30 s, not 3).
        "retries": {"total_max_attempts": config.max_attempts, "mode": "standard"},
    }
    if config.endpoint_url:
        # S3-compatible servers on an IP or localhost have no per-bucket DNS names.
        config_kwargs["s3"] = {"addressing_style": "path"}
    fs = s3fs.S3FileSystem(
        key=config.key,
        secret=config.secret,
        token=config.session_token,
        endpoint_url=config.endpoint_url,
        client_kwargs={"region_name": config.region},
        config_kwargs=config_kwargs,
        skip_instance_cache=True,  # never share a client (or its caches) with other callers
        use_listings_cache=False,
    )
    fs.retries = 1
    return fs


class S3Storage(ObjectStore):
    """Objects under ``s3://bucket/prefix``; keys are relative to the prefix.

    ``config`` stays available so other layers (DuckDB's httpfs secrets, Spark)
    can reach the same store as the same identity.
    """

    def __init__(self, uri: str, config: S3Config, *, _fs: Any = None) -> None:
        self.bucket, self.prefix = parse_s3_uri(uri)
        self.root = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        self.config = config
        self._owns_fs = _fs is None
        self._fs = _fs if _fs is not None else _make_fs(config)

    # -- plumbing ------------------------------------------------------------

    def _sync(self, coro_fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run a coroutine on s3fs's event loop and wait for it in short slices,
        so that a cancelled command (:func:`castsql.storage.base.cancel_waits`)
        or Ctrl-C in the main thread stops waiting at once."""
        future = asyncio.run_coroutine_threadsafe(coro_fn(*args, **kwargs), self._fs.loop)
        try:
            while True:
                try:
                    return future.result(timeout=0.05)
                except concurrent.futures.TimeoutError:
                    if waits_cancelled():
                        raise StorageError(f"{self.root}: cancelled while waiting for {self._endpoint}") from None
        finally:
            if not future.done():
                future.cancel()

    @property
    def _endpoint(self) -> str:
        return self.config.endpoint_url or f"S3 ({self.config.region})"

    def _call(self, method: str, **kwargs: Any) -> Any:
        return self._sync(self._fs._call_s3, method, Bucket=self.bucket, **kwargs)

    def _error(self, key: str, action: str, exc: BaseException) -> StorageError:
        status, code, message = _status(exc)
        where = self.uri(key)
        if status is None and _is_timeout(exc):
            c = self.config
            return StorageUnreachable(
                f"{where}: cannot {action}: {self._endpoint} did not answer "
                f"({c.max_attempts} attempt(s), {c.connect_timeout:g} s to connect, {c.read_timeout:g} s to read each)"
            )
        if code == "NoSuchBucket":
            return StorageError(f"{where}: cannot {action}: bucket {self.bucket!r} does not exist")
        if status in (401, 403):
            return StorageError(f"{where}: cannot {action}: access denied ({code or status}): {message}")
        detail = f"{code} (HTTP {status}): {message}" if status is not None else message
        return StorageError(f"{where}: cannot {action}: {detail}")

    @staticmethod
    def _is_missing(exc: BaseException) -> bool:
        status, code, _ = _status(exc)
        return status == 404 and code != "NoSuchBucket"

    async def _get_object(self, full_key: str, **kwargs: Any) -> tuple[bytes, str, bool]:
        # One GetObject: the ETag in its headers is the ETag of the body we read;
        # and whether the body is the part a Range asked for (Content-Range).
        from s3fs.core import _error_wrapper

        async def call_and_read() -> tuple[bytes, str, bool]:
            resp = await self._fs._call_s3("get_object", Bucket=self.bucket, Key=full_key, **kwargs)
            body = resp["Body"]
            try:
                return await body.read(), _strip_etag(resp.get("ETag", "")), bool(resp.get("ContentRange"))
            finally:
                body.close()

        return await _error_wrapper(call_and_read, retries=self._fs.retries)

    # -- reads ---------------------------------------------------------------

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        full = self._key(key)
        try:
            data, etag, _ = self._sync(self._get_object, full)
            return data, etag
        except CastSQLError:
            raise
        except Exception as e:
            if self._is_missing(e):
                raise ObjectNotFound(self.uri(key)) from None
            raise self._error(key, "read", e) from e

    def _read_range(self, key: str, start: int, length: int) -> bytes:
        full = self._key(key)
        try:
            data, _, partial = self._sync(self._get_object, full, Range=f"bytes={start}-{start + length - 1}")
        except CastSQLError:
            raise
        except Exception as e:
            status, _, _ = _status(e)
            if status == 416:  # start at or past the end of the object
                return b""
            if self._is_missing(e):
                raise ObjectNotFound(self.uri(key)) from None
            raise self._error(key, "read a range of", e) from e
        # A server that ignores Range sends the whole object, without Content-Range.
        return data if partial else data[start : start + length]

    def exists(self, key: str) -> bool:
        try:
            self._call("head_object", Key=self._key(key))
        except CastSQLError:
            raise
        except Exception as e:
            status, _, _ = _status(e)
            if status == 404:
                return False
            raise self._error(key, "check", e) from e
        return True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        prefix = prefix.lstrip("/")
        base = f"{self.prefix}/" if self.prefix else ""
        kwargs: dict[str, Any] = {"Prefix": base + prefix}
        while True:
            try:
                page = self._call("list_objects_v2", **kwargs)
            except CastSQLError:
                raise
            except Exception as e:
                raise self._error(prefix, "list", e) from e
            for obj in page.get("Contents") or ():
                full = obj["Key"]
                if full.endswith("/") or not full.startswith(base):
                    continue  # directory markers
                yield ObjectInfo(key=full[len(base) :], size=int(obj["Size"]), mtime=obj["LastModified"].timestamp())
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs["ContinuationToken"] = token

    # -- writes --------------------------------------------------------------

    def list_dirs(self, prefix: str = "") -> list[str]:
        prefix = prefix.strip("/")
        base = "/".join(p for p in (self.prefix, prefix) if p)
        kwargs: dict[str, Any] = {"Prefix": base + "/" if base else "", "Delimiter": "/"}
        out: list[str] = []
        while True:
            try:
                page = self._call("list_objects_v2", **kwargs)
            except CastSQLError:
                raise
            except Exception as e:
                raise self._error(prefix, "list", e) from e
            for cp in page.get("CommonPrefixes") or ():
                out.append(cp["Prefix"].rstrip("/").rsplit("/", 1)[-1])
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return sorted(out)
            kwargs["ContinuationToken"] = token

    def put(self, key: str, data: bytes) -> None:
        try:
            self._call("put_object", Key=self._key(key), Body=data)
        except CastSQLError:
            raise
        except Exception as e:
            raise self._error(key, "write", e) from e

    def _conditional_put(self, key: str, data: bytes, lost: dict[int, str], **condition: str) -> str:
        try:
            resp = self._call("put_object", Key=self._key(key), Body=data, **condition)
        except CastSQLError:
            raise
        except Exception as e:
            status, code, _ = _status(e)
            if status in lost and code != "NoSuchBucket":
                raise PreconditionFailed(self.uri(key), lost[status]) from None
            raise self._error(key, "write", e) from e
        return _strip_etag(resp.get("ETag", ""))

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._conditional_put(
            key,
            data,
            {412: "object already exists", 409: "object being created concurrently"},
            IfNoneMatch="*",
        )

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._conditional_put(
            key,
            data,
            {
                412: "object changed or was deleted (ETag mismatch)",
                409: "object being changed concurrently",
                404: "object does not exist",
            },
            IfMatch=f'"{_strip_etag(etag)}"',
        )

    def delete(self, key: str) -> None:
        try:
            self._call("delete_object", Key=self._key(key))
        except CastSQLError:
            raise
        except Exception as e:
            if self._is_missing(e):
                return
            raise self._error(key, "delete", e) from e

    # -- structure -----------------------------------------------------------

    def child(self, prefix: str) -> S3Storage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        return S3Storage(self.uri(prefix), self.config, _fs=self._fs)

    def close(self) -> None:
        if not self._owns_fs:
            return
        client = getattr(self._fs, "_s3", None)
        if client is None:
            return
        with contextlib.suppress(Exception):  # closing is best effort
            self._sync(client.close)
        self._fs._s3 = None  # a later call reconnects
