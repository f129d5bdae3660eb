"""``castsql ui`` in a real headless Chromium (Debian's ``chromium``, driven by
Playwright; scripts/setup installs both), against a real ``castsql ui``
process serving tables written with the real write API.

Each test is one feature a user relies on: the pages render, the chart has
a point per version, a diff and a key's life show exactly what the audit
functions return, the token is required, SQL results page without the
server holding them whole, new versions appear without a reload, Ctrl-C
stops the server cleanly, and browsing never writes a table.
"""

from __future__ import annotations

import csv
import io
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from paths import REPO

import castsql

CHROMIUM = "/usr/bin/chromium"
ROOT = REPO


# ---------------------------------------------------------------- fixtures


def build_events(root: Path) -> str:
    """``events`` (key ``id``): 300 rows, then a delete, an update, a merge
    (updates and inserts), a compaction, a new column, key 7 deleted and
    inserted again, an append that adds a column."""
    uri = str(root / "events")
    ids = list(range(300))
    castsql.write_table(
        uri,
        pa.table({"id": pa.array(ids, pa.int64()), "kind": [["view", "click", "buy"][i % 3] for i in ids]}),
        primary_key="id",
    )  # versions 0 and 1
    with castsql.open(uri) as t:
        t.delete("id < 5 OR id = 7")  # 2
        t.update({"kind": "'refund'"}, "id BETWEEN 10 AND 14")  # 3
        src = pa.table({"id": pa.array([20, 21, 400, 401], pa.int64()), "kind": ["x", "y", "new", "new"]})
        t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()  # 4
        t.compact()  # 5
        t.add_columns({"amount": pa.float64()})  # 6
        t.append(pa.table({"id": pa.array([7], pa.int64()), "kind": ["back"], "amount": [1.5]}))  # 7
        more = pa.table({"id": pa.array([500], pa.int64()), "kind": ["z"], "amount": [2.0], "note": ["n"]})
        t.append(more, merge_schema=True)  # 8: an append that adds a column
    return uri


def build_users(root: Path) -> str:
    uri = str(root / "users")
    castsql.write_table(uri, pa.table({"user": ["a", "b", "c"], "country": ["KR", "US", "DE"]}))
    return uri


def _die_with_parent() -> None:
    """In the child: SIGINT when the test process dies (killed, say), so no
    server outlives a run on a shared machine (Linux's PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, signal.SIGINT)


class UI:
    """A real ``castsql ui`` process; ``url`` carries its token."""

    def __init__(self, uri: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "castsql.cli", "ui", uri, "--no-browser", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
            preexec_fn=_die_with_parent,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        m = re.search(r"(http://127\.0\.0\.1:(\d+))/\?token=(\S+)", line)
        if not m:
            self.proc.kill()
            raise AssertionError(f"castsql ui printed no URL: {line!r} {self.proc.stderr.read()!r}")
        self.base, self.port, self.token = m.group(1), int(m.group(2)), m.group(3)
        self.url = f"{self.base}/?token={self.token}"

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(timeout=30)

    def peak_rss_kib(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1))


@pytest.fixture(scope="module")
def warehouse(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("ui") / "wh"
    build_events(root)
    build_users(root)
    return root


@pytest.fixture(scope="module")
def ui(warehouse):
    server = UI(str(warehouse))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        pytest.fail(f"{CHROMIUM} is missing: scripts/setup installs Debian's chromium (apt-get install -y chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture
def page(browser, ui):
    context = browser.new_context()
    pg = context.new_page()
    pg.goto(ui.url)  # the token once: the server sets its cookie and drops it from the URL
    yield pg
    context.close()


def opener(server: UI) -> urllib.request.OpenerDirector:
    """An HTTP client holding the server's token cookie, as a browser does after the first visit."""
    o = urllib.request.build_opener()
    o.addheaders = [("Cookie", f"castsql_ui_token_{server.port}={server.token}")]
    return o


def cells(row) -> list[str]:
    return [c.inner_text() for c in row.query_selector_all("td")]


def shown(value) -> str:
    return "NULL" if value is None else str(value)


# ---------------------------------------------------------------- pages


def test_warehouse_page_lists_each_table_with_its_rows_and_version(page, ui, warehouse):
    assert page.url == ui.base + "/"  # the token left the URL
    for name in ("events", "users"):
        with castsql.open(str(warehouse / name)) as t:
            row = page.query_selector(f'#tables tr[data-table="{name}"]')
            got = cells(row)
            assert got[1].replace(",", "") == str(t.to_arrow().num_rows)
            assert got[2] == str(t.version)


def test_table_chart_has_one_point_per_version_and_the_history_audits_counts(page, ui, warehouse):
    page.goto(ui.base + "/tables/events")
    page.wait_for_selector("#exact-note[data-done='1']")
    with castsql.open(str(warehouse / "events")) as t:
        h = t.history()
    versions = h.column("version").to_pylist()
    charts = page.evaluate(
        "() => ({n: castsqlCharts.versions, changes: castsqlCharts.changes.data.map(s => s.length),"
        " size: castsqlCharts.size.data.map(s => s.length), x: castsqlCharts.changes.data[0],"
        " ins: castsqlCharts.changes.data[1], del: castsqlCharts.changes.data[3],"
        " labels: castsqlCharts.changes.series.map(s => s.label)})"
    )
    assert charts["n"] == len(versions)
    assert set(charts["changes"]) == set(charts["size"]) == {len(versions)}
    assert charts["x"] == versions
    assert charts["ins"] == h.column("rows_inserted").to_pylist()
    assert charts["del"] == h.column("rows_deleted").to_pylist()
    # Operations are marked: this table has a delete, an update, a merge, a compaction and two schema
    # changes (an ALTER at 6, an append that added a column at 8).
    assert {"delete", "update", "merge", "compact", "schema change"} <= set(charts["labels"])
    marked = page.evaluate(
        "() => { const c = castsqlCharts.changes; const i = c.series.findIndex(s => s.label === 'schema change');"
        " return c.data[0].filter((v, j) => c.data[i][j] !== null); }"
    )
    assert marked == [6, 8]
    listed = [int(r.get_attribute("data-version")) for r in page.query_selector_all("#versions tbody tr")]
    assert listed == sorted(versions, reverse=True)


def test_pages_load_nothing_from_outside_the_server(browser, ui):
    """Works offline: every script, style and the chart library come from the package."""
    context = browser.new_context()
    asked: list[str] = []
    try:
        pg = context.new_page()
        pg.on("request", lambda r: asked.append(r.url))
        pg.goto(ui.url)
        for path in ("/tables/events", "/tables/events/diff?from=1&to=2", "/tables/events/rows/7", "/sql"):
            pg.goto(ui.base + path)
            pg.wait_for_load_state("networkidle")
        assert pg.evaluate("() => typeof uPlot") == "function"
    finally:
        context.close()
    assert asked and all(u.startswith(ui.base + "/") for u in asked), [u for u in asked if not u.startswith(ui.base)]
    assert any(u.endswith("/static/uPlot.iife.min.js") for u in asked)


def test_diff_of_two_picked_versions_shows_exactly_the_diff_audits_rows(page, ui, warehouse):
    page.goto(ui.base + "/tables/events")
    page.check('#versions tr[data-version="1"] input[name=from]')
    page.check('#versions tr[data-version="4"] input[name=to]')
    page.click("#diffgo")
    page.wait_for_url(re.compile(r"/tables/events/diff\?from=1&to=4$"))
    with castsql.open(str(warehouse / "events")) as t:
        d = t.diff(1, 4)
    rows, kinds = d.to_pylist(), d.column("_change_type").to_pylist()
    want: Counter = Counter()
    pre = None
    for r, k in zip(rows, kinds, strict=True):
        vals = tuple(shown(r[c]) for c in ("id", "kind"))
        if k == "update_preimage":
            pre = vals
        elif k == "update_postimage":
            want[("updated", pre, vals)] += 1
        else:
            want[("added" if k == "insert" else "removed", vals)] += 1
    got: Counter = Counter()
    for tr in page.query_selector_all("#diff tbody tr"):
        c = cells(tr)
        old, new = tuple(c[1:3]), tuple(c[4:6])
        got[(c[0], old, new) if c[0] == "updated" else (c[0], new if c[0] == "added" else old)] += 1
    assert got == want
    counts = {s: int(page.get_attribute(f"#counts .{s}", "data-n")) for s in ("insert", "delete", "update")}
    assert counts == {
        "insert": kinds.count("insert"),
        "delete": kinds.count("delete"),
        "update": kinds.count("update_postimage"),
    }
    # Changed cells are marked: an update changed kind, not id.
    upd = page.query_selector("#diff tr.update")
    assert [c.get_attribute("class") for c in upd.query_selector_all("td")][1:3] == [None, "changed"]


def test_a_diff_larger_than_a_page_pages_through_every_row(page, ui, warehouse):
    page.goto(ui.base + "/tables/events/diff?from=0&to=7")
    with castsql.open(str(warehouse / "events")) as t:
        ids = sorted(t.diff(0, 7).column("id").to_pylist())
    assert len(ids) > 100  # more than one page
    seen = []
    while True:
        width = len(page.query_selector_all("#diff thead tr:nth-child(2) th")) // 2  # per side: its columns and one
        for tr in page.query_selector_all("#diff tbody tr"):
            seen.append(int(cells(tr)[1 if tr.get_attribute("data-kind") == "delete" else 1 + width]))
        nxt = page.query_selector("#next")
        if nxt is None:
            break
        nxt.click()
        page.wait_for_load_state()
    assert sorted(seen) == ids


def test_row_page_matches_the_row_history_audit(page, ui, warehouse):
    page.goto(ui.base + "/tables/events")
    page.fill("#keybox", "7")
    page.click("#keygo")
    page.wait_for_url(re.compile(r"/tables/events/rows/7$"))
    with castsql.open(str(warehouse / "events")) as t:
        h = t.row_history(7)
    kinds = h.column("_change_type").to_pylist()
    versions = h.column("_commit_version").to_pylist()
    want = [(v, k) for v, k in zip(versions, kinds, strict=True) if k != "update_preimage"]
    rows = page.query_selector_all("#history tbody tr")
    got = [(int(r.get_attribute("data-version")), r.get_attribute("data-event")) for r in rows]
    name = {"insert": "inserted", "delete": "deleted", "update_postimage": "updated"}
    assert [v for v, _ in got] == [v for v, _ in want]
    # Inserted at 1, deleted at 2, back at 7: shown as deleted and re-inserted.
    assert [e for _, e in got] == [name[k] for _, k in want[:-1]] + ["re-inserted"]
    assert want[-1][1] == "insert" and got[-1][0] == 7
    assert cells(rows[-1])[-4:] == ["7", "back", "1.5", "NULL"]  # the values after (note: added later, NULL)


def test_schema_page_at_a_version_and_the_changes_between_versions(page, ui):
    page.goto(ui.base + "/tables/events/schema?version=5")
    assert [r.get_attribute("data-column") for r in page.query_selector_all("#schema tbody tr")] == ["id", "kind"]
    page.goto(ui.base + "/tables/events/schema")
    assert [r.get_attribute("data-column") for r in page.query_selector_all("#schema tbody tr")] == [
        "id",
        "kind",
        "amount",
        "note",
    ]
    changes = {
        int(li.get_attribute("data-version")): li.inner_text() for li in page.query_selector_all("#schema-changes li")
    }
    assert set(changes) == {6, 8}
    assert "added column amount" in changes[6] and "added column note" in changes[8]


@pytest.mark.parametrize(
    ("path", "status", "message"),
    [
        ("/tables/nope", 404, "no table named 'nope' (tables: events, users)"),
        ("/tables/events/diff?from=99&to=1", 404, "table events: version 99 does not exist (latest is 8)"),
        ("/tables/events/diff?from=x", 400, "'x' is not a version number"),
        ("/tables/events/rows/abc", 400, "'abc' is not a value of the primary key 'id'"),
        ("/tables/users/rows/a", 400, "needs a primary key"),
        ("/tables/events/schema?version=42", 404, "table events: version 42 does not exist"),
        ("/tables/events/diff?from=1&page=-1", 400, "page must be at least 0"),
    ],
)
def test_bad_input_shows_the_shells_one_line_error(page, ui, path, status, message):
    resp = page.goto(ui.base + path)
    assert resp.status == status
    err = page.inner_text(".error")
    assert err.startswith("Error: ") and message in err and "\n" not in err
    assert "Traceback" not in page.content()


def test_two_uis_in_one_browser_keep_their_own_tokens(browser, ui, tmp_path):
    """Cookies are per host, not per port: each server's cookie is its own."""
    build_users(tmp_path / "wh")
    other = UI(str(tmp_path / "wh"))
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(ui.url)
        pg.goto(other.url)
        assert pg.goto(ui.base + "/tables/events").status == 200
        assert pg.goto(other.base + "/tables/users").status == 200
    finally:
        context.close()
        other.stop()


def test_a_request_without_the_token_is_refused(browser, ui):
    for url in (ui.base + "/", ui.base + "/tables/events", ui.base + "/api/sql?q=SELECT+1", ui.base + "/?token=wrong"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url)
        assert e.value.code == 403
    context = browser.new_context()  # a browser that never had the token
    try:
        resp = context.new_page().goto(ui.base + "/tables/events")
        assert resp.status == 403
    finally:
        context.close()


def test_a_table_whose_newest_version_breaks_is_one_error_line_and_the_others_still_show(browser, tmp_path):
    root = tmp_path / "wh"
    build_users(root)
    castsql.write_table(str(root / "other"), pa.table({"x": [1, 2]}))
    server = UI(str(root))
    context = browser.new_context()
    try:
        (root / "users" / "manifest" / "v00000001.json").write_text("{not json")  # after the UI opened it
        pg = context.new_page()
        pg.goto(server.url)
        assert cells(pg.query_selector('#tables tr[data-table="other"]'))[1] == "2"
        err = pg.inner_text('#tables tr[data-table="users"] .error')
        assert err.startswith("Error: ") and "v00000001.json" in err and "\n" not in err
        resp = pg.goto(server.base + "/tables/users/diff?from=0&to=1")
        assert resp.status in (400, 404) and pg.inner_text(".error").startswith("Error: ")
        assert "Traceback" not in pg.content()
    finally:
        context.close()
        server.stop()


@pytest.mark.s3
def test_a_warehouse_on_s3(browser, s3_server, s3_root):
    """Any store the rest of CastSQL opens: the S3 test server, credentials from the usual variables."""
    cfg = s3_server.config
    uri = f"{s3_root}/wh"
    castsql.write_table(
        f"{uri}/t", pa.table({"id": pa.array([1, 2, 3], pa.int64()), "v": ["a", "b", "c"]}), primary_key="id", s3=cfg
    )
    with castsql.open(f"{uri}/t", s3=cfg) as t:
        t.delete("id = 2")
    env = {
        **os.environ,
        "AWS_ENDPOINT_URL": cfg.endpoint_url or "",
        "AWS_ACCESS_KEY_ID": cfg.key or "",
        "AWS_SECRET_ACCESS_KEY": cfg.secret or "",
        "AWS_REGION": cfg.region,
    }
    server = UI(uri, env=env)
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(server.url)
        assert cells(pg.query_selector('#tables tr[data-table="t"]'))[1:3] == ["2", "2"]
        pg.goto(server.base + "/tables/t/diff?from=1&to=2")
        assert [cells(r)[:3] for r in pg.query_selector_all("#diff tbody tr")] == [["removed", "2", "b"]]
        pg.goto(server.base + "/sql?q=SELECT+v+FROM+t+ORDER+BY+id")
        pg.wait_for_selector("#result tbody tr")
        assert [cells(r) for r in pg.query_selector_all("#result tbody tr")] == [["a"], ["c"]]
    finally:
        context.close()
        assert server.stop() == 0


# ---------------------------------------------------------------- SQL


def test_sql_editor_pages_and_exports_a_result(page, ui, warehouse):
    page.goto(ui.base + "/sql")
    assert {li.get_attribute("data-table") for li in page.query_selector_all("#tablelist > li")} == {"events", "users"}
    page.fill("#query", "")
    page.click('#tablelist b[data-text="events"]')  # the table's name into the editor
    page.select_option('select.asof[data-table="events"]', "2")
    page.fill("#query", "SELECT id, kind FROM events AS OF VERSION 2 ORDER BY id")
    page.click("#run")
    page.wait_for_function("document.querySelector('#result').dataset.query.includes('VERSION 2')")
    with castsql.open(str(warehouse / "events"), version=2) as t:
        rows = t.to_arrow(["id", "kind"]).sort_by("id")
    want = [[str(i), k] for i, k in zip(rows.column("id").to_pylist(), rows.column("kind").to_pylist(), strict=True)]
    got = [cells(r) for r in page.query_selector_all("#result tbody tr")]
    assert got == want[:100]
    page.click("#next")
    page.wait_for_function("document.querySelector('#sqlstatus').dataset.offset === '100'")
    got = [cells(r) for r in page.query_selector_all("#result tbody tr")]
    assert got == want[100:200]
    # Exports: the whole result, as CSV and as Parquet.
    with page.expect_download() as d:
        page.click("#csv")
    text = Path(d.value.path()).read_text()
    assert [r for r in csv.reader(io.StringIO(text))][1:] == want
    with page.expect_download() as d:
        page.click("#parquet")
    back = pq.read_table(d.value.path())
    assert [[str(i), k] for i, k in zip(*(c.to_pylist() for c in back.columns), strict=True)] == want


def test_sql_errors_and_writes_are_refused_in_one_line(page, ui):
    page.goto(ui.base + "/sql")
    for query, message in [
        ("SELEC 1", "Parser Error"),
        ("SELECT * FROM nope", "nope"),
        ("COPY events TO '/tmp/out.csv'", "safe mode"),
        ("DELETE FROM events", "safe mode"),
        ("SELECT * FROM read_csv('/etc/passwd')", "disabled by configuration"),
    ]:
        page.fill("#query", query)
        page.click("#run")
        page.wait_for_selector("#sqlerror:not([hidden])")
        err = page.inner_text("#sqlerror")
        assert err.startswith("Error: ") and message in err and "\n" not in err, (query, err)


# ---------------------------------------------------------------- live, lifecycle


def test_a_new_version_appears_without_a_reload(browser, tmp_path):
    root = tmp_path / "wh"
    uri = build_users(root)
    server = UI(str(root))
    context = browser.new_context()
    try:
        pg = context.new_page()
        pg.goto(server.url)
        pg.goto(server.base + "/tables/users")
        pg.evaluate("() => { window.__sameDocument = true; }")
        with castsql.open(uri) as t:
            t.append(pa.table({"user": ["d"], "country": ["FR"]}))
            new = t.at().version
        pg.wait_for_selector(f'#versions tr[data-version="{new}"]', timeout=15_000)
        assert pg.evaluate("() => window.__sameDocument") is True  # not reloaded
        assert pg.evaluate("() => castsqlCharts.versions") == new + 1
        # The exact counts follow: the history audit of the new newest version.
        pg.wait_for_selector("#exact-note[data-done='1']", timeout=30_000)
        assert pg.evaluate(f"() => castsqlExact.rows_inserted[castsqlExact.version.indexOf({new})]") == 1
        inserted = pg.inner_text(f'#versions tr[data-version="{new}"] td[data-col=rows_inserted]')
        assert inserted == "1"
    finally:
        context.close()
        server.stop()


def test_ctrl_c_stops_the_server_cleanly_and_frees_the_port(warehouse):
    server = UI(str(warehouse))
    assert b'"events"' in opener(server).open(server.base + "/api/heads").read()  # serving
    assert server.stop() == 0
    assert "stopped" in server.proc.stdout.read()
    with pytest.raises(ConnectionRefusedError):  # nothing listens there any more
        socket.create_connection(("127.0.0.1", server.port), timeout=5)
    with socket.socket() as s:  # and a new server may listen there (servers set SO_REUSEADDR, as castsql ui does)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", server.port))
        s.listen()


def test_a_server_that_cannot_start_says_why_in_one_line(warehouse, tmp_path):
    (tmp_path / "empty").mkdir()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for args, message in [
            ([str(tmp_path / "nope")], "neither a table nor a warehouse of tables"),
            ([str(tmp_path / "empty")], "no table here"),
            ([str(warehouse), "--port", str(port)], f"cannot listen on 127.0.0.1:{port}"),
        ]:
            p = subprocess.run(
                [sys.executable, "-m", "castsql.cli", "ui", *args, "--no-browser"],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert p.returncode == 1
            assert p.stderr.startswith("Error: ") and message in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_browsing_every_page_writes_nothing(page, ui, warehouse):
    def tree() -> dict[str, tuple[int, int]]:
        return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in warehouse.rglob("*")}

    before = tree()
    for path in (
        "/",
        "/tables/events",
        "/tables/events/diff?from=1&to=7",
        "/tables/events/rows/7",
        "/tables/events/schema?version=3",
        "/sql?q=SELECT+count(*)+FROM+events",
    ):
        assert page.goto(ui.base + path).status == 200
    page.wait_for_timeout(500)
    assert tree() == before


# ---------------------------------------------------------------- large results


def test_paging_a_million_row_result_keeps_the_browsers_and_the_servers_memory_bounded(browser, tmp_path):
    """The server reads a page with LIMIT/OFFSET and streams an export batch
    by batch: its peak memory grows by far less than the result's size; the
    browser holds one page of rows, however far it pages."""
    n = 1_000_000
    uri = str(tmp_path / "big" / "wide")
    pad = "x" * 100
    ids = pa.array(range(n), pa.int64())
    castsql.write_table(uri, pa.table({"id": ids, "pad": pa.array([pad] * n)}), primary_key="id")
    result_bytes = n * (8 + 100)
    server = UI(uri)
    try:
        http = opener(server)

        def get(path: str) -> bytes:
            return http.open(server.base + path).read()

        # No ORDER BY: a sort holds every row in DuckDB whoever asks for them;
        # a scan is read in insertion order (DuckDB keeps it).
        q = "SELECT+*+FROM+wide"
        get("/api/sql?q=SELECT+1")
        base = server.peak_rss_kib()
        for offset in (0, 500_000, 999_900):
            got = get(f"/api/sql?q={q}&offset={offset}&size=100")
            assert f"[{offset}, ".encode() in got
        exported = 0
        with http.open(server.base + "/export?q=SELECT+*+FROM+wide&format=csv") as r:
            while chunk := r.read(1 << 20):
                exported += chunk.count(b"\n")
        assert exported == n + 1
        grown = (server.peak_rss_kib() - base) * 1024
        assert grown < result_bytes / 2, f"peak memory grew by {grown:,} bytes for a {result_bytes:,}-byte result"
        context = browser.new_context()
        try:
            pg = context.new_page()
            pg.goto(server.url)
            pg.goto(server.base + "/sql")
            pg.fill("#query", "SELECT * FROM wide")
            pg.click("#run")
            pg.wait_for_function("document.querySelector('#sqlstatus').dataset.offset === '0'")
            heap0 = pg.evaluate("performance.memory.usedJSHeapSize")
            for k in range(1, 21):
                pg.click("#next")
                pg.wait_for_function(f"document.querySelector('#sqlstatus').dataset.offset === '{k * 100}'")
                assert len(pg.query_selector_all("#result tbody tr")) == 100
            assert pg.query_selector("#result tbody tr td").inner_text() == "2000"  # row 2,000's id: it paged
            heap = pg.evaluate("performance.memory.usedJSHeapSize")
            assert heap - heap0 < result_bytes / 10, f"the page's heap grew by {heap - heap0:,} bytes"
        finally:
            context.close()
        # Ctrl-C in the middle of a download nobody reads on: the server still stops, cleanly.
        stuck = http.open(server.base + "/export?q=SELECT+*+FROM+wide&format=csv")
        stuck.read(1 << 16)
        assert server.stop() == 0  # stop() waits at most 30 s: a hang fails here
        stuck.close()
    finally:
        server.stop()
