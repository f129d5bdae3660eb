// CastSQL UI: the chart, the version picker, live updates and the SQL grid.
// No framework: the server draws the pages; this adds what needs script.
"use strict";

const $ = (sel, root = document) => root.querySelector(sel);
const $$ = (sel, root = document) => Array.from(root.querySelectorAll(sel));
const POLL_MS = 2000;
const COLORS = {inserted: "#2e7d32", updated: "#f9a825", deleted: "#c62828", live: "#1565c0",
  stored: "#90a4ae", files: "#6a1b9a", tombstones: "#ef6c00", written: "#26a69a"};
const INTS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000];
const MARK_COLORS = {"merge": "#1565c0", "delete": "#c62828", "compact": "#6d4c41",
  "restore": "#00838f", "schema change": "#8e24aa"};

function fmtTime(s) { return new Date(s * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC"; }

// ---------------------------------------------------------------- table page

function drawCharts() {
  const box = $("#charts");
  const src = $("#timeline");
  if (!box || !src || typeof uPlot === "undefined") return;
  const d = JSON.parse(src.textContent);
  if (d.version.length < d.total) {
    // The page carries the newest versions; the whole timeline comes next.
    plot(box, d, false);
    fetch(`/api/tables/${encodeURIComponent(box.dataset.table)}/timeline`).then(r => r.json()).then(full => {
      if (full.error || !box.isConnected) return;
      plot(box, full, true);
    });
  } else {
    plot(box, d, true);
  }
}

function plot(box, d, whole) {
  if (window.castsqlCharts) { window.castsqlCharts.changes.destroy(); window.castsqlCharts.size.destroy(); }
  const n = d.version.length;
  const nulls = () => new Array(n).fill(null);
  const width = Math.max(320, box.clientWidth || 900);
  const xSeries = {label: "version", value: (u, v, si, i) => (i == null || v == null) ? "" :
    `v${v} · ${d.operation[i] || ""} · ${fmtTime(d.time[i])}`};
  const markSeries = d.marks.map(m => ({label: m, scale: "mark", stroke: MARK_COLORS[m] || "#444",
    width: 0, paths: () => null, points: {show: true, size: 9, fill: MARK_COLORS[m] || "#444"}}));
  const markData = d.marks.map(m => d.mark.map(x => x === m ? 1 : null));
  const bars = uPlot.paths && uPlot.paths.bars ? uPlot.paths.bars({size: [0.8, 40]}) : undefined;
  const changes = new uPlot({
    title: "Rows changed per version (history audit)", width, height: 260,
    scales: {x: {time: false}, mark: {range: [0, 1.1]}},
    axes: [{label: "version", incrs: INTS}, {label: "rows"}],
    series: [xSeries,
      {label: "inserted", stroke: COLORS.inserted, fill: COLORS.inserted + "99", paths: bars},
      {label: "updated", stroke: COLORS.updated, fill: COLORS.updated + "99", paths: bars},
      {label: "deleted", stroke: COLORS.deleted, fill: COLORS.deleted + "99", paths: bars},
      ...markSeries],
    cursor: {sync: {key: "castsql"}},
  }, [d.version, nulls(), nulls(), nulls(), ...markData], $("#chart-changes"));
  const size = new uPlot({
    title: "Table size per version (metadata)", width, height: 220,
    scales: {x: {time: false}},
    axes: [{label: "version", incrs: INTS}, {label: "rows"}, {side: 1, scale: "files", label: "files", grid: {show: false}}],
    series: [xSeries,
      {label: "live rows", stroke: COLORS.live, width: 2},
      {label: "rows stored", stroke: COLORS.stored, width: 1},
      {label: "data files", stroke: COLORS.files, scale: "files", width: 1},
      {label: "tombstone files", stroke: COLORS.tombstones, scale: "files", width: 1}],
    cursor: {sync: {key: "castsql"}},
  }, [d.version, nulls(), d.stored_rows, d.files, d.tombstones], $("#chart-size"));
  window.castsqlCharts = {changes, size, versions: n, whole};
  if (whole) loadExact(box.dataset.table, d, changes, size, markData);
}

async function loadExact(table, d, changes, size, markData) {
  const note = $("#exact-note");
  let h;
  try {
    const r = await fetch(`/api/tables/${encodeURIComponent(table)}/history`);
    h = await r.json();
    if (h.error) throw new Error(h.error);
  } catch (e) {
    if (note) note.textContent = String(e.message || e);
    return;
  }
  const at = new Map(h.version.map((v, i) => [v, i]));
  const pick = col => d.version.map(v => at.has(v) ? h[col][at.get(v)] : null);
  const ins = pick("rows_inserted"), upd = pick("rows_updated"), del = pick("rows_deleted"), live = pick("live_rows");
  changes.setData([d.version, ins, upd, del, ...markData]);
  size.setData([d.version, live, d.stored_rows, d.files, d.tombstones]);
  for (const tr of $$("#versions tbody tr")) {
    const i = at.get(Number(tr.dataset.version));
    if (i === undefined) continue;
    for (const td of $$("td.exact", tr)) {
      const v = h[td.dataset.col][i];
      td.textContent = v == null ? (h.errors[i] ? "!" : "") : Number(v).toLocaleString("en");
      if (h.errors[i]) td.title = h.errors[i];
    }
  }
  if (!h.fresh) {
    // The server answered the audit of an older newest version while it
    // computes the new one: show it, and ask again shortly.
    if (note) note.textContent = "Exact counts from the history audit (newest versions: still reading)…";
    setTimeout(() => { if ($("#charts") && $("#charts").isConnected) loadExact(table, d, changes, size, markData); }, 3000);
  } else if (note) { note.textContent = "Exact counts from the history audit."; note.dataset.done = "1"; }
  window.castsqlExact = h;
}

function wirePicker() {
  const form = $("#pick");
  if (form) form.addEventListener("submit", ev => {
    ev.preventDefault();
    const a = $("input[name=from]:checked", form), b = $("input[name=to]:checked", form);
    if (!a || !b) { alert("Pick a from version and a to version."); return; }
    location.href = `${form.getAttribute("action")}?${new URLSearchParams({from: a.value, to: b.value})}`;
  });
  const go = $("#keygo"), box = $("#keybox"), charts = $("#charts");
  if (go && box && charts) {
    const open = () => { if (box.value !== "") location.href =
      `/tables/${encodeURIComponent(charts.dataset.table)}/rows/${encodeURIComponent(box.value)}`; };
    go.addEventListener("click", open);
    box.addEventListener("keydown", ev => { if (ev.key === "Enter") open(); });
  }
}

// ---------------------------------------------------------------- live updates

async function poll() {
  const main = $("main");
  if (!main) return;
  try {
    const r = await fetch("/api/heads", {cache: "no-store"});
    const now = (await r.json()).heads;
    const drawn = JSON.parse(main.dataset.heads || "{}");
    const moved = Object.keys(now).filter(t => now[t] !== drawn[t]);
    if (moved.length) {
      if (main.dataset.live === "1") {
        const page = await fetch(location.href, {cache: "no-store"});
        const doc = new DOMParser().parseFromString(await page.text(), "text/html");
        const fresh = $("main", doc);
        if (fresh) { main.replaceWith(fresh); init(); }
      } else {
        main.dataset.heads = JSON.stringify(now);
      }
      const live = $("#live");
      if (live) { live.hidden = false; live.textContent = moved.map(t => `${t}: version ${now[t]}`).join(", "); }
    }
  } catch (e) { /* the server stopped: try again later */ }
}

// ---------------------------------------------------------------- SQL page

const sqlState = {offset: 0, size: 100, query: "", seq: 0};

async function runSql(offset) {
  const q = $("#query").value;
  sqlState.query = q; sqlState.offset = offset;
  const err = $("#sqlerror"), status = $("#sqlstatus"), grid = $("#result");
  err.hidden = true;
  status.textContent = "running…";
  const url = `/api/sql?${new URLSearchParams({q, offset, size: sqlState.size})}`;
  const seq = ++sqlState.seq;
  const r = await fetch(url);
  const res = await r.json();
  if (seq !== sqlState.seq) return;  // a later run's answer is the one to show
  if (res.error) {
    err.textContent = res.error; err.hidden = false; status.textContent = ""; grid.innerHTML = "";
    $("#prev").disabled = $("#next").disabled = true;
    return;
  }
  const head = "<thead><tr>" + res.columns.map((c, i) =>
    `<th title="${esc(res.types[i])}">${esc(c)}</th>`).join("") + "</tr></thead>";
  const body = "<tbody>" + res.rows.map(row => "<tr>" + row.map(v =>
    v === null ? '<td><span class="null">NULL</span></td>' :
      `<td${typeof v === "number" ? " class=num" : ""}>${esc(v)}</td>`).join("") + "</tr>").join("") + "</tbody>";
  grid.innerHTML = head + body;
  status.textContent = res.rows.length ? `rows ${offset + 1}–${offset + res.rows.length}${res.more ? ", more" : ""}` : "no rows";
  status.dataset.offset = offset;
  grid.dataset.query = q;
  $("#prev").disabled = offset === 0;
  $("#next").disabled = !res.more;
  history.replaceState(null, "", `/sql?${new URLSearchParams({q})}`);
}

function esc(v) {
  return String(v).replace(/[&<>"']/g, c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"})[c]);
}

function insertText(text) {
  const ta = $("#query");
  const s = ta.selectionStart, e = ta.selectionEnd;
  ta.value = ta.value.slice(0, s) + text + ta.value.slice(e);
  ta.focus(); ta.selectionStart = ta.selectionEnd = s + text.length;
}

function wireSql() {
  const ta = $("#query");
  if (!ta) return;
  $("#run").addEventListener("click", () => runSql(0));
  ta.addEventListener("keydown", ev => { if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); runSql(0); } });
  $("#next").addEventListener("click", () => runSql(sqlState.offset + sqlState.size));
  $("#prev").addEventListener("click", () => runSql(Math.max(0, sqlState.offset - sqlState.size)));
  for (const fmt of ["csv", "parquet"]) {
    $("#" + fmt).addEventListener("click", ev => {
      ev.currentTarget.href = `/export?${new URLSearchParams({q: ta.value, format: fmt})}`;
    });
  }
  for (const el of $$(".ins")) el.addEventListener("click", ev => { ev.stopPropagation(); insertText(el.dataset.text); });
  for (const sel of $$("select.asof")) sel.addEventListener("change", () => {
    if (sel.value !== "") insertText(`${sel.dataset.table} AS OF VERSION ${sel.value}`);
  });
  if (ta.value.trim()) runSql(0);
}

// ---------------------------------------------------------------- start

function init() { drawCharts(); wirePicker(); wireSql(); }

document.addEventListener("DOMContentLoaded", () => {
  init();
  setInterval(poll, POLL_MS);
});
