"""What the backends built on obstore share (S3 and Azure): one call wrapper
that turns obstore's errors into CastSQL's, naming the object, and the reads,
lists and conditional puts, which obstore spells alike for every store.

obstore (Rust's ``object_store``) was chosen over s3fs for S3 by measurement
(issue 36): importing s3fs and making its botocore client cost ~0.4 s in
every fresh process, importing obstore ~5 ms, with the same requests.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from castsql.errors import one_line
from castsql.storage.base import (
    ObjectInfo,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    StorageError,
    StorageUnreachable,
    in_background,
    waits_cancelled,
)

if TYPE_CHECKING:
    from obstore.store import RetryConfig

# What an obstore error says when the request got no answer.
_NO_ANSWER = ("timed out", "error sending request", "Connection refused", "dns error", "connection closed")


def retry_config(max_attempts: int, connect_timeout: float, read_timeout: float) -> RetryConfig:
    """obstore's retries for ``max_attempts`` tries in all (the first one
    included, as ``AWS_MAX_ATTEMPTS`` counts), with backoff."""
    return {
        "max_retries": max_attempts - 1,
        "retry_timeout": timedelta(seconds=max_attempts * (connect_timeout + read_timeout)),
        "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5), "base": 2},
    }


class ObstoreStorage(ObjectStore):
    """Objects under ``bucket/prefix`` of one obstore store.

    A subclass sets ``_store``, ``bucket``, ``config`` (with
    ``connect_timeout``, ``read_timeout`` and ``max_attempts``) and says how
    its store names a missing bucket.
    """

    bucket: str
    config: Any
    _store: Any
    _bucket_word = "bucket"  # Azure: "container"
    _no_bucket = "NoSuchBucket"  # the error code of a missing bucket

    @property
    def _endpoint(self) -> str:
        raise NotImplementedError

    def _call(self, key: str, action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One obstore call; its errors as CastSQL's, naming the object."""
        from obstore import exceptions as ox

        if waits_cancelled():
            raise StorageError(f"{self.uri(key)}: cancelled while waiting for {self._endpoint}")
        # obstore's calls block in Rust, where neither Ctrl-C nor a cancelled
        # command reaches them: they run on a worker, and this thread waits in
        # short slices (what it then abandons ends within the store's timeouts).
        future = in_background(fn, self._store, *args, **kwargs)
        try:
            while True:
                try:
                    return future.result(timeout=0.05)
                except concurrent.futures.TimeoutError:
                    if waits_cancelled():
                        raise StorageError(f"{self.uri(key)}: cancelled while waiting for {self._endpoint}") from None
        except (ox.AlreadyExistsError, ox.PreconditionError, StorageError):
            raise
        except Exception as e:
            raise self._translate(e, key, action) from None
        except BaseException as e:
            # A panic inside obstore (an endpoint or bucket name its signer
            # cannot put in a URL) is pyo3's PanicException, a BaseException.
            if type(e).__name__ != "PanicException":
                raise
            raise StorageError(
                f"{self.uri(key)}: cannot {action}: not a valid request for {self._endpoint} "
                f"(check the endpoint URL and the bucket name): {one_line(e, excerpt=False)}"
            ) from None

    def _translate(self, e: Exception, key: str, action: str) -> StorageError:
        from obstore import exceptions as ox

        where = self.uri(key)
        text = str(e)
        if self._no_bucket in text:
            return StorageError(f"{where}: cannot {action}: {self._bucket_word} {self.bucket!r} does not exist")
        if isinstance(e, ox.NotFoundError | FileNotFoundError):
            return ObjectNotFound(where)
        if isinstance(e, ox.PermissionDeniedError | ox.UnauthenticatedError):
            # The store's own reason is its error code, in the XML body after
            # the first line (SignatureDoesNotMatch, InvalidAccessKeyId, …).
            code = re.search(r"<Code>([A-Za-z0-9.]{1,64})</Code>", text)
            first = one_line(e, excerpt=False).removesuffix('<?xml version="1.0" encoding="UTF-8"?>').rstrip(": ")
            why = f" ({code.group(1)})" if code else ""
            return StorageError(f"{where}: cannot {action}: access denied{why}: {first}")
        if any(s in text for s in _NO_ANSWER):
            c = self.config
            # object_store repeats no write whose answer timed out (it may
            # have landed); its error says how many retries it made.
            retries = re.search(r"\bretries: (\d+)", text)
            made = min(int(retries.group(1)) + 1, c.max_attempts) if retries else c.max_attempts
            unreachable = StorageUnreachable(
                f"{where}: cannot {action}: {self._endpoint} did not answer "
                f"({_tries(made, c.max_attempts)} attempt(s), {c.connect_timeout:g} s to connect, "
                f"{c.read_timeout:g} s to read each)"
            )
            unreachable.attempts = made
            return unreachable
        return StorageError(f"{where}: cannot {action}: {one_line(e, excerpt=False)}")

    # -- reads ---------------------------------------------------------------

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        import obstore

        def get(store: Any, path: str) -> tuple[bytes, str | None]:
            # One GET, its body read in the same wait: the ETag in its answer
            # is the ETag of the bytes returned.
            result = obstore.get(store, path)
            return bytes(result.bytes()), result.meta.get("e_tag")

        data, etag = self._call(key, "read", get, self._key(key))
        return data, strip_etag(etag)

    def _read_range(self, key: str, start: int, length: int) -> bytes:
        import obstore

        try:
            data = self._call(
                key, "read a range of", obstore.get_range, self._key(key), start=start, end=start + length
            )
        except StorageError as e:
            # A start at or past the end: the store answers 416, or obstore checks first.
            if "Wanted range starting at" in str(e) or "InvalidRange" in str(e) or "416" in str(e):
                return b""
            # A server that ignores Range answers with the whole object, which
            # obstore refuses: read it whole and keep the range.
            if "non-partial response" in str(e):
                return self.get_with_etag(key)[0][start : start + length]
            raise
        return bytes(data)

    def size(self, key: str) -> int:
        """The object's size in bytes (one HEAD)."""
        import obstore

        return int(self._call(key, "check", obstore.head, self._key(key))["size"])

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectNotFound:
            return False
        return True

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        import obstore

        prefix = prefix.lstrip("/")
        base = f"{self.prefix}/" if self.prefix else ""
        # obstore lists whole path segments: list the segment the prefix ends
        # in and keep what starts with the prefix (``a`` must find ``ab/4``).
        full_prefix = base + prefix
        segment = full_prefix.rsplit("/", 1)[0] if "/" in full_prefix else ""
        stream = iter(self._call(prefix, "list", obstore.list, segment or None))
        while True:
            if waits_cancelled():
                raise StorageError(f"{self.uri(prefix)}: cancelled while waiting for {self._endpoint}")
            try:
                batch = next(stream)
            except StopIteration:
                return
            except Exception as e:
                raise self._translate(e, prefix, "list") from None
            for obj in batch:
                full = obj["path"]
                if full.endswith("/") or not full.startswith(full_prefix):
                    continue
                yield ObjectInfo(key=full[len(base) :], size=int(obj["size"]), mtime=obj["last_modified"].timestamp())

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        import obstore

        prefix = prefix.strip("/")
        base = "/".join(p for p in (self.prefix, prefix) if p)
        found = self._call(prefix, "list", obstore.list_with_delimiter, base or None)
        return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"])

    # -- writes --------------------------------------------------------------

    def _put(self, key: str, data: bytes, mode: Any) -> str:
        import obstore
        from obstore import exceptions as ox

        try:
            result = self._call(key, "write", obstore.put, self._key(key), data, mode=mode)
        except ox.AlreadyExistsError:
            raise PreconditionFailed(self.uri(key), "object already exists") from None
        except ox.PreconditionError:
            raise PreconditionFailed(self.uri(key), "object changed or was deleted (ETag mismatch)") from None
        except ObjectNotFound:
            raise PreconditionFailed(self.uri(key), "object does not exist") from None
        except StorageError as e:
            # S3 answers 409 to a conditional write racing another one on the same key.
            if mode != "overwrite" and "409 Conflict" in str(e):
                raise PreconditionFailed(self.uri(key), "object being written concurrently") from None
            raise
        return strip_etag(result.get("e_tag"))

    def repeated(self, write: Any, key: str, data: bytes) -> Any:
        # object_store repeats no PUT whose answer timed out (it may have
        # landed), as delta-rs notes; repeat it here up to the store's attempts.
        spent = 0
        while True:
            try:
                return write(key, data)
            except StorageUnreachable as e:
                made = e.attempts or self.config.max_attempts
                spent += made
                if spent >= self.config.max_attempts:
                    if spent == made:
                        raise
                    # The message counts every try, not the last call's alone.
                    last = f"({_tries(made, self.config.max_attempts)} attempt(s)"
                    raise StorageUnreachable(
                        str(e).replace(last, f"({_tries(spent, self.config.max_attempts)} attempt(s)", 1)
                    ) from None

    def put(self, key: str, data: bytes) -> None:
        self.repeated(lambda k, d: self._put(k, d, "overwrite"), key, data)

    def put_new(self, key: str, data: bytes) -> None:
        self.repeated(super().put_new, key, data)

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._put(key, data, "create")

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._put(key, data, {"e_tag": f'"{strip_etag(etag)}"'})

    def delete(self, key: str) -> None:
        import obstore

        try:
            self._call(key, "delete", obstore.delete, self._key(key))
        except ObjectNotFound:
            return


def _tries(made: int, most: int) -> str:
    return f"up to {most}" if made >= most else f"{made} of up to {most}"


def strip_etag(etag: str | None) -> str:
    return (etag or "").strip().removeprefix("W/").strip('"')
