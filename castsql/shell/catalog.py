"""What the shell knows about the open tables, cached for completion and the banner.

Start-up only asks each table for its latest version (one pointer read and a
probe, done in parallel). Column lists, version lists, DuckDB's function and
keyword names are fetched the first time completion needs them, then cached:
columns until ``.refresh``/``.open``, versions for a few seconds (new commits
appear without a refresh).

Example::

    >>> from castsql.engine import Session
    >>> cat = Catalog(lambda: Session())
    >>> "select" in {k.lower() for k in cat.keywords()}
    True
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from castsql.engine import Session

VERSIONS_TTL = 5.0  # seconds a version list stays fresh
VERSION_DETAILS = 50  # newest versions whose manifests are read for their operation and time

_PLAIN_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class VersionInfo:
    version: int
    operation: str | None = None
    created_at: datetime | None = None


@dataclass(frozen=True)
class FunctionInfo:
    name: str
    kinds: frozenset[str]  # scalar, aggregate, table, macro, table_macro, pragma (range is scalar and table)

    @property
    def kind(self) -> str:
        return "/".join(sorted(self.kinds))


def latest_versions(session: Session, tables: Sequence[str] | None = None) -> dict[str, int | None]:
    """Latest version of each table (None for one that cannot be read), fetched in parallel.

    Example: ``latest_versions(session)`` -> ``{"events": 6, "users": 1}``.
    """
    from castsql.storage.base import overlapped

    names = list(session.tables if tables is None else tables)

    def one(name: str) -> int | None:
        try:
            return session.log(name).latest_version()
        except Exception:  # one broken table must not hide the others
            return None

    return dict(zip(names, overlapped(one, names), strict=True))


def quote_ident(name: str, reserved: set[str] | frozenset[str] = frozenset()) -> str:
    """``name`` as it must be written in SQL: bare when it can be, else in double quotes.

    Example::

        >>> quote_ident("events"), quote_ident("my table"), quote_ident("select", {"SELECT"})
        ('events', '"my table"', '"select"')
    """
    if _PLAIN_IDENT.match(name) and name.upper() not in reserved:
        return name
    return '"' + name.replace('"', '""') + '"'


class Catalog:
    """Names for completion, from whatever session ``session()`` returns now."""

    def __init__(self, session: Callable[[], Session]) -> None:
        self._session = session
        self._lock = threading.Lock()
        self._columns: dict[str, list[tuple[str, str]]] = {}
        self._versions: dict[str, tuple[float, list[VersionInfo]]] = {}
        self._functions: list[FunctionInfo] | None = None
        self._keywords: list[str] | None = None
        self._reserved: frozenset[str] = frozenset()

    @property
    def session(self) -> Session:
        return self._session()

    def invalidate(self) -> None:
        """Forget table metadata (after ``.refresh`` or ``.open``)."""
        with self._lock:
            self._columns.clear()
            self._versions.clear()

    def tables(self) -> list[str]:
        return self.session.tables

    def table_name(self, name: str) -> str | None:
        """The open table called ``name`` (any case), or None."""
        low = name.lower()
        return next((t for t in self.tables() if t.lower() == low), None)

    def columns(self, table: str) -> list[tuple[str, str]]:
        """(name, type) of the columns of ``table``'s latest version; [] when unknown."""
        key = table.lower()
        with self._lock:
            if key in self._columns:
                return self._columns[key]
        try:
            cols = [(c.name, c.type) for c in self.session.log(table).latest().schema.columns]
        except Exception:
            cols = []
        with self._lock:
            self._columns[key] = cols
        return cols

    def versions(self, table: str) -> list[VersionInfo]:
        """Kept versions of ``table``, newest first; the newest carry their operation and commit time."""
        key = table.lower()
        now = time.monotonic()
        with self._lock:
            hit = self._versions.get(key)
            if hit and now - hit[0] < VERSIONS_TTL:
                return hit[1]
        try:
            log = self.session.log(table)
            vs = sorted(log.versions(), reverse=True)
            out = []
            for i, v in enumerate(vs):
                if i < VERSION_DETAILS:
                    m = log.manifest(v)
                    out.append(VersionInfo(v, m.operation, m.created_at))
                else:
                    out.append(VersionInfo(v))
        except Exception:
            out = []
        with self._lock:
            self._versions[key] = (now, out)
        return out

    def _load_duckdb_names(self) -> None:
        # A cursor is a second connection to the same database: this may run
        # from the completion thread without touching the shell's connection.
        cur = self.session.con.cursor()
        try:
            funcs = cur.sql(
                "SELECT DISTINCT function_name, function_type FROM duckdb_functions() "
                "WHERE function_name NOT LIKE '\\_\\_%' ESCAPE '\\' ORDER BY 1"
            ).fetchall()
            kws = cur.sql("SELECT keyword_name, keyword_category FROM duckdb_keywords() ORDER BY 1").fetchall()
        finally:
            cur.close()
        kinds: dict[str, set[str]] = {}
        for name, kind in funcs:
            if name.isidentifier():
                kinds.setdefault(name, set()).add(kind)
        with self._lock:
            self._functions = [FunctionInfo(n, frozenset(k)) for n, k in sorted(kinds.items())]
            self._keywords = sorted({k.upper() for k, _ in kws})
            self._reserved = frozenset(k.upper() for k, cat in kws if cat == "reserved")

    def functions(self) -> list[FunctionInfo]:
        if self._functions is None:
            self._load_duckdb_names()
        return self._functions or []

    def keywords(self) -> list[str]:
        if self._keywords is None:
            self._load_duckdb_names()
        return self._keywords or []

    def reserved(self) -> frozenset[str]:
        if self._keywords is None:
            self._load_duckdb_names()
        return self._reserved

    def warm(self) -> None:
        """Load DuckDB's names now (from a background thread at start-up) so the first Tab is instant."""
        with contextlib.suppress(Exception):
            self.functions()
