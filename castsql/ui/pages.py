"""The UI's pages as HTML: one function a page, every value escaped.

Pages are drawn on the server (a table of rows is HTML, readable without
script); the chart and the SQL grid are drawn by ``static/ui.js`` from JSON
the page carries or fetches.

Example::

    >>> "<td>" in layout("t", "<table><tr><td>1</td></tr></table>", heads={})
    True
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote, urlencode

import pyarrow as pa

from castsql.format.properties import AUTO_COMPACT, CHANGE_DATA_FEED, MIRROR_DELTA, MIRROR_ICEBERG
from castsql.format.schema import Schema
from castsql.ui.diff import AUDIT_COLUMNS, Diff
from castsql.ui.model import MARKED, SCHEMA_CHANGE, Point, TableInfo

DIFF_PAGE = 100  # diff entries a page


def esc(v: Any) -> str:
    return html.escape(str(v), quote=True)


def cell(v: Any) -> str:
    """A value as a table cell shows it: NULL set apart from the text 'NULL'."""
    if v is None:
        return '<span class="null">NULL</span>'
    if isinstance(v, datetime):
        return esc(v.isoformat(sep=" "))
    return esc(v)


def when(t: datetime | float) -> str:
    if isinstance(t, float | int):
        t = datetime.fromtimestamp(t, UTC)
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def size(n: int) -> str:
    x = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if x < 1024 or unit == "TB":
            return f"{x:.0f} {unit}" if unit == "B" else f"{x:.1f} {unit}"
        x /= 1024
    return f"{n} B"


def table_url(name: str, *parts: str, **query: Any) -> str:
    url = "/tables/" + quote(name, safe="") + "".join("/" + quote(p, safe="") for p in parts)
    q = {k: v for k, v in query.items() if v is not None}
    return url + ("?" + urlencode(q) if q else "")


def layout(title: str, body: str, *, heads: dict[str, int | None], live: bool = True, crumbs: str = "") -> str:
    """The page around ``body``: ``heads`` (each table's version as drawn) is
    what the poller compares with the server's, to redraw when one moved."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{esc(title)} · CastSQL</title>"
        '<link rel=stylesheet href="/static/uPlot.min.css"><link rel=stylesheet href="/static/ui.css">'
        '<script src="/static/uPlot.iife.min.js"></script><script src="/static/ui.js" defer></script>'
        "</head><body>"
        f'<header><a href="/" class=brand>CastSQL</a>{crumbs}<nav><a href="/sql">SQL</a></nav>'
        "<span id=live class=live hidden></span></header>"
        f"<main data-heads='{esc(json.dumps(heads))}' data-live='{'1' if live else '0'}'>{body}</main>"
        "</body></html>"
    )


def crumb(name: str, *more: tuple[str, str | None]) -> str:
    out = f' / <a href="{esc(table_url(name))}">{esc(name)}</a>'
    for label, url in more:
        out += f" / <a href='{esc(url)}'>{esc(label)}</a>" if url else f" / {esc(label)}"
    return out


def error_page(message: str, heads: dict[str, int | None]) -> str:
    return layout("Error", f"<p class=error role=alert>Error: {esc(message)}</p>", heads=heads, live=False)


# ---------------------------------------------------------------- warehouse


def _flags(props: dict[str, str]) -> str:
    out = []
    for key, label in (
        (AUTO_COMPACT, "autoCompact"),
        (CHANGE_DATA_FEED, "change feed"),
        (MIRROR_DELTA, "Delta mirror"),
        (MIRROR_ICEBERG, "Iceberg mirror"),
    ):
        on = props.get(key, "false").lower() == "true"
        out.append(f'<span class="flag {"on" if on else "off"}" title="{esc(key)}">{esc(label)}</span>')
    return " ".join(out)


def _table_row(t: TableInfo | tuple[str, str]) -> str:
    if isinstance(t, tuple):  # its newest version does not read: say why, in its row
        name, why = t
        return (
            f'<tr data-table="{esc(name)}"><td><a href="{esc(table_url(name))}">{esc(name)}</a></td>'
            f"<td colspan=8 class=error>Error: {esc(why)}</td></tr>"
        )
    return (
        f'<tr data-table="{esc(t.name)}"><td><a href="{esc(table_url(t.name))}">{esc(t.name)}</a></td>'
        f"<td class=num>{t.rows:,}</td><td class=num>{t.version}</td><td>{when(t.committed_at)}</td>"
        f"<td class=num>{size(t.bytes)}</td><td class=num>{t.data_files:,}</td><td class=num>{t.tombstone_files:,}</td>"
        f"<td>{esc(t.primary_key or '')}</td><td>{_flags(t.properties)}</td></tr>"
    )


def warehouse(uri: str, tables: Sequence[TableInfo | tuple[str, str]], heads: dict[str, int | None]) -> str:
    rows = "".join(_table_row(t) for t in tables)
    body = (
        f"<h1>Warehouse</h1><p class=uri>{esc(uri)}</p>"
        "<table class=grid id=tables><thead><tr><th>table</th><th>rows</th><th>version</th><th>committed</th>"
        "<th>size</th><th>data files</th><th>tombstone files</th><th>primary key</th><th>properties</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    return layout("Warehouse", body, heads=heads)


# ---------------------------------------------------------------- table


def _mark(op: str, version: int = -1, reshaped: frozenset[int] = frozenset()) -> str:
    return SCHEMA_CHANGE if version in reshaped else MARKED.get(op.upper(), "")


def timeline_json(points: Sequence[Point], total: int, reshaped: frozenset[int] = frozenset()) -> dict[str, Any]:
    """The chart's data: one entry a version in every array; ``total``: how
    many versions are kept (more than ``points`` when it holds the newest only);
    ``reshaped``: the versions whose schema changed."""
    marks = [_mark(p.operation, p.version, reshaped) for p in points]
    return {
        "total": total,
        "version": [p.version for p in points],
        "time": [p.time for p in points],
        "operation": [p.operation for p in points],
        "stored_rows": [p.stored_rows for p in points],
        "files": [p.files for p in points],
        "tombstones": [p.tombstones for p in points],
        "rows_written": [p.rows_written for p in points],
        "marks": sorted({m for m in marks if m}),
        "mark": marks,
    }


VERSIONS_PAGE = 100
FIRST_POINTS = 500  # versions the table page's chart carries; the rest are fetched after


def table(
    name: str,
    points: Sequence[Point],
    shown: Sequence[tuple[Point, str]],
    heads: dict[str, int | None],
    *,
    before: int | None,
    older: int | None,
    total: int,
    earliest: int,
    reshaped: frozenset[int] = frozenset(),
) -> str:
    """``shown``: the listed versions (newest first) with their commit
    metadata; ``older``: the first version of the next page."""
    # Inside <script> entities are not decoded: only "<" could end the element early.
    data = json.dumps(timeline_json(points, total, reshaped)).replace("<", "\\u003c")
    rows = []
    for p, metatext in shown:
        prev = p.version - 1
        diff_prev = (
            f' <a href="{esc(table_url(name, "diff", **{"from": prev, "to": p.version}))}">diff</a>'
            if p.version > earliest
            else ""
        )
        rows.append(
            f'<tr data-version="{p.version}"><td><input type=radio name=from value="{p.version}" aria-label="from">'
            f'<input type=radio name=to value="{p.version}" aria-label="to"></td>'
            f"<td class=num>{p.version}</td><td class=op data-mark='{esc(_mark(p.operation, p.version, reshaped))}'>"
            f"{esc(p.operation)}</td>"
            f"<td>{when(p.time)}</td><td class='num exact' data-col=rows_inserted></td>"
            f"<td class='num exact' data-col=rows_updated></td><td class='num exact' data-col=rows_deleted></td>"
            f"<td class='num exact' data-col=live_rows></td>"
            f"<td class=num>{p.files:,}</td><td class=num>{p.tombstones:,}</td><td class=num>{p.rows_written:,}</td>"
            f'<td class=meta>{esc(metatext)}</td><td><a href="{esc(table_url(name, "schema", version=p.version))}">'
            f"schema</a>{diff_prev}</td></tr>"
        )
    pager = ""
    if before is not None:
        pager += f'<a href="{esc(table_url(name))}">newest</a> '
    if older is not None:
        pager += f'<a href="{esc(table_url(name, before=older))}" id=older>older versions</a>'
    body = (
        f"<h1>{esc(name)}</h1>"
        f"<p>{total:,} versions kept, newest {points[-1].version if points else '-'}. "
        f'<a href="{esc(table_url(name, "schema"))}">schema</a> · '
        "<label>key <input id=keybox size=12></label> <button id=keygo>row history</button></p>"
        f"<script type=application/json id=timeline>{data}</script>"
        f'<div id=charts data-table="{esc(name)}"><div id=chart-changes></div><div id=chart-size></div></div>'
        "<p class=note id=exact-note>Rows inserted, updated, deleted and live: reading the history audit…</p>"
        '<form id=pick method=get action="' + esc(table_url(name, "diff")) + '">'
        "<h2>Versions</h2><p>Pick a <b>from</b> and a <b>to</b> version, then "
        "<button type=submit id=diffgo>diff</button></p>"
        "<table class=grid id=versions><thead><tr><th>from / to</th><th>version</th><th>operation</th>"
        "<th>committed</th>"
        "<th>inserted</th><th>updated</th><th>deleted</th><th>live rows</th><th>files</th><th>tombstones</th>"
        "<th>rows written</th><th>commit metadata</th><th></th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></form><p class=pager>{pager}</p>"
    )
    return layout(name, body, heads=heads, crumbs=crumb(name))


# ---------------------------------------------------------------- diff


def _values(cols: Sequence[str], row: dict[str, Any] | None, changed: Iterable[str] = ()) -> str:
    if row is None:
        return "".join("<td class=empty></td>" for _ in cols)
    ch = set(changed)
    return "".join(f"<td{' class=changed' if c in ch else ''}>{cell(row.get(c))}</td>" for c in cols)


Heads = dict[str, int | None]
KIND_LABEL = {"insert": "added", "delete": "removed", "update": "updated"}


def diff(name: str, a: int, b: int, cols: Sequence[str], entries: Diff, page: int, heads: Heads) -> str:
    counts = entries.counts
    start = page * DIFF_PAGE
    shown = entries.page(start, DIFF_PAGE)
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    rows = "".join(
        f'<tr class="{e.kind}" data-kind="{e.kind}"><td class=kind>{KIND_LABEL[e.kind]}</td>'
        f"{_values(cols, e.old, e.changed)}<td class=sep></td>{_values(cols, e.new, e.changed)}</tr>"
        for e in shown
    )
    nav = []
    if page > 0:
        nav.append(f'<a href="{esc(table_url(name, "diff", **{"from": a, "to": b, "page": page - 1}))}">previous</a>')
    if start + DIFF_PAGE < len(entries):
        nav.append(
            f'<a id=next href="{esc(table_url(name, "diff", **{"from": a, "to": b, "page": page + 1}))}">next</a>'
        )
    last = max(0, (len(entries) - 1) // DIFF_PAGE)
    body = (
        f"<h1>{esc(name)}: version {a} → {b}</h1>"
        f'<p id=counts><span class=insert data-n="{counts["insert"]}">{counts["insert"]:,} added</span> · '
        f'<span class=delete data-n="{counts["delete"]}">{counts["delete"]:,} removed</span> · '
        f'<span class=update data-n="{counts["update"]}">{counts["update"]:,} updated</span></p>'
        f"<p class=pager>page {page + 1} of {last + 1} {' · '.join(nav)}</p>"
        f'<table class="grid diff" id=diff><thead><tr><th></th><th colspan={len(cols)}>version {a} (old)</th><th></th>'
        f"<th colspan={len(cols)}>version {b} (new)</th></tr><tr><th></th>{head}<th></th>{head}</tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
    return layout(f"{name} diff", body, heads=heads, live=False, crumbs=crumb(name, (f"diff {a} → {b}", None)))


# ---------------------------------------------------------------- row history


def row_history(name: str, key: str, rows: pa.Table, heads: dict[str, int | None]) -> str:
    """A key's life: one line a version, its values before and after."""
    cols = [c for c in rows.column_names if c not in AUDIT_COLUMNS]
    events: list[tuple[int, Any, str, dict | None, dict | None]] = []
    pre: dict | None = None
    gone = False
    for r in rows.to_pylist():
        kind, v, t = r.pop("_change_type"), r.pop("_commit_version"), r.pop("_commit_timestamp")
        if kind == "update_preimage":
            pre = r
            continue
        if kind == "update_postimage":
            events.append((v, t, "updated", pre, r))
        elif kind == "insert":
            events.append((v, t, "re-inserted" if gone else "inserted", None, r))
            gone = False
        else:
            events.append((v, t, "deleted", r, None))
            gone = True
        pre = None
    head = "".join(f"<th>{esc(c)}</th>" for c in cols)
    body_rows = "".join(
        f'<tr data-version="{v}" data-event="{esc(what)}"><td class=num>{v}</td><td>{when(t)}</td>'
        f'<td class="ev {what.split("-")[-1]}">{esc(what)}</td>'
        f"{_values(cols, old, ch)}<td class=sep></td>{_values(cols, new, ch)}</tr>"
        for v, t, what, old, new in events
        for ch in [_changed(cols, old, new)]
    )
    body = (
        f"<h1>{esc(name)}: key {esc(key)}</h1>"
        f"<p>{len(events)} change{'s' * (len(events) != 1)}"
        + (" (this key was never in a kept version)" if not events else "")
        + "</p>"
        f'<table class="grid diff" id=history><thead><tr><th>version</th><th>committed</th><th>change</th>'
        f"<th colspan={len(cols)}>before</th><th></th><th colspan={len(cols)}>after</th></tr>"
        f"<tr><th></th><th></th><th></th>{head}<th></th>{head}</tr></thead><tbody>{body_rows}</tbody></table>"
    )
    return layout(f"{name} {key}", body, heads=heads, crumbs=crumb(name, (f"key {key}", None)))


def _changed(cols: Sequence[str], old: dict | None, new: dict | None) -> list[str]:
    if old is None or new is None:
        return []
    return [c for c in cols if old.get(c) != new.get(c)]


# ---------------------------------------------------------------- schema


def schema(
    name: str,
    version: int,
    latest: int,
    s: Schema,
    pk: str | None,
    changes: Sequence[tuple[int, list[str]]],
    heads: dict[str, int | None],
) -> str:
    rows = "".join(
        f'<tr data-column="{esc(c.name)}"><td>{esc(c.name)}</td><td>{esc(c.type)}</td>'
        f"<td>{'primary key' if c.name == pk else ''}</td>"
        f"<td class=num>{'' if c.added_in is None else c.added_in}</td></tr>"
        for c in s.columns
    )
    ch = "".join(
        f'<li data-version="{v}"><a href="{esc(table_url(name, "schema", version=v))}">version {v}</a>: '
        f"{esc('; '.join(what) or 'changed')}</li>"
        for v, what in changes
    )
    body = (
        f"<h1>{esc(name)}: schema at version {version}</h1>"
        f'<form method=get><label>version <input name=version type=number min=0 max={latest} value="{version}">'
        "</label> <button>show</button></form>"
        "<table class=grid id=schema><thead><tr><th>column</th><th>type</th><th></th><th>added in version</th></tr>"
        f"</thead><tbody>{rows}</tbody></table>"
        f"<h2>Schema changes</h2><ul id=schema-changes>{ch or '<li>none: every kept version has this schema</li>'}</ul>"
    )
    return layout(f"{name} schema", body, heads=heads, crumbs=crumb(name, ("schema", None)))


# ---------------------------------------------------------------- SQL


def sql(tables: Sequence[tuple[str, Sequence[int], list[tuple[str, str]]]], query: str, heads: Heads) -> str:
    """``tables``: each table's name, the versions its AS OF picker offers, its columns and types."""
    side = "".join(
        f'<li data-table="{esc(t)}"><b class=ins data-text="{esc(t)}">{esc(t)}</b>'
        f' <label>AS OF <select class=asof data-table="{esc(t)}"><option value="">newest</option>'
        + "".join(f'<option value="{v}">{v}</option>' for v in versions)
        + "</select></label><ul>"
        + "".join(f'<li class=ins data-text="{esc(c)}">{esc(c)} <i>{esc(ty)}</i></li>' for c, ty in cols)
        + "</ul></li>"
        for t, versions, cols in tables
    )
    body = (
        "<h1>SQL</h1><div class=sqlpage><aside><h2>Tables</h2><ul id=tablelist>"
        f"{side}</ul></aside><section>"
        f"<textarea id=query spellcheck=false rows=8>{esc(query)}</textarea>"
        "<p><button id=run>Run</button> <kbd>Ctrl-Enter</kbd> · export "
        "<a id=csv href=#>CSV</a> · <a id=parquet href=#>Parquet</a></p>"
        "<p id=sqlerror class=error role=alert hidden></p><p id=sqlstatus></p>"
        "<table class=grid id=result></table><p class=pager><button id=prev disabled>previous</button> "
        "<button id=next disabled>next</button></p></section></div>"
    )
    return layout("SQL", body, heads=heads, live=False)
