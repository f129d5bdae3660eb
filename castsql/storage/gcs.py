"""A table on Google Cloud Storage, through its JSON API.

The commit protocol rests on GCS's generation preconditions (GCS has no ETag
``If-Match`` on writes): a create-only put sends ``ifGenerationMatch=0`` and a
compare-and-swap sends ``ifGenerationMatch=<generation>``; GCS decides
atomically and answers a lost race with 412, raised as
:class:`PreconditionFailed`. The "ETag" this backend hands the commit protocol
is therefore the object's generation, which names exactly one version of its
bytes, as an ETag does on S3.

Uploads are multipart (metadata and bytes in one request), the upload type
every GCS client library uses for small objects and the one emulators honour
preconditions on. Reads of the bytes use ``alt=media``, whose
``x-goog-generation`` header is the generation of the bytes returned.

Credentials: ``STORAGE_EMULATOR_HOST`` (the variable every Google client
library honours) points at an emulator and sends none; otherwise Google's
application default credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the
gcloud user's, or the metadata server's) through ``google-auth``.

Example::

    >>> st = GCSStorage("gs://bucket/warehouse", GCSConfig(endpoint_url="http://127.0.0.1:4443"))
    >>> st.uri("t/_latest_manifest")
    'gs://bucket/warehouse/t/_latest_manifest'
"""

from __future__ import annotations

import builtins
import json
import os
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import quote

import urllib3

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
from castsql.storage.config import env_number
from castsql.storage.uris import GCS

_BUCKET_NAME = (r"[a-z0-9_.-]{1,222}", "up to 222 lowercase letters, digits, '.', '-' or '_'")
_NO_BUCKET = b"bucket does not exist"
_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"


def parse_gcs_uri(uri: str) -> tuple[str, str]:
    """``gs://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``.

    >>> parse_gcs_uri("gcs://b/x/y/")
    ('b', 'x/y')
    """
    return split_bucket_uri(uri, GCS.prefixes, GCS.example, _BUCKET_NAME)


@dataclass(frozen=True)
class GCSConfig:
    """Where to reach GCS and how long to wait for it.

    ``endpoint_url`` (from ``STORAGE_EMULATOR_HOST``) targets an emulator and
    sends no credentials; unset, requests go to ``https://storage.googleapis.com``
    with application default credentials. Waits are bounded as on S3
    (:class:`~castsql.storage.S3Config`): ``CASTSQL_GCS_CONNECT_TIMEOUT``,
    ``CASTSQL_GCS_READ_TIMEOUT`` and ``CASTSQL_GCS_MAX_ATTEMPTS``.

    >>> GCSConfig().max_attempts
    3
    """

    endpoint_url: str | None = None
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    max_attempts: int = 3

    @classmethod
    def from_env(cls) -> GCSConfig:
        host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
        if host and "://" not in host:
            host = "http://" + host
        return cls(
            endpoint_url=host.rstrip("/") or None,
            connect_timeout=env_number("CASTSQL_GCS_CONNECT_TIMEOUT", 10.0),
            read_timeout=env_number("CASTSQL_GCS_READ_TIMEOUT", 30.0),
            max_attempts=int(env_number("CASTSQL_GCS_MAX_ATTEMPTS", 3)),
        )


class _Tokens:
    """Bearer tokens from application default credentials, refreshed when they expire."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._credentials: Any = None

    def header(self, http: urllib3.PoolManager) -> dict[str, str]:
        with self._lock:
            if self._credentials is None:
                try:
                    import google.auth
                except ImportError:
                    raise StorageError(
                        "gs:// tables need google-auth for credentials (pip install google-auth), "
                        "or STORAGE_EMULATOR_HOST for an emulator"
                    ) from None
                try:
                    self._credentials, _ = google.auth.default(scopes=[_SCOPE])
                except Exception as e:
                    raise StorageError(f"GCS: no credentials found ({type(e).__name__}: {e})") from None
            if not self._credentials.valid:
                from google.auth.transport.urllib3 import Request

                try:
                    self._credentials.refresh(Request(http))
                except Exception as e:
                    raise StorageError(f"GCS: cannot refresh credentials ({type(e).__name__}: {e})") from None
            return {"Authorization": f"Bearer {self._credentials.token}"}


class GCSStorage(ObjectStore):
    """Objects under ``gs://bucket/prefix``; keys are relative to the prefix."""

    def __init__(self, uri: str, config: GCSConfig, *, _http: urllib3.PoolManager | None = None) -> None:
        self.bucket, self.prefix = parse_gcs_uri(uri)
        self.root = f"{GCS.prefix}{self.bucket}/{self.prefix}" if self.prefix else f"{GCS.prefix}{self.bucket}"
        self.config = config
        self._base = config.endpoint_url or "https://storage.googleapis.com"
        self._owns_http = _http is None
        self._http = _http or urllib3.PoolManager(
            maxsize=32,
            timeout=urllib3.Timeout(connect=config.connect_timeout, read=config.read_timeout),
            retries=False,  # retried below, where a retry is known to be safe
        )
        self._tokens = None if config.endpoint_url else _Tokens()

    # -- plumbing ------------------------------------------------------------

    def _object_url(self, full: str) -> str:
        return f"{self._base}/storage/v1/b/{quote(self.bucket, safe='')}/o/{quote(full, safe='')}"

    def _request(
        self,
        method: str,
        url: str,
        key: str,
        action: str,
        *,
        fields: dict[str, str] | None = None,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> urllib3.BaseHTTPResponse:
        """One request, retried on 429/5xx and dropped connections, as the AWS
        SDKs retry S3's. A conditional put retried after it landed answers 412:
        the commit protocol checks what landed (FORMAT.md §6.1)."""
        if fields:
            url += ("&" if "?" in url else "?") + "&".join(f"{k}={quote(v, safe='')}" for k, v in fields.items())
        hdrs = dict(headers or {})
        last: BaseException | None = None
        for attempt in range(self.config.max_attempts):
            if waits_cancelled():
                raise StorageError(f"{self.uri(key)}: cancelled while waiting for {self._endpoint}")
            if self._tokens is not None:
                hdrs.update(self._tokens.header(self._http))
            try:
                resp = self._http.request(method, url, body=body, headers=hdrs, preload_content=True, redirect=False)
            except urllib3.exceptions.HTTPError as e:
                last = e
                continue
            if resp.status in (429, 500, 502, 503, 504) and attempt + 1 < self.config.max_attempts:
                time.sleep(min(2.0, 0.1 * 2**attempt))
                continue
            return resp
        c = self.config
        raise StorageUnreachable(
            f"{self.uri(key)}: cannot {action}: {self._endpoint} did not answer "
            f"(up to {c.max_attempts} attempt(s), {c.connect_timeout:g} s to connect, {c.read_timeout:g} s to read each"
            + (f"; {type(last).__name__}" if last else "")
            + ")"
        )

    @property
    def _endpoint(self) -> str:
        return self.config.endpoint_url or "GCS"

    @staticmethod
    def _missing(resp: urllib3.BaseHTTPResponse) -> bool:
        """A 404 for the object, not for its bucket (GCS says which; emulators may not)."""
        return resp.status == 404 and _NO_BUCKET not in resp.data.lower()

    def _error(self, key: str, action: str, resp: urllib3.BaseHTTPResponse) -> StorageError:
        where = self.uri(key)
        try:
            message = json.loads(resp.data)["error"]["message"]
        except Exception:
            message = resp.data[:200].decode("utf-8", "replace").strip() or resp.reason or ""
        if resp.status == 404 and _NO_BUCKET in resp.data.lower():
            return StorageError(f"{where}: cannot {action}: bucket {self.bucket!r} does not exist")
        if resp.status in (401, 403):
            return StorageError(f"{where}: cannot {action}: access denied (HTTP {resp.status}): {message}")
        return StorageError(f"{where}: cannot {action}: HTTP {resp.status}: {message}")

    # -- reads ---------------------------------------------------------------

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        resp = self._request("GET", self._object_url(self._key(key)), key, "read", fields={"alt": "media"})
        if self._missing(resp):
            raise ObjectNotFound(self.uri(key))
        if resp.status != 200:
            raise self._error(key, "read", resp)
        return resp.data, resp.headers.get("x-goog-generation", "")

    def _read_range(self, key: str, start: int, length: int) -> bytes:
        resp = self._request(
            "GET",
            self._object_url(self._key(key)),
            key,
            "read a range of",
            fields={"alt": "media"},
            headers={"Range": f"bytes={start}-{start + length - 1}"},
        )
        if resp.status == 416:
            return b""
        if self._missing(resp):
            raise ObjectNotFound(self.uri(key))
        if resp.status not in (200, 206):
            raise self._error(key, "read a range of", resp)
        data = resp.data
        if resp.status == 200:  # a server that ignores Range sends the whole object
            data = data[start:]
        return data[:length]

    def size(self, key: str) -> int:
        """The object's size in bytes (one metadata request)."""
        resp = self._request("GET", self._object_url(self._key(key)), key, "check", fields={"fields": "size"})
        if self._missing(resp):
            raise ObjectNotFound(self.uri(key))
        if resp.status != 200:
            raise self._error(key, "check", resp)
        return int(json.loads(resp.data)["size"])

    def exists(self, key: str) -> bool:
        resp = self._request("GET", self._object_url(self._key(key)), key, "check", fields={"fields": "name"})
        if self._missing(resp):
            return False
        if resp.status != 200:
            raise self._error(key, "check", resp)
        return True

    def _pages(self, key: str, fields: dict[str, str]) -> Iterator[dict[str, Any]]:
        url = f"{self._base}/storage/v1/b/{quote(self.bucket, safe='')}/o"
        fields = dict(fields)
        while True:
            resp = self._request("GET", url, key, "list", fields=fields)
            if resp.status != 200:
                raise self._error(key, "list", resp)
            page = json.loads(resp.data)
            yield page
            token = page.get("nextPageToken")
            if not token:
                return
            fields["pageToken"] = token

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        prefix = prefix.lstrip("/")
        base = f"{self.prefix}/" if self.prefix else ""
        for page in self._pages(prefix, {"prefix": base + prefix}):
            for obj in page.get("items") or ():
                full = obj["name"]
                if full.endswith("/") or not full.startswith(base):
                    continue
                mtime = datetime.fromisoformat(obj["updated"].replace("Z", "+00:00")).timestamp()
                yield ObjectInfo(key=full[len(base) :], size=int(obj["size"]), mtime=mtime)

    def list_dirs(self, prefix: str = "") -> builtins.list[str]:
        prefix = prefix.strip("/")
        base = "/".join(p for p in (self.prefix, prefix) if p)
        out: list[str] = []
        for page in self._pages(prefix, {"prefix": base + "/" if base else "", "delimiter": "/"}):
            out += [p.rstrip("/").rsplit("/", 1)[-1] for p in page.get("prefixes") or ()]
        return sorted(out)

    # -- writes --------------------------------------------------------------

    def _upload(self, key: str, data: bytes, generation: str | None) -> str:
        """A multipart upload, create-only or conditional when ``generation`` is
        given; the new object's generation."""
        boundary = uuid.uuid4().hex
        meta = json.dumps({"name": self._key(key)}).encode()
        body = b"".join(
            [
                f"--{boundary}\r\nContent-Type: application/json; charset=UTF-8\r\n\r\n".encode(),
                meta,
                f"\r\n--{boundary}\r\nContent-Type: application/octet-stream\r\n\r\n".encode(),
                data,
                f"\r\n--{boundary}--\r\n".encode(),
            ]
        )
        fields = {"uploadType": "multipart", "fields": "generation"}
        if generation is not None:
            fields["ifGenerationMatch"] = generation
        resp = self._request(
            "POST",
            f"{self._base}/upload/storage/v1/b/{quote(self.bucket, safe='')}/o",
            key,
            "write",
            fields=fields,
            body=body,
            headers={"Content-Type": f"multipart/related; boundary={boundary}"},
        )
        if resp.status == 412:
            raise PreconditionFailed(
                self.uri(key), "object already exists" if generation == "0" else "object changed or was deleted"
            )
        if generation not in (None, "0") and self._missing(resp):
            raise PreconditionFailed(self.uri(key), "object does not exist")
        if resp.status != 200:
            raise self._error(key, "write", resp)
        return str(json.loads(resp.data).get("generation", ""))

    def put(self, key: str, data: bytes) -> None:
        self._upload(key, data, None)

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._upload(key, data, "0")

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        if not etag.isdigit() or etag == "0":
            # Not a generation: this object was never read through this backend.
            raise PreconditionFailed(self.uri(key), f"not a GCS generation: {etag!r}")
        return self._upload(key, data, etag)

    def delete(self, key: str) -> None:
        resp = self._request("DELETE", self._object_url(self._key(key)), key, "delete")
        if resp.status in (200, 204) or self._missing(resp):
            return
        raise self._error(key, "delete", resp)

    # -- structure -----------------------------------------------------------

    def child(self, prefix: str) -> GCSStorage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        return GCSStorage(self.uri(prefix), self.config, _http=self._http)

    def close(self) -> None:
        if self._owns_http:
            self._http.clear()
