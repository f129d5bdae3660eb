"""A DuckDB connection set up for CastSQL: httpfs loaded from its pip package
(never downloaded or auto-loaded at run time) and S3 credentials shared with
the storage layer, kept in DuckDB's secret manager (which redacts them), never
in a setting any query can read."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import duckdb

from castsql.engine.duckdb import native
from castsql.engine.sql.quoting import sql_list
from castsql.engine.sql.quoting import sql_str as _sql_str
from castsql.errors import CastSQLError
from castsql.storage import S3Config


def _extension_path(package: str, name: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(next(iter(spec.submodule_search_locations))) / "extensions" / f"v{duckdb.__version__}"
    path = base / f"{name}.duckdb_extension"
    return path if path.exists() else None


def load_extension(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Load a DuckDB extension from its pip package (``duckdb-extension-NAME``)."""
    path = _extension_path(f"duckdb_extension_{name}", name)
    if path is None:
        raise CastSQLError(
            f"DuckDB's {name} extension for DuckDB {duckdb.__version__} is not installed "
            f"(pip install duckdb-extension-{name}=={duckdb.__version__})"
        )
    con.execute(f"LOAD '{path}'")


def load_httpfs(con: duckdb.DuckDBPyConnection) -> None:
    load_extension(con, "httpfs")


# Settings httpfs fills from AWS_* environment variables when it loads, and
# any query could read back with current_setting() or duckdb_settings().
CREDENTIAL_SETTINGS = ("s3_access_key_id", "s3_secret_access_key", "s3_session_token")
SECRET_NAME = "castsql_s3"


def hide_credentials(con: duckdb.DuckDBPyConnection) -> None:
    """Move S3 credentials out of DuckDB's settings: blank them, after putting
    them in the secret manager (as CastSQL's S3 secret, built from the same
    environment) unless that secret exists already, so reads of S3 URLs keep
    working. A no-op before httpfs is loaded."""
    found = dict(
        con.execute(
            f"SELECT name, value FROM duckdb_settings() WHERE name IN (SELECT unnest({sql_list(CREDENTIAL_SETTINGS)}))"
        ).fetchall()
    )
    if not any(found.values()):
        return
    have = con.execute(f"SELECT count(*) FROM duckdb_secrets() WHERE name = {_sql_str(SECRET_NAME)}").fetchall()[0][0]
    if not have:
        configure_s3(con, S3Config.from_env())
    for name, value in found.items():
        if value:
            con.execute(f"SET {name} = ''")


def configure_s3(con: duckdb.DuckDBPyConnection, config: S3Config, name: str = SECRET_NAME) -> None:
    """Create (or replace) a DuckDB S3 secret from ``config``."""
    load_httpfs(con)
    opts = ["TYPE s3", f"REGION {_sql_str(config.region)}"]
    if config.key:
        opts.append(f"KEY_ID {_sql_str(config.key)}")
    if config.secret:
        opts.append(f"SECRET {_sql_str(config.secret)}")
    # Every credential field is given, empty or not: httpfs fills a field a
    # secret lacks from its settings, which hold whatever AWS_* variables say.
    opts.append(f"SESSION_TOKEN {_sql_str(config.session_token or '')}")
    if config.endpoint_url:
        scheme, _, hostport = config.endpoint_url.partition("://")
        opts += [
            f"ENDPOINT {_sql_str(hostport.rstrip('/'))}",
            "URL_STYLE 'path'",
            f"USE_SSL {'true' if scheme == 'https' else 'false'}",
        ]
    con.execute(f"CREATE OR REPLACE SECRET {name} ({', '.join(opts)})")
    # The same bounded waits as the storage layer (S3Config): httpfs's own
    # defaults wait 30 s per try, and a stalled server must not hang a query.
    con.execute(f"SET http_timeout = {max(1, round(config.read_timeout))}")
    con.execute(f"SET http_retries = {config.max_attempts - 1}")
    # A warm query's S3 bytes from DuckDB's copy, no request (new_connection
    # turns the copy off for local files).
    con.execute("SET enable_external_file_cache = true")
    hide_credentials(con)


def new_connection(*, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """CastSQL's own connection: no extension is installed or auto-loaded
    behind its back (an auto-loaded httpfs would copy AWS_* variables into
    readable settings; other extensions run code past CastSQL's checks). It
    has CastSQL's own extension where that was built (:mod:`castsql.engine.duckdb.native`)."""
    config: dict[str, str | bool | int | float | list[str]] = {
        "autoinstall_known_extensions": False,
        "autoload_known_extensions": False,
    }
    ext = native.extension()
    if ext is not None:
        # CastSQL's own extension carries no DuckDB signature. User SQL cannot
        # use this to load another: the guard refuses LOAD, INSTALL and every
        # extension setting (policy.py).
        config["allow_unsigned_extensions"] = True
    con = duckdb.connect(config=config)
    if ext is not None:
        native.load(con, ext)
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    # Parquet footers of immutable files never go stale: keep them.
    con.execute("SET parquet_metadata_cache = true")
    # DuckDB's copy of the bytes it reads serves a remote store (configure_s3
    # turns it back on); of local files the OS keeps its own, and making the
    # copy cost a first read of 300 small files ~15% (80 -> 66 ms), the next
    # no faster.
    con.execute("SET enable_external_file_cache = false")
    return con
