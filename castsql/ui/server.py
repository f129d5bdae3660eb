"""The UI's HTTP server: the standard library's threading HTTP server, a
token check on every request, and the routes.

Why the standard library and not a framework: the UI is one user's local,
read-only page with a dozen GET routes; every request that touches DuckDB
runs under one lock anyway (one connection), so an async framework would buy
nothing, and ``http.server`` adds no dependency to install or keep pinned.

The token works as Jupyter's does: the printed URL carries it once
(``?token=…``), the answer sets it as a cookie (HttpOnly, SameSite=Strict)
and sends the browser to the same URL without it; any request without the
cookie or the token gets 403.

Example::

    >>> server = make_server(Warehouse.open("./demo-warehouse"), "127.0.0.1", 0)   # doctest: +SKIP
    >>> server.url                                                                 # doctest: +SKIP
    'http://127.0.0.1:40123/?token=…'
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
import tempfile
from collections.abc import Callable
from datetime import date, datetime, time
from decimal import Decimal
from http import HTTPStatus
from http.cookies import SimpleCookie
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.resources import files
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

from castsql.errors import CastSQLError, TableNotFound, VersionNotFound, one_line
from castsql.ui import pages
from castsql.ui.model import NotFound, UIError, Warehouse

COOKIE = "castsql_ui_token_{port}"  # one a port: cookies are per host, not per port, and two UIs may run
STATIC = files("castsql.ui") / "static"
_TYPES = {".js": "text/javascript", ".css": "text/css", ".txt": "text/plain", ".png": "image/png"}
PAGE_SIZE = 100  # SQL result rows a page
MAX_PAGE = 10_000
FORBIDDEN = b"Error: this page needs the token of the URL that castsql ui printed\n"


class Server(ThreadingHTTPServer):
    daemon_threads = True  # a request still running does not hold the process at Ctrl-C

    def __init__(self, warehouse: Warehouse, uri: str, host: str, port: int, token: str) -> None:
        super().__init__((host, port), Handler)
        self.warehouse = warehouse
        self.uri = uri
        self.token = token

    @property
    def cookie(self) -> str:
        """The name of this server's token cookie."""
        return COOKIE.format(port=self.server_address[1])

    @property
    def url(self) -> str:
        host, port = self.server_address[0], self.server_address[1]
        host = host.decode() if isinstance(host, bytes) else host
        return f"http://{host}:{port}/?token={self.token}"


def make_server(warehouse: Warehouse, uri: str, host: str = "127.0.0.1", port: int = 0) -> Server:
    """A server of ``warehouse``'s pages on ``host:port`` (0: any free port)
    with a new random token; :attr:`Server.url` carries it. Not started:
    call ``serve_forever``."""
    return Server(warehouse, uri, host, port, secrets.token_urlsafe(24))


class Handler(BaseHTTPRequestHandler):
    server: Server
    streaming = False
    protocol_version = "HTTP/1.0"  # one request a connection: a streamed export ends when the connection closes

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the console shows the URL, not a line per request

    # ------------------------------------------------------------ plumbing

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        token = query.pop("token", None)
        if token is not None and hmac.compare_digest(token.encode(), self.server.token.encode()):
            # The token once, in the URL; from now on the cookie.
            self.send_response(HTTPStatus.FOUND)
            self.send_header("Set-Cookie", f"{self.server.cookie}={token}; HttpOnly; SameSite=Strict; Path=/")
            self.send_header("Location", parts.path + ("?" + urlencode(query) if query else ""))
            self.end_headers()
            return
        if not self._authorized():
            self._send(HTTPStatus.FORBIDDEN, "text/plain", FORBIDDEN)
            return
        self.streaming = False  # set once an export has sent its first bytes
        try:
            self._route(unquote(parts.path), query)
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:
            if self.streaming:  # an export failed after its first bytes: the download ends short
                return
            if isinstance(e, CastSQLError):
                missing = isinstance(e, NotFound | TableNotFound | VersionNotFound)
                self._error(one_line(e), parts.path, HTTPStatus.NOT_FOUND if missing else HTTPStatus.BAD_REQUEST)
            else:  # a bug still answers one line, never a stack trace
                self._error(f"{type(e).__name__}: {one_line(e)}", parts.path, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _authorized(self) -> bool:
        raw = self.headers.get("Cookie")
        if not raw:
            return False
        c = SimpleCookie()
        try:
            c.load(raw)
        except Exception:
            return False
        got = c.get(self.server.cookie)
        return got is not None and hmac.compare_digest(got.value.encode(), self.server.token.encode())

    def _send(self, status: int, ctype: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _html(self, text: str, status: int = HTTPStatus.OK) -> None:
        self._send(status, "text/html; charset=utf-8", text.encode())

    def _json(self, obj: Any, status: int = HTTPStatus.OK) -> None:
        self._send(status, "application/json", json.dumps(obj, default=_jsonable).encode())

    def _error(self, message: str, path: str, status: int) -> None:
        if path.startswith(("/api/", "/export")):
            self._json({"error": f"Error: {message}"}, status)
        else:
            self._html(pages.error_page(message, self._heads()), status)

    def _heads(self) -> dict[str, int | None]:
        return self.server.warehouse.heads()

    # ------------------------------------------------------------ routes

    def _route(self, path: str, q: dict[str, str]) -> None:
        for pattern, handler in ROUTES:
            m = pattern.fullmatch(path)
            if m:
                handler(self, q, *m.groups())
                return
        raise NotFound(f"no page {path}")

    def warehouse_page(self, q: dict[str, str]) -> None:
        w = self.server.warehouse
        self._html(pages.warehouse(self.server.uri, w.overview(), self._heads()))

    def table_page(self, q: dict[str, str], table: str) -> None:
        w = self.server.warehouse
        name = w.name(table)
        kept = w.kept(name)
        before = int(q["before"]) if q.get("before", "").isdigit() else None
        newest_first = [v for v in reversed(kept) if before is None or v <= before]
        shown = newest_first[: pages.VERSIONS_PAGE]
        older = newest_first[pages.VERSIONS_PAGE] if len(newest_first) > pages.VERSIONS_PAGE else None
        # The chart starts with the newest versions, a bounded read however
        # long the history; the page fetches the whole timeline after it is
        # drawn (the server keeps every point it read, so that is once).
        first = sorted(set(kept[-pages.FIRST_POINTS :]) | set(shown))
        points = w.timeline(name, first)
        at = {p.version: p for p in points}
        listed = [(at[v], w.commit_meta(name, v)) for v in shown if v in at]
        reshaped = frozenset(v for v, _ in w.schema_changes(name))
        self._html(
            pages.table(
                name, points, listed, self._heads(),
                before=before, older=older, total=len(kept), earliest=kept[0], reshaped=reshaped,
            )
        )  # fmt: skip

    def diff_page(self, q: dict[str, str], table: str) -> None:
        w = self.server.warehouse
        name = w.name(table)
        latest = w.log(name).latest_version()
        a = w.version(name, q.get("from"))
        b = w.version(name, q.get("to"), default=latest)
        page = _int(q.get("page", "0"), "page", 0)
        entries = w.diff(name, a, b)
        schema, _ = w.schema(name, max(a, b))
        self._html(pages.diff(name, a, b, schema.names, entries, page, self._heads()))

    def rows_page(self, q: dict[str, str], table: str, key: str) -> None:
        w = self.server.warehouse
        name = w.name(table)
        self._html(pages.row_history(name, key, w.row_history(name, key), self._heads()))

    def schema_page(self, q: dict[str, str], table: str) -> None:
        w = self.server.warehouse
        name = w.name(table)
        latest = w.log(name).latest_version()
        v = w.version(name, q.get("version"), default=latest)
        schema, pk = w.schema(name, v)
        self._html(pages.schema(name, v, latest, schema, pk, w.schema_changes(name), self._heads()))

    def sql_page(self, q: dict[str, str]) -> None:
        w = self.server.warehouse
        heads = self._heads()
        listed = []
        for t in w.tables():
            try:
                head = heads.get(t)
                s, _ = w.schema(t, head) if head is not None else (None, None)
                kept = w.kept(t)[-500:][::-1]  # the AS OF picker: the newest kept versions
            except CastSQLError:
                s, kept = None, []
            listed.append((t, kept, [(c.name, c.type) for c in s.columns] if s else []))
        first = w.tables()[0]
        self._html(pages.sql(listed, q.get("q", f"SELECT * FROM {first}"), heads))

    def favicon(self, q: dict[str, str]) -> None:
        self._send(HTTPStatus.NO_CONTENT, "image/x-icon", b"")

    def static(self, q: dict[str, str], name: str) -> None:
        f = STATIC / name
        if "/" in name or name.startswith(".") or not f.is_file():
            raise NotFound(f"no file {name}")
        self._send(
            HTTPStatus.OK,
            _TYPES.get(Path(name).suffix, "application/octet-stream"),
            f.read_bytes(),
            {"Cache-Control": "max-age=3600"},
        )

    # ------------------------------------------------------------ JSON

    def api_heads(self, q: dict[str, str]) -> None:
        self._json({"heads": self._heads()})

    def api_history(self, q: dict[str, str], table: str) -> None:
        h, fresh = self.server.warehouse.history(table)
        cols = ["version", "rows_inserted", "rows_updated", "rows_deleted", "live_rows"]
        # "errors", not "error": that key is how every endpoint says it failed.
        got = {c: h.column(c).to_pylist() for c in cols}
        self._json({**got, "errors": h.column("error").to_pylist(), "fresh": fresh})

    def api_timeline(self, q: dict[str, str], table: str) -> None:
        w = self.server.warehouse
        points = w.timeline(table)
        self._json(pages.timeline_json(points, len(points), frozenset(v for v, _ in w.schema_changes(table))))

    def api_sql(self, q: dict[str, str]) -> None:
        query = q.get("q", "")
        if not query.strip():
            raise UIError("no query")
        offset = _int(q.get("offset", "0"), "offset", 0)
        size = min(_int(q.get("size", str(PAGE_SIZE)), "size", 1), MAX_PAGE)
        p = self.server.warehouse.page(query, offset, size)
        self._json({"columns": p.columns, "types": p.types, "rows": p.rows, "offset": p.offset, "more": p.more})

    def export(self, q: dict[str, str]) -> None:
        """The whole result as CSV or Parquet, streamed batch by batch: the
        result is never held whole (Parquet goes through a temporary file,
        as its footer comes last)."""
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        query, fmt = q.get("q", ""), q.get("format", "csv")
        if fmt not in ("csv", "parquet"):
            raise UIError(f"export format must be csv or parquet, not {fmt!r}")
        with self.server.warehouse.relation(query) as rel:
            reader = rel.fetch_record_batch(65_536)
            name = f"result.{fmt}"
            if fmt == "parquet":
                with tempfile.TemporaryDirectory(prefix="castsql-ui-") as d:
                    path = Path(d) / name
                    with pq.ParquetWriter(path, reader.schema) as out:
                        for batch in reader:
                            out.write_batch(batch)
                    self._stream_file(path, "application/vnd.apache.parquet", name)
                return
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "text/csv; charset=utf-8")
            self.send_header("Content-Disposition", f'attachment; filename="{name}"')
            self.end_headers()
            self.streaming = True
            with pacsv.CSVWriter(self.wfile, reader.schema) as out:
                for batch in reader:
                    out.write_batch(batch)

    def _stream_file(self, path: Path, ctype: str, name: str) -> None:
        self.send_response(HTTPStatus.OK)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(path.stat().st_size))
        self.send_header("Content-Disposition", f'attachment; filename="{name}"')
        self.end_headers()
        self.streaming = True
        with path.open("rb") as f:
            while chunk := f.read(1 << 20):
                self.wfile.write(chunk)


def _int(text: str, what: str, lo: int) -> int:
    try:
        n = int(text)
    except ValueError:
        raise UIError(f"{what} must be a whole number, not {text!r}") from None
    if n < lo:
        raise UIError(f"{what} must be at least {lo}, not {n}")
    return n


def _jsonable(v: Any) -> Any:
    if isinstance(v, datetime | date | time):
        return v.isoformat()
    if isinstance(v, Decimal):
        return str(v)
    if isinstance(v, bytes):
        return v.hex()
    return str(v)


_NAME = r"([^/]+)"
_PATHS: list[tuple[str, Callable[..., None]]] = [
    (r"/", Handler.warehouse_page),
    (rf"/tables/{_NAME}", Handler.table_page),
    (rf"/tables/{_NAME}/diff", Handler.diff_page),
    (rf"/tables/{_NAME}/rows/(.+)", Handler.rows_page),
    (rf"/tables/{_NAME}/schema", Handler.schema_page),
    (r"/sql", Handler.sql_page),
    (r"/static/([A-Za-z0-9_.-]+)", Handler.static),
    (r"/favicon\.ico", Handler.favicon),
    (r"/api/heads", Handler.api_heads),
    (rf"/api/tables/{_NAME}/history", Handler.api_history),
    (rf"/api/tables/{_NAME}/timeline", Handler.api_timeline),
    (r"/api/sql", Handler.api_sql),
    (r"/export", Handler.export),
]
ROUTES: list[tuple[re.Pattern[str], Callable[..., None]]] = [(re.compile(p), h) for p, h in _PATHS]
