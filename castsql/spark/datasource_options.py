"""The options of ``format("castsql")``, read the same way by its read half
(:mod:`castsql.spark.datasource_read`), its write half
(:mod:`castsql.spark.datasource_write`) and the JVM data source's Python half
(:mod:`castsql.spark.bridge`): which options there are, an unknown one
refused with the known ones named, the table's path, integers and booleans
checked, S3 settings, and the writers' errors spelled as options.

Spark hands option names over in any case: every look-up here ignores it.
Imports no pyspark.
"""

from __future__ import annotations

from typing import Any

from castsql.spark.errors import BadOption
from castsql.storage import S3Config

# Options (Spark hands them over case-insensitively).
READ_OPTIONS = ("path", "versionAsOf", "timestampAsOf")
WRITE_OPTIONS = (
    "path", "primaryKey", "mergeSchema", "allowDuplicateKeys", "rowGroupSize", "targetFileBytes", "queryId",
    "txnAppId", "txnVersion",
)  # fmt: skip
S3_OPTIONS = {
    "s3.endpoint": "endpoint_url",
    "s3.accessKeyId": "key",
    "s3.secretAccessKey": "secret",
    "s3.sessionToken": "session_token",
    "s3.region": "region",
}
# Set by Spark itself on some paths (__streamQueryId: by the JVM source); never the user's typo.
SPARK_OPTIONS = ("paths", "checkpointLocation", "queryName", "__partition_columns", "__streamQueryId")
KNOWN = {o.lower() for o in (*READ_OPTIONS, *WRITE_OPTIONS, *S3_OPTIONS, *SPARK_OPTIONS)}


def get_option(options: Any, name: str) -> str | None:
    """The value of option ``name``, whatever case it was given in; None when absent."""
    for k, v in options.items():
        if k.lower() == name.lower():
            return v
    return None


def check_known(options: Any) -> None:
    """BadOption for an option no reader or writer of ``format("castsql")`` takes: a typo fails, not ignored."""
    for k in options:
        if k.lower() not in KNOWN:
            names = ", ".join((*READ_OPTIONS[1:], *WRITE_OPTIONS[1:], *S3_OPTIONS))
            raise BadOption(f"format('castsql'): unknown option {k!r} (known: {names})")


def option_spelling(text: str) -> str:
    """An error of the writers every interface shares, with its remedies
    spelled as ``format("castsql")``'s options rather than Python's keywords
    and the CLI's flags."""
    text = text.replace("allow_duplicate_keys=True / --allow-duplicate-keys", "option allowDuplicateKeys=true")
    return text.replace("merge_schema=True (--merge-schema)", "option mergeSchema=true")


def table_path(options: Any) -> str:
    """The table's URI (``load(uri)``, ``save(uri)`` or ``option("path", uri)``)."""
    path = get_option(options, "path")
    if not path:
        raise BadOption(
            "format('castsql'): no table path: use .load(uri) / .save(uri) or .option('path', uri) "
            "(one table: Spark hands a source none of the paths of a load of several)"
        )
    return path


def int_option(options: Any, name: str, minimum: int = 0) -> int | None:
    raw = get_option(options, name)
    if raw is None:
        return None
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise BadOption(f"format('castsql'): option {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise BadOption(f"format('castsql'): option {name} must be at least {minimum}, got {raw!r}")
    return value


def bool_option(options: Any, name: str) -> bool:
    raw = get_option(options, name)
    if raw is None:
        return False
    value = str(raw).strip().lower()
    if value not in ("true", "false"):
        raise BadOption(f"format('castsql'): option {name} must be true or false, got {raw!r}")
    return value == "true"


def s3_config(options: Any) -> S3Config | None:
    """S3 settings from the ``s3.*`` options, falling back to the AWS
    environment variables; None when none is given (then storage reads the
    environment of whichever process opens it)."""
    given = {field: get_option(options, opt) for opt, field in S3_OPTIONS.items()}
    if all(v is None for v in given.values()):
        return None
    base = S3Config.from_env()
    return S3Config(
        endpoint_url=given["endpoint_url"] or base.endpoint_url,
        key=given["key"] or base.key,
        secret=given["secret"] or base.secret,
        session_token=given["session_token"] or base.session_token,
        region=given["region"] or base.region,
        connect_timeout=base.connect_timeout,
        read_timeout=base.read_timeout,
        max_attempts=base.max_attempts,
    )
