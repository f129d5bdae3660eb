"""Connection settings for S3-compatible object stores, shared by every layer
that talks to S3 (the storage backend, DuckDB's httpfs, Spark's workers)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from castsql.errors import StorageError, one_line


@dataclass(frozen=True)
class S3Config:
    """Where and as whom to reach S3, and how long to wait for it.

    Unset fields fall back to the usual AWS environment variables
    (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
    ``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_MAX_ATTEMPTS``) and to
    ``CASTSQL_S3_CONNECT_TIMEOUT`` / ``CASTSQL_S3_READ_TIMEOUT`` (seconds).

    Every request has bounded waits: ``connect_timeout`` to connect,
    ``read_timeout`` for each read of the answer, and at most ``max_attempts``
    tries (with the AWS SDKs' standard backoff), so a server that accepts
    connections and never answers costs at most about
    ``max_attempts * (connect_timeout + read_timeout)`` before a clear error
    naming the endpoint and the object. The defaults are the AWS SDKs'
    standard mode (3 attempts) with shorter waits than their 60 s.

    Example::

        >>> c = S3Config(endpoint_url="http://127.0.0.1:8333", key="k", secret="s")
        >>> c.region, c.connect_timeout, c.read_timeout, c.max_attempts
        ('us-east-1', 10.0, 30.0, 3)
    """

    endpoint_url: str | None = None
    key: str | None = None
    secret: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    max_attempts: int = 3

    def __post_init__(self) -> None:
        if not (self.connect_timeout > 0 and self.read_timeout > 0):
            raise StorageError(f"S3 timeouts must be positive seconds, got {self.connect_timeout}, {self.read_timeout}")
        if not (isinstance(self.max_attempts, int) and self.max_attempts >= 1):
            raise StorageError(f"S3 max_attempts must be a positive integer, got {self.max_attempts!r}")

    @classmethod
    def from_env(cls) -> S3Config:
        key, secret = os.environ.get("AWS_ACCESS_KEY_ID"), os.environ.get("AWS_SECRET_ACCESS_KEY")
        token = os.environ.get("AWS_SESSION_TOKEN")
        if bool(key) != bool(secret):
            # As botocore's PartialCredentialsError: half a pair is a mistake,
            # not a reason to take another identity from the shared files.
            have, missing = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")[:: 1 if key else -1]
            raise StorageError(f"${have} is set but ${missing} is not: set both, or neither to use the AWS profile")
        profile = _shared_profile()
        if not (key and secret):
            key, secret = profile.get("aws_access_key_id"), profile.get("aws_secret_access_key")
            token = profile.get("aws_session_token")
        return cls(
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
            key=key,
            secret=secret,
            session_token=token,
            region=os.environ.get("AWS_REGION")
            or os.environ.get("AWS_DEFAULT_REGION")
            or profile.get("region")
            or "us-east-1",
            connect_timeout=env_number("CASTSQL_S3_CONNECT_TIMEOUT", 10.0),
            read_timeout=env_number("CASTSQL_S3_READ_TIMEOUT", 30.0),
            max_attempts=_attempts(),
        )


def _shared_profile() -> dict[str, str]:
    """The keys and region of the AWS profile (``AWS_PROFILE``, else
    ``default``) in the shared files the AWS CLI and SDKs read
    (``~/.aws/credentials``, ``~/.aws/config``, or where
    ``AWS_SHARED_CREDENTIALS_FILE`` / ``AWS_CONFIG_FILE`` point). Profiles
    that need an SDK to resolve (SSO, an assumed role, a credential process)
    give nothing here: use their exported variables or an instance role."""
    import configparser

    asked = os.environ.get("AWS_PROFILE") or os.environ.get("AWS_DEFAULT_PROFILE")
    name = asked or "default"
    out: dict[str, str] = {}
    found, read = False, []
    for kind, var, default, section in (
        ("config", "AWS_CONFIG_FILE", "~/.aws/config", name if name == "default" else f"profile {name}"),
        ("credentials", "AWS_SHARED_CREDENTIALS_FILE", "~/.aws/credentials", name),
    ):
        path = os.path.expanduser(os.environ.get(var) or default)
        if not os.path.exists(path):
            continue
        parser = configparser.RawConfigParser()
        try:
            parser.read(path)
        except (configparser.Error, UnicodeDecodeError) as e:
            # As botocore's ConfigParseError: a broken file is named, not skipped
            # (skipping it sent the request on to the instance metadata service).
            raise StorageError(f"{path}: not a readable AWS {kind} file: {one_line(e, excerpt=False)}") from None
        except OSError as e:
            raise StorageError(f"{path}: cannot read it: {e.strerror or e}") from None
        read.append(path)
        if parser.has_section(section):
            found = True
            out.update({k: v.strip() for k, v in parser.items(section) if v.strip()})
    if asked and not found:  # as botocore's ProfileNotFound
        where = " or ".join(read) or "no AWS config or credentials file"
        raise StorageError(f"AWS profile {asked!r} not found ({where})")
    return out


def _attempts() -> int:
    """``$AWS_MAX_ATTEMPTS``: a whole number of tries, 1 or more (default 3)."""
    raw = os.environ.get("AWS_MAX_ATTEMPTS")
    if raw is None or not raw.strip():
        return 3
    if not raw.strip().isdigit() or int(raw) < 1:
        raise StorageError(f"$AWS_MAX_ATTEMPTS must be a whole number of attempts, 1 or more, got {raw!r}")
    return int(raw)


def env_number(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return float(raw)
    except ValueError:
        raise StorageError(f"${name} must be a number, got {raw!r}") from None
