"""A table on Azure Blob Storage or ADLS Gen2, through obstore.

The commit protocol rests on Azure's ETag conditions: a create-only put sends
``If-None-Match: *`` and a compare-and-swap ``If-Match: <etag>``; Azure decides
atomically and answers a lost race with 409 or 412, raised as
:class:`PreconditionFailed`.

URIs: ``az://container/prefix`` (also spelled ``azure://``), and ADLS Gen2's
``abfss://container@account.dfs.core.windows.net/prefix``, which names the
account too. Credentials come from Azure's usual environment:
``AZURE_STORAGE_CONNECTION_STRING``, or ``AZURE_STORAGE_ACCOUNT_NAME`` with
``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``, or whatever
obstore's credential chain finds (service principal variables, managed
identity, workload identity).

Example::

    >>> parse_azure_uri("abfss://events@acct.dfs.core.windows.net/tables/ev")
    ('events', 'tables/ev', 'acct')
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

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

_SCHEMES = ("az://", "azure://", "abfss://", "abfs://")


def parse_azure_uri(uri: str) -> tuple[str, str, str | None]:
    """(container, prefix, account or None) of an ``az://``, ``azure://`` or ``abfss://`` URI.

    >>> parse_azure_uri("az://c/x/y/")
    ('c', 'x/y', None)
    """
    container, prefix = split_bucket_uri(uri, _SCHEMES, "az://container/prefix")
    account = None
    if "@" in container:
        container, _, host = container.partition("@")
        account = host.split(".", 1)[0] or None
    if not container:
        raise StorageError(f"{uri}: no container in the URI (use az://container/prefix)")
    return container, prefix, account


def _connection_string(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(";"):
        name, sep, value = part.partition("=")
        if sep:
            out[name.strip()] = value.strip()
    return out


@dataclass(frozen=True)
class AzureConfig:
    """Which account, as whom, and how long to wait.

    >>> c = AzureConfig.from_connection_string(
    ...     "AccountName=dev;AccountKey=a2V5;BlobEndpoint=http://127.0.0.1:10000/dev")
    >>> c.account, c.endpoint_url
    ('dev', 'http://127.0.0.1:10000/dev')
    """

    account: str | None = None
    key: str | None = field(default=None, repr=False)
    sas_token: str | None = field(default=None, repr=False)
    endpoint_url: str | None = None
    connection_string: str | None = field(default=None, repr=False)
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    max_attempts: int = 3

    @classmethod
    def from_connection_string(cls, text: str, **waits: Any) -> AzureConfig:
        cs = _connection_string(text)
        endpoint = cs.get("BlobEndpoint")
        if not endpoint and cs.get("AccountName"):
            suffix = cs.get("EndpointSuffix", "core.windows.net")
            endpoint = f"{cs.get('DefaultEndpointsProtocol', 'https')}://{cs['AccountName']}.blob.{suffix}"
        return cls(
            account=cs.get("AccountName"),
            key=cs.get("AccountKey"),
            sas_token=cs.get("SharedAccessSignature"),
            endpoint_url=endpoint.rstrip("/") if endpoint else None,
            connection_string=text,
            **waits,
        )

    @classmethod
    def from_env(cls) -> AzureConfig:
        waits = dict(
            connect_timeout=env_number("CASTSQL_AZURE_CONNECT_TIMEOUT", 10.0),
            read_timeout=env_number("CASTSQL_AZURE_READ_TIMEOUT", 30.0),
            max_attempts=int(env_number("CASTSQL_AZURE_MAX_ATTEMPTS", 3)),
        )
        text = os.environ.get("AZURE_STORAGE_CONNECTION_STRING", "").strip()
        if text:
            return cls.from_connection_string(text, **waits)
        return cls(
            account=os.environ.get("AZURE_STORAGE_ACCOUNT_NAME") or os.environ.get("AZURE_STORAGE_ACCOUNT"),
            key=os.environ.get("AZURE_STORAGE_ACCOUNT_KEY") or os.environ.get("AZURE_STORAGE_KEY"),
            sas_token=os.environ.get("AZURE_STORAGE_SAS_TOKEN"),
            endpoint_url=(os.environ.get("AZURE_STORAGE_ENDPOINT") or "").rstrip("/") or None,
            **waits,
        )

    def with_account(self, account: str | None) -> AzureConfig:
        """This config for ``account`` (an ``abfss://`` URI names one)."""
        if account is None or account == self.account:
            return self
        return AzureConfig(
            account=account,
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            max_attempts=self.max_attempts,
        )


def _make_store(container: str, config: AzureConfig) -> Any:
    from obstore.store import AzureStore

    options: dict[str, Any] = {
        "connect_timeout": timedelta(seconds=config.connect_timeout),
        "timeout": timedelta(seconds=config.read_timeout),
    }
    kwargs: dict[str, Any] = {}
    if config.account:
        kwargs["account_name"] = config.account
    if config.key:
        kwargs["account_key"] = config.key
    if config.sas_token:
        kwargs["sas_key"] = config.sas_token.lstrip("?")
    if config.endpoint_url:
        kwargs["endpoint"] = config.endpoint_url
        options["allow_http"] = config.endpoint_url.startswith("http://")
    return AzureStore(
        container,
        client_options=options,
        retry_config={
            "max_retries": config.max_attempts - 1,
            "retry_timeout": timedelta(seconds=config.max_attempts * (config.connect_timeout + config.read_timeout)),
            "backoff": {"init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=5), "base": 2},
        },
        **kwargs,
    )


class AzureStorage(ObjectStore):
    """Objects under ``az://container/prefix``; keys are relative to the prefix."""

    def __init__(self, uri: str, config: AzureConfig, *, _store: Any = None) -> None:
        self.container, self.prefix, account = parse_azure_uri(uri)
        self.config = config.with_account(account)
        self.root = f"az://{self.container}/{self.prefix}" if self.prefix else f"az://{self.container}"
        try:
            self._store = _store if _store is not None else _make_store(self.container, self.config)
        except Exception as e:  # a malformed setting: obstore says which
            raise StorageError(f"{self.root}: cannot reach Azure: {e}") from None

    # -- plumbing ------------------------------------------------------------

    @property
    def _endpoint(self) -> str:
        return self.config.endpoint_url or f"Azure account {self.config.account or '(from the environment)'}"

    def _call(self, key: str, action: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One obstore call; its errors as CastSQL's, naming the object."""
        from obstore import exceptions as ox

        if waits_cancelled():
            raise StorageError(f"{self.uri(key)}: cancelled while waiting for {self._endpoint}")
        try:
            return fn(self._store, *args, **kwargs)
        except (ox.AlreadyExistsError, ox.PreconditionError):
            raise
        except Exception as e:
            raise self._translate(e, key, action) from None

    def _translate(self, e: Exception, key: str, action: str) -> StorageError:
        from obstore import exceptions as ox

        where = self.uri(key)
        if isinstance(e, ox.NotFoundError | FileNotFoundError):
            return ObjectNotFound(where)
        if isinstance(e, ox.PermissionDeniedError | ox.UnauthenticatedError):
            return StorageError(f"{where}: cannot {action}: access denied: {_first_line(e)}")
        text = str(e)
        if "ContainerNotFound" in text:
            return StorageError(f"{where}: cannot {action}: container {self.container!r} does not exist")
        if any(s in text for s in ("timed out", "error sending request", "Connection refused", "dns error")):
            c = self.config
            return StorageUnreachable(
                f"{where}: cannot {action}: {self._endpoint} did not answer "
                f"({c.max_attempts} attempt(s), {c.connect_timeout:g} s to connect, {c.read_timeout:g} s to read each)"
            )
        return StorageError(f"{where}: cannot {action}: {_first_line(e)}")

    # -- reads ---------------------------------------------------------------

    def get_with_etag(self, key: str) -> tuple[bytes, str]:
        import obstore

        result = self._call(key, "read", obstore.get, self._key(key))
        data = self._call(key, "read", lambda _store: bytes(result.bytes()))
        return data, _strip_etag(result.meta.get("e_tag"))

    def _read_range(self, key: str, start: int, length: int) -> bytes:
        import obstore

        try:
            data = self._call(
                key, "read a range of", obstore.get_range, self._key(key), start=start, end=start + length
            )
        except StorageError as e:
            # A start at or past the end: Azure answers 416, obstore checks first.
            if "Wanted range starting at" in str(e) or "InvalidRange" in str(e) or "416" in str(e):
                return b""
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

    def list_dirs(self, prefix: str = "") -> list[str]:
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
        return _strip_etag(result.get("e_tag"))

    def put(self, key: str, data: bytes) -> None:
        self._put(key, data, "overwrite")

    def put_if_absent(self, key: str, data: bytes) -> str:
        return self._put(key, data, "create")

    def put_if_match(self, key: str, data: bytes, etag: str) -> str:
        return self._put(key, data, {"e_tag": f'"{_strip_etag(etag)}"'})

    def delete(self, key: str) -> None:
        import obstore

        try:
            self._call(key, "delete", obstore.delete, self._key(key))
        except ObjectNotFound:
            return

    # -- structure -----------------------------------------------------------

    def child(self, prefix: str) -> AzureStorage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        return AzureStorage(self.uri(prefix), self.config, _store=self._store)


def _strip_etag(etag: str | None) -> str:
    return (etag or "").strip().removeprefix("W/").strip('"')


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
