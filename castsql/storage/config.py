"""Connection settings for S3-compatible object stores, shared by every layer
that talks to S3 (the storage backend, DuckDB's httpfs, Spark's workers)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass(frozen=True)
class S3Config:
    """Where and as whom to reach S3. Unset fields fall back to the usual AWS
    environment variables (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``, ``AWS_REGION``).

    Example::

        >>> S3Config(endpoint_url="http://127.0.0.1:8333", key="k", secret="s").region
        'us-east-1'
    """

    endpoint_url: str | None = None
    key: str | None = None
    secret: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)
    region: str = "us-east-1"

    @classmethod
    def from_env(cls) -> S3Config:
        return cls(
            endpoint_url=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
            key=os.environ.get("AWS_ACCESS_KEY_ID"),
            secret=os.environ.get("AWS_SECRET_ACCESS_KEY"),
            session_token=os.environ.get("AWS_SESSION_TOKEN"),
            region=os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        )
