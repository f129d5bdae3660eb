"""The value DuckDB gives a string literal, for the checks that act on one
(a COPY or EXPORT target, a FILENAME_PATTERN, a path in the work directory).

A literal's meaning is DuckDB's to say, and it has more forms than it seems:
``E'…'`` escapes (``E'\\x2f'`` and ``E'\\057'`` are both ``/``), a
literal continued on the next line (``'/tmp/a'`` newline ``'/../b'`` is
``/tmp/a/../b``, with ``--`` comments between the parts), dollar quotes. A
check that reads a different value than DuckDB writes to checks the wrong
path, so every form but the plain ``'…'`` is evaluated by DuckDB itself:
the text from the literal's start to where DuckDB's tokenizer starts the next
token is one token by DuckDB's own account, so ``SELECT <it>`` runs nothing
else, on a private connection with no file access.

Example::

    >>> from castsql.engine.barrier.guard import tokens
    >>> sql = "COPY t TO E'/tmp\\\\x2fout.csv'"
    >>> toks = tokens(sql)
    >>> literal_at(sql, toks, 3)
    '/tmp/out.csv'
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import duckdb

_CON: duckdb.DuckDBPyConnection | None = None
_LOCK = threading.Lock()


def literal_at(sql: str, toks: Sequence[Any], k: int) -> str | None:
    """The value of the string literal ``toks[k]`` of ``sql`` (DuckDB's tokens:
    ``kind`` and ``start`` are read) as DuckDB reads it; None if it is not a
    string literal (or DuckDB gives it no value)."""
    tok = toks[k]
    if tok.kind != "string_const":
        return None
    end = toks[k + 1].start if k + 1 < len(toks) else len(sql)
    span = sql[tok.start : end].rstrip()
    if _plain(span):
        return span[1:-1].replace("''", "'")
    return _evaluate(span)


def _plain(span: str) -> bool:
    """``'…'`` with only doubled quotes inside: read here, without DuckDB."""
    return len(span) >= 2 and span[0] == span[-1] == "'" and "'" not in span[1:-1].replace("''", "")


def _evaluate(span: str) -> str | None:
    global _CON
    with _LOCK:
        if _CON is None:
            _CON = duckdb.connect(config={"enable_external_access": False})
        try:
            rows = _CON.execute(f"SELECT {span}\n").fetchall()
        except duckdb.Error:
            return None
    if len(rows) != 1 or len(rows[0]) != 1 or not isinstance(rows[0][0], str):
        return None
    return rows[0][0]
