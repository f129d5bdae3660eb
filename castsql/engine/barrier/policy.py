"""Which statements each mode runs: the one place that decides.

Every statement is classified by DuckDB's own parser
(``DuckDBPyConnection.extract_statements`` gives each statement's type, with
PRAGMAs and ``IMPORT DATABASE`` already expanded into what they run) and
checked against the allow-list of its mode (:data:`ALLOWED`); a type that is
not listed is refused. :mod:`castsql.engine.barrier.guard` refuses, on DuckDB's tokens,
the names and functions no mode may use, before this runs.

Normal mode (the shell, ``castsql.connect``) reads the tables and does the
user's own in-memory work: queries, settings, views, temp tables, macros,
sequences, secrets, writes to the user's own objects, transactions, COPY and
EXPORT to a literal path outside every opened table, warehouse and the
session's work directory. The tables themselves are written only through the
write pipeline (:mod:`castsql.engine.writing.writes` takes ``DELETE``, ``UPDATE``,
``INSERT`` and ``MERGE INTO`` of a table before this check); any other
statement that would write one is refused here. Never,
in any mode: ATTACH/DETACH, LOAD/INSTALL, COPY FROM DATABASE, settings that
name a file DuckDB writes to or that loosen DuckDB's own limits.

Safe mode runs SELECT and EXPLAIN SELECT only; table functions take literal
arguments, and every URL literal names an object of the opened warehouse,
with no query string or fragment; DuckDB's own limits back it up
(:mod:`castsql.engine.barrier.safety`).

Example::

    >>> import duckdb
    >>> con = duckdb.connect()
    >>> scope = Scope(tables={"events"}, protected=["/wh"])
    >>> check(con, "CREATE TEMP TABLE mine AS SELECT 1 AS x; INSERT INTO mine VALUES (2)", scope)
    >>> check(con, "DELETE FROM events", scope)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    castsql.errors.ForbiddenStatement: table events cannot be written by this statement; ...
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import duckdb

from castsql.engine.barrier.guard import ATTACH_WHY, OWN_DATABASES, ForbiddenStatement, Tok, tokens
from castsql.engine.barrier.safety import SafeModeError, check_select
from castsql.engine.sql import names
from castsql.engine.sql.literals import literal_at
from castsql.storage.uris import SCHEMES, canonical_uri

ST = duckdb.StatementType


@dataclass
class Scope:
    """What a session protects and may read.

    ``tables``: the CastSQL tables' names (any case); ``protected``: the table
    roots, warehouse roots and the session's work directory (local paths or
    ``s3://bucket/prefix``), which no statement may write to or above;
    ``readable``: in safe mode, the only URL prefixes SQL may name."""

    tables: Collection[str] = ()
    protected: Sequence[str] = ()
    readable: Sequence[str] = ()
    home: str | None = None
    _lower: set[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._lower = {t.lower() for t in self.tables}

    def is_table(self, name: str) -> bool:
        return name.lower() in self._lower or names.is_internal(name)


# ---------------------------------------------------------------- the allow-lists

NORMAL = "normal"
SAFE = "safe"

_NORMAL_TYPES = (
    "SELECT EXPLAIN SET VARIABLE_SET PRAGMA CREATE CREATE_FUNC DROP ALTER INSERT UPDATE DELETE MERGE_INTO "
    "PREPARE EXECUTE TRANSACTION COPY EXPORT CALL VACUUM ANALYZE"
)
ALLOWED: dict[str, frozenset] = {
    NORMAL: frozenset(getattr(ST, n) for n in _NORMAL_TYPES.split()),
    SAFE: frozenset({ST.SELECT, ST.EXPLAIN}),
}

# Why a type no mode runs is refused, and what to do instead.
REFUSED = {
    ST.ATTACH: f"ATTACH is not available in CastSQL: {ATTACH_WHY}",
    ST.DETACH: "DETACH is not available in CastSQL: no database can be attached",
    ST.LOAD: "extensions cannot be installed or loaded from SQL in CastSQL (they run code past its checks); "
    "use DuckDB itself, or your own connection with castsql.connect(..., connection=con)",
    ST.EXTENSION: "extensions cannot be installed or updated from SQL in CastSQL",
    ST.COPY_DATABASE: "COPY FROM DATABASE is not available in CastSQL: no other database can be attached",
}

# Settings no statement may change, in any mode, and why. Reviewed against
# DuckDB 1.5.5's duckdb_settings() (tests/engine/test_barriers.py fails when a new
# setting that names a file or loosens a limit appears).
_PATH = "names a file or directory DuckDB writes to"
_LIMIT = "would loosen the limits CastSQL sets on DuckDB"
_EXT = "would let DuckDB load extension code past CastSQL's checks"
_LOG = "DuckDB's logs record HTTP requests, signed headers included"
DENIED_SETTINGS = {
    "profiling_output": _PATH, "profile_output": _PATH, "temp_directory": _PATH, "log_query_path": _PATH,
    "secret_directory": _PATH, "extension_directory": _PATH, "extension_directories": _PATH,
    "home_directory": _PATH + " ('~' in paths)", "http_logging_output": _PATH, "logging_storage": _PATH,
    "enable_logging": _LOG, "enable_http_logging": _LOG, "enabled_log_types": _LOG, "disabled_log_types": _LOG,
    "logging_level": _LOG, "logging_mode": _LOG,
    "enable_external_access": _LIMIT, "allowed_directories": _LIMIT, "allowed_paths": _LIMIT,
    "lock_configuration": _LIMIT, "allowed_configs": _LIMIT, "disabled_filesystems": _LIMIT,
    "allow_unredacted_secrets": "would show secrets", "access_mode": _LIMIT,
    "custom_extension_repository": _EXT, "autoinstall_extension_repository": _EXT,
    "autoinstall_known_extensions": _EXT, "autoload_known_extensions": _EXT, "allow_unsigned_extensions": _EXT,
    "allow_community_extensions": _EXT, "allow_extensions_metadata_mismatch": _EXT,
    "allow_parser_override_extension": _EXT,
}  # fmt: skip

# PRAGMAs that stay PRAGMA statements after DuckDB expands the rest into SELECT
# or SET: only these run (import_database, copy_database and
# json_execute_serialized_sql do not).
ALLOWED_PRAGMAS = frozenset(
    {
        "enable_profiling", "disable_profiling", "enable_profile", "disable_profile", "enable_progress_bar",
        "disable_progress_bar", "enable_print_progress_bar", "disable_print_progress_bar", "enable_optimizer",
        "disable_optimizer", "enable_object_cache", "disable_object_cache", "enable_checkpoint_on_shutdown",
        "disable_checkpoint_on_shutdown", "force_checkpoint", "enable_verification", "disable_verification",
        "verify_external", "disable_verify_external", "verify_parallelism", "disable_verify_parallelism",
        "verify_serializer", "disable_verify_serializer", "verify_fetch_row", "disable_verify_fetch_row",
        "add_parquet_key",
    }
)  # fmt: skip


def read_only(table: str) -> ForbiddenStatement:
    shown = names.table_of(table)
    return ForbiddenStatement(
        f"table {shown} cannot be written by this statement; SQL writes a table with DELETE, UPDATE, "
        "INSERT INTO … VALUES/SELECT and MERGE INTO, each a statement of its own (docs/SHELL.md, Writing in SQL)"
    )


# ---------------------------------------------------------------- the check


def check(
    con: duckdb.DuckDBPyConnection,
    sql: str,
    scope: Scope | Callable[[], Scope],
    *,
    safe: bool = False,
    kinds: Sequence[str] | None = None,
) -> None:
    """Raise ForbiddenStatement (SafeModeError in safe mode) unless every
    statement of ``sql`` is one ``scope``'s mode runs. SQL DuckDB cannot parse
    passes: it does not run either, and DuckDB's own error says why.

    ``kinds``: the statement types a query's plan (:mod:`castsql.engine.sql.plan`)
    had from DuckDB's parser. DuckDB parsed the plan's lowered text, which
    differs from ``sql`` only in names (a table's name where ``sql`` has a
    view's, quoted, with an ``AS`` alias after it; or ``sql`` is CastSQL's own
    ``SELECT`` for ``count(*)`` or ``SHOW TABLES``), so the statements of
    ``sql`` are those of the plan: when they are all SELECT,
    normal mode runs them without parsing ``sql`` again. Anything else (and
    safe mode, which reads every table function's arguments) is decided on
    DuckDB's parse of ``sql`` itself, the text that runs: a second parse.
    ``scope`` may be a function that gives it, called only when it is read."""
    if kinds and not safe and all(k == "SELECT" for k in kinds):
        return
    if callable(scope):  # computed only when a statement needs it (it costs a query)
        scope = scope()
    _refuse_import(sql, safe)
    try:
        statements = con.extract_statements(sql)
    except duckdb.ParserException:
        return
    # Any other error (IMPORT DATABASE's files missing, a PRAGMA that fails to
    # expand) is the statement's own: raised here, so that nothing is run
    # unchecked that a later attempt could expand differently.
    for st in statements:
        _check_one(con, st.type, st.query, scope, safe)


IMPORT_WHY = (
    "IMPORT DATABASE is not available in CastSQL: it runs the statements of files that could change "
    "between CastSQL's check and DuckDB's run; run the export's schema.sql and load.sql with .read"
)


def _refuse_import(sql: str, safe: bool) -> None:
    """IMPORT DATABASE (and PRAGMA import_database) run what a directory's
    schema.sql and load.sql say when DuckDB reads them, which is after the
    check read them: refused by its words, before anything is expanded."""
    toks = [t for t in tokens(sql) if t.kind != "comment"]
    for k, t in enumerate(toks):
        if (t.kind == "keyword" and t.name == "import" and k + 1 < len(toks) and toks[k + 1].name == "database") or (
            t.is_name and t.name == "import_database"
        ):
            raise (SafeModeError if safe else ForbiddenStatement)(IMPORT_WHY)


def _type_name(kind: Any) -> str:
    return str(kind).rsplit(".", 1)[-1]


def _check_one(con: duckdb.DuckDBPyConnection, kind: Any, query: str, scope: Scope, safe: bool) -> None:
    mode = SAFE if safe else NORMAL
    toks = [t for t in tokens(query) if t.kind != "comment"]
    if kind not in ALLOWED[mode]:
        if safe:
            raise SafeModeError(
                f"safe mode: {_type_name(kind)} statements are not allowed (only SELECT and EXPLAIN SELECT)"
            )
        raise ForbiddenStatement(REFUSED.get(kind) or f"{_type_name(kind)} statements are not available in CastSQL")
    if kind == ST.EXPLAIN:
        inner = _after_explain(query, toks)
        try:
            inner_statements = con.extract_statements(inner) if inner.strip() else []
        except duckdb.Error:
            return
        if safe and not all(s.type == ST.SELECT for s in inner_statements):
            raise SafeModeError("safe mode: EXPLAIN statements are not allowed (only SELECT and EXPLAIN SELECT)")
        for s in inner_statements:
            _check_one(con, s.type, s.query, scope, safe)
        return
    if kind == ST.SELECT:
        if safe:
            check_select(con, query, scope.readable)
        return
    handler = _HANDLERS.get(kind)
    if handler is not None:
        handler(con, query, toks, scope)


def _after_explain(query: str, toks: list[Tok]) -> str:
    i = 1
    while i < len(toks) and toks[i].name in ("analyze", "analyse"):
        i += 1
    if i < len(toks) and toks[i].text == "(":  # EXPLAIN (FORMAT json) …
        depth = 0
        for j in range(i, len(toks)):
            depth += toks[j].text.count("(") - toks[j].text.count(")")
            if depth <= 0:
                i = j + 1
                break
    return query[toks[i].start :] if i < len(toks) else ""


# ---------------------------------------------------------------- per statement type


def _set(con, query: str, toks: list[Tok], scope: Scope) -> None:
    if not toks:
        return
    words = [t.name for t in toks]
    if words[0] == "use" or (len(words) > 1 and words[1] == "variable"):
        return
    i = 1
    while i < len(toks) and words[i] in ("session", "global", "local"):
        i += 1
    if i >= len(toks):
        return
    setting = words[i]
    why = DENIED_SETTINGS.get(setting)
    if why is not None:
        raise ForbiddenStatement(f"setting {setting} cannot be changed from SQL in CastSQL: it {why}")


def _pragma(con, query: str, toks: list[Tok], scope: Scope) -> None:
    name = toks[1].name if len(toks) > 1 else ""
    if name not in ALLOWED_PRAGMAS:
        raise ForbiddenStatement(f"PRAGMA {name} is not available in CastSQL")


# Words of a statement's head that are grammar, not the name of its target.
_HEAD_WORDS = frozenset(
    {
        "create", "or", "replace", "temp", "temporary", "persistent", "unique", "table", "view", "macro",
        "function", "sequence", "schema", "type", "secret", "index", "if", "not", "exists", "insert", "into",
        "ignore", "update", "delete", "from", "merge", "truncate", "drop", "alter", "comment", "on", "column",
        "deallocate", "prepare", "cascade", "restrict", "materialized", "only",
    }
)  # fmt: skip
# Where the head ends: what follows is a query, values or options, whose
# names are read, not written.
_HEAD_END = frozenset({"as", "select", "values", "set", "where", "using", "default", "by", "returning", "with", "is"})


def _targets(toks: list[Tok]) -> list[str]:
    """The names a DDL/DML statement writes: those of its head, after any WITH clause."""
    start = 0
    if toks and toks[0].name == "with":  # WITH … INSERT/UPDATE/DELETE: skip the CTEs
        depth = 0
        for k, t in enumerate(toks):
            depth += t.text.count("(") - t.text.count(")")
            if depth == 0 and t.name in ("insert", "update", "delete", "merge"):
                start = k
                break
    lead, found = [], []
    j = start
    while j < len(toks) and toks[j].kind == "keyword" and toks[j].name in _HEAD_WORDS:
        lead.append(toks[j])
        j += 1
    for t in toks[j:]:
        if t.text in ("(", ";") or (t.kind == "keyword" and t.name in _HEAD_END):
            break
        if t.is_name:
            found.append(t.name)
    if not found and lead:  # DROP VIEW view: the last grammar word was the name
        found.append(lead[-1].name)
    return found


def _write(con, query: str, toks: list[Tok], scope: Scope) -> None:
    targets = _targets(toks)
    for name in targets:
        if scope.is_table(name):
            raise read_only(name)
    head = {t.name for t in toks[:6] if t.kind == "keyword"}
    if toks and toks[0].name == "create" and head & {"macro", "function"} and targets:
        # A macro named like a built-in shadows it in CastSQL's own SQL too
        # (CREATE MACRO read_parquet … would change what every table reads;
        # current_setting, what CastSQL takes for '~'), qualified or not:
        # main.read_parquet is the name read_parquet resolves to first.
        name = targets[-1]
        builtin = con.execute(
            "SELECT count(*) FROM system.main.duckdb_functions() WHERE database_name = 'system' AND function_name = ?",
            [name],
        ).fetchone()[0]
        if builtin:
            raise ForbiddenStatement(f"{name} is a built-in function: a macro cannot replace it in CastSQL")


def _copy(con, query: str, toks: list[Tok], scope: Scope) -> None:
    depth, direction, at = 0, None, 0
    for k, t in enumerate(toks[1:], 1):
        depth += t.text.count("(") - t.text.count(")")
        if depth == 0 and t.name in ("to", "from") and t.kind == "keyword":
            direction, at = t.name, k
            break
    if direction == "from":
        for t in toks[1:at]:
            if t.is_name and scope.is_table(t.name):
                raise read_only(t.name)
        return
    if direction != "to" or at + 1 >= len(toks):
        return  # DuckDB refuses it
    target = toks[at + 1]
    if target.is_name and target.name in ("stdout", "stderr"):
        return
    path = literal_at(query, toks, at + 1)  # as DuckDB reads it: E'…' escapes, continued lines
    if path is None:
        raise ForbiddenStatement("COPY … TO must name its target as a literal path ('…')")
    _check_options(query, toks, at + 2)
    check_write_target(path, scope, "COPY … TO")


def _check_options(query: str, toks: list[Tok], start: int) -> None:
    for k in range(start, len(toks)):
        if toks[k].name == "filename_pattern":
            for j in range(k + 1, min(k + 3, len(toks))):
                if toks[j].kind != "string_const":
                    continue
                s = literal_at(query, toks, j)
                if s is None or "/" in s or "\\" in s or ".." in s:
                    raise ForbiddenStatement(f"FILENAME_PATTERN {toks[j].text} must be a file name, not a path")


def _export(con, query: str, toks: list[Tok], scope: Scope) -> None:
    for k, t in enumerate(toks):
        if t.kind != "string_const":
            continue
        path = literal_at(query, toks, k)  # the first literal is the directory, whatever the ones after it say
        if path is None:
            break
        check_write_target(path, scope, "EXPORT DATABASE")
        return
    raise ForbiddenStatement("EXPORT DATABASE must name its directory as a literal path ('…')")


def _call(con, query: str, toks: list[Tok], scope: Scope) -> None:
    words = [t.name for t in toks]
    if "checkpoint" in words[:2]:
        k = words.index("checkpoint")
        if k + 1 < len(toks) and toks[k + 1].is_name and toks[k + 1].name not in OWN_DATABASES:
            raise ForbiddenStatement(
                f"CHECKPOINT {toks[k + 1].text}: only the session's own in-memory database can be checkpointed"
            )
        return
    if len(toks) > 2 and toks[2].text == ".":
        raise ForbiddenStatement(
            f"CALL {toks[1].text}.{toks[3].text if len(toks) > 3 else ''}(): "
            "functions of attached catalogs are not available in CastSQL (no catalog can be attached)"
        )


_HANDLERS = {
    ST.SET: _set,
    ST.VARIABLE_SET: _set,
    ST.PRAGMA: _pragma,
    ST.CREATE: _write,
    ST.CREATE_FUNC: _write,
    ST.DROP: _write,
    ST.ALTER: _write,
    ST.INSERT: _write,
    ST.UPDATE: _write,
    ST.DELETE: _write,
    ST.MERGE_INTO: _write,
    ST.COPY: _copy,
    ST.EXPORT: _export,
    ST.CALL: _call,
}


def _prepare(con, query: str, toks: list[Tok], scope: Scope) -> None:
    for k, t in enumerate(toks):
        if t.name == "as" and t.kind == "keyword":
            inner = query[toks[k + 1].start :] if k + 1 < len(toks) else ""
            try:
                inner_statements = con.extract_statements(inner)
            except duckdb.Error:
                return
            for s in inner_statements:
                _check_one(con, s.type, s.query, scope, False)
            return


_HANDLERS[ST.PREPARE] = _prepare


# ---------------------------------------------------------------- paths written to

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.DOTALL)
# Every store CastSQL serves, and the S3 spellings only DuckDB's httpfs reads.
_OBJECT_STORES = frozenset({n for s in SCHEMES for n in s.names} | {"s3n", "r2"})


def check_write_target(path: str, scope: Scope, what: str) -> None:
    """ForbiddenStatement if DuckDB writing ``path`` (a file, or a directory it
    may empty first with OVERWRITE) could touch a protected root, or a root lies
    under it. Local paths are compared after resolving symbolic links and
    ``~``; object-store URLs by bucket and key, whatever their scheme."""
    target = _location(path, scope.home)
    if target is None:
        raise ForbiddenStatement(f"{what} {path!r}: CastSQL writes only to local paths and object-store URLs")
    # DuckDB may write PATH.tmp first and move it in place.
    for cand in (target, (target[0], target[1] + ".tmp")):
        for root in scope.protected:
            loc = _location(root, scope.home)
            if loc is not None and _overlaps(cand, loc):
                raise ForbiddenStatement(
                    f"{what} {path!r}: the target overlaps {root}, which CastSQL reads; "
                    "write somewhere outside every opened table and warehouse"
                )


def _location(path: str, home: str | None) -> tuple[str, str] | None:
    """(where, normalised path): ('', local real path) or ('bucket', key)."""
    if path.lower().startswith("file:"):
        path = re.sub(r"^file:(//(localhost)?)?", "", path, flags=re.IGNORECASE)
    m = _URL.match(canonical_uri(path))
    if m:
        scheme, rest = m.group(1).lower(), m.group(2)
        if scheme not in _OBJECT_STORES:
            return None
        rest = unquote(rest.split("?", 1)[0].split("#", 1)[0])
        bucket, _, key = rest.partition("/")
        return bucket.lower() or "?", _object_key(key)
    if path.startswith("~"):
        path = (home or os.path.expanduser("~")) + path[1:]
    return "", os.path.realpath(path)


def _object_key(key: str) -> str:
    """``key`` as every store may resolve it: empty and ``.`` segments dropped,
    ``..`` applied. ``s3://b//t/x`` is the key ``/t/x`` on AWS but ``t/x`` on
    stores that collapse slashes (SeaweedFS, MinIO): taken as ``t/x``."""
    parts: list[str] = []
    for seg in key.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    return "/" + "/".join(parts)


def _overlaps(a: tuple[str, str], b: tuple[str, str]) -> bool:
    if a[0] != b[0]:
        return False
    x, y = a[1].rstrip("/") + "/", b[1].rstrip("/") + "/"
    return x.startswith(y) or y.startswith(x)
