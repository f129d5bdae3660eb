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
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from castsql.storage.base import StorageError, check_bucket_name, split_bucket_uri
from castsql.storage.config import env_number
from castsql.storage.obstore_base import ObstoreStorage, retry_config
from castsql.storage.uris import AZURE

if TYPE_CHECKING:
    from obstore.store import ClientConfig

# Azure's rule for container names, and its special containers ($root, $web, $logs).
_CONTAINER_NAME = (r"\$?[a-z0-9-]{1,63}", "up to 63 lowercase letters, digits or '-'")


def parse_azure_uri(uri: str) -> tuple[str, str, str | None]:
    """(container, prefix, account or None) of an ``az://``, ``azure://`` or ``abfss://`` URI.

    >>> parse_azure_uri("az://c/x/y/")
    ('c', 'x/y', None)
    """
    container, prefix = split_bucket_uri(uri, AZURE.prefixes, AZURE.example)
    account = None
    if "@" in container:
        container, _, host = container.partition("@")
        account = host.split(".", 1)[0] or None
    if not container:
        raise StorageError(f"{uri}: no container in the URI (use {AZURE.example})")
    check_bucket_name(uri, container, "container", _CONTAINER_NAME)
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
        waits: dict[str, Any] = dict(
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

    options: ClientConfig = {
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
        retry_config=retry_config(config.max_attempts, config.connect_timeout, config.read_timeout),
        **kwargs,
    )


class AzureStorage(ObstoreStorage):
    """Objects under ``az://container/prefix``; keys are relative to the prefix."""

    _bucket_word = "container"
    _no_bucket = "ContainerNotFound"

    def __init__(self, uri: str, config: AzureConfig, *, _store: Any = None) -> None:
        self.container, self.prefix, account = parse_azure_uri(uri)
        self.bucket = self.container
        self.config = config.with_account(account)
        self.root = (
            f"{AZURE.prefix}{self.container}/{self.prefix}" if self.prefix else f"{AZURE.prefix}{self.container}"
        )
        try:
            self._store = _store if _store is not None else _make_store(self.container, self.config)
        except Exception as e:  # a malformed setting: obstore says which
            raise StorageError(f"{self.root}: cannot reach Azure: {e}") from None

    @property
    def _endpoint(self) -> str:
        return self.config.endpoint_url or f"Azure account {self.config.account or '(from the environment)'}"

    # -- structure -----------------------------------------------------------

    def child(self, prefix: str) -> AzureStorage:
        prefix = prefix.strip("/")
        if not prefix:
            return self
        return AzureStorage(self.uri(prefix), self.config, _store=self._store)
