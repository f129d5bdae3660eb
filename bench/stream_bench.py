"""A CDC stream that runs long: CastSQL (automatic compaction on) against deltalake and DuckLake.

    .venv/bin/python bench/stream_bench.py [--rows 200000] [--batches 300] [--batch-rows 40]
                                           [--engines castsql,castsql-scan,castsql-nofeed,deltalake,ducklake]
                                           [--s3] [--azure]
                                           [--repeat 5] [--min-files N] [--cdf] [--delay SECONDS] [--race N]

A table of ``--rows`` events (id, ts, user, kind, amount) takes ``--batches``
upserts of ``--batch-rows`` rows each (half updates of random existing keys,
half new events at the newest times), each one merge on ``id`` (update
matched, insert the rest) committed by a long-lived handle, as a stream
consumer would: CastSQL through ``Table.merge`` with ``castsql.autoCompact``
on (``castsql.compact.sortBy = ts``), deltalake through ``DeltaTable.merge``,
DuckLake through ``MERGE INTO`` on an attached catalog (``castsql-scan``:
CastSQL with its key cache off, every merge scanning the key column as a
one-off merge does; ``--cdf``: change feeds on where the tool has one;
``castsql-nofeed``: CastSQL with its feed off even then, for the feed's cost). The engines take the
batches in turns, rotating who goes first, so load on the machine hits all
alike. ``--s3`` runs CastSQL (and deltalake, if asked for) on the S3 test
server as well, ``--azure`` on the Azure emulator (Azurite); DuckLake stays
local. ``--delay`` then also queries those tables through a proxy adding that
many seconds to every request (an object store's first-byte latency):
CastSQL, a deltalake handle that never looks for new versions, and one
refreshed per query. (GCS is not among them: deltalake's GCS client speaks
GCS's XML API, which the GCS emulator does not serve.)

Printed: commit latency per engine (p50, p99, the median of the 101 batches
around batch 100 against that of the last 101: medians of 21 batches swung from
1.12 to 1.34 between two runs whose 250-batch medians were flat), then, after
the stream, medians of ``--repeat`` warm queries in one session per engine
against the same live rows written as one Parquet file read by DuckDB (for the
engines on a store, that file on the same server, read as CastSQL reads that
store): a full aggregate and a recent time range (the last 1% of times); and
the embedded compaction of 300 one-batch files into one against DuckLake's
``ducklake_merge_adjacent_files`` on the same rows (``--race N``: that
alone, N times, with the median ratio).

Goals (issue 35): full aggregate <= 1.5x one file, recent range <= 1.3x;
commit p50 <= DuckLake's, p99 <= 5x p50; latency at the end <= 1.2x at batch
100; the compaction <= 1.0x DuckLake's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _common import median_time

import castsql
from castsql.engine.duckdb.duck import load_extension

COLS = ("id", "ts", "user", "kind", "amount")
T0 = 1_735_689_600_000_000  # 2025-01-01 in microseconds
PROPS = {"castsql.autoCompact": "true", "castsql.compact.sortBy": "ts"}


def rows(ids: np.ndarray, ts: np.ndarray, salt: int) -> pa.Table:
    h = (ids * 2654435761 + salt * 97) % 1_000_003
    return pa.table(
        {
            "id": pa.array(ids.astype(np.int64)),
            "ts": pa.array(T0 + ts.astype(np.int64) * 1_000_000, pa.timestamp("us", tz="UTC")),
            "user": pa.array(np.char.add("u", (h % 100_000).astype(str)).astype(object), pa.string()),
            "kind": pa.array(np.array(["view", "click", "purchase", "refund"])[h % 4].astype(object), pa.string()),
            "amount": pa.array((h % 100_000) / 100.0 + salt),
        }
    )


def batches(n: int, count: int, size: int, rng: np.random.Generator) -> list[pa.Table]:
    out = []
    for b in range(count):
        old = rng.choice(n + b * (size - size // 2), size // 2, replace=False)
        new = n + b * (size - size // 2) + np.arange(size - size // 2)
        ids = np.concatenate([old, new])
        out.append(rows(ids, n + b * size + np.arange(len(ids)), salt=b + 1))
    return out


class CastSQL:
    name = "castsql"

    def __init__(self, uri: str, base: pa.Table | None, s3=None) -> None:
        if base is not None:
            castsql.write_table(uri, base, primary_key="id", properties=PROPS, s3=s3)
        self.t = castsql.open(uri, s3=s3)
        self.uri, self.s3 = uri, s3

    def upsert(self, src: pa.Table) -> None:
        self.t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()

    def query(self, sql: str):
        return self.t._session.sql(sql.format(t="events")).to_pylist()

    def files(self) -> int:
        return self.t._session.snapshot("events").file_count


class CastSQLScan(CastSQL):
    """CastSQL with its key cache off (castsql/embedded/keycache.py): every merge scans the key column."""

    name = "castsql, no key cache"

    def __init__(self, uri: str, base: pa.Table | None, s3=None) -> None:
        super().__init__(uri, base, s3)
        from castsql.embedded import keycache

        keycache.of(self.t._session).enabled = False


class CastSQLNoFeed(CastSQL):
    """CastSQL with its change feed off whatever ``--cdf`` says: the feed's cost on a commit, in the same run."""

    name = "castsql, feed off"

    def __init__(self, uri: str, base: pa.Table | None, s3=None) -> None:
        props = {k: v for k, v in PROPS.items() if k != "castsql.changeDataFeed"}
        castsql.write_table(uri, base, primary_key="id", properties=props, s3=s3)
        self.t = castsql.open(uri, s3=s3)
        self.uri, self.s3 = uri, s3


class Delta:
    name = "deltalake"
    configuration: dict[str, str] | None = None

    def __init__(self, uri: str, base: pa.Table | None, options: dict[str, str] | None = None) -> None:
        import duckdb
        from deltalake import DeltaTable, write_deltalake

        if base is not None:
            write_deltalake(uri, base, storage_options=options, configuration=self.configuration)
        self.dt = DeltaTable(uri, storage_options=options)
        self.uri, self.options, self.refresh = uri, options or {}, False
        self.con = duckdb.connect()

    def upsert(self, src: pa.Table) -> None:
        (
            self.dt.merge(src, predicate="t.id = s.id", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )

    def query(self, sql: str):
        if self.refresh:
            self.dt.update_incremental()  # as CastSQL's queries do: the newest version, not the handle's
        ds = self.dt.to_pyarrow_dataset()  # noqa: F841 - read by name
        return self.con.sql(sql.format(t="ds")).fetchall()

    def files(self) -> int:
        return len(self.dt.file_uris())


class Lake:
    name = "ducklake"

    def __init__(self, root: str, base: pa.Table) -> None:
        import duckdb

        os.makedirs(root, exist_ok=True)
        self.con = duckdb.connect()
        load_extension(self.con, "ducklake")
        self.con.execute(f"ATTACH 'ducklake:{root}/meta.ducklake' AS lake (DATA_PATH '{root}/data')")
        self.con.register("base_rows", base)
        self.con.execute("CREATE TABLE lake.events AS SELECT * FROM base_rows")
        self.con.unregister("base_rows")
        sets = ", ".join(f"{c} = s.{c}" for c in COLS if c != "id")
        self.merge = (
            f"MERGE INTO lake.events t USING src s ON t.id = s.id WHEN MATCHED THEN UPDATE SET {sets} "
            f"WHEN NOT MATCHED THEN INSERT VALUES ({', '.join('s.' + c for c in COLS)})"
        )

    def upsert(self, src: pa.Table) -> None:
        self.con.register("src", src)
        self.con.execute(self.merge)
        self.con.unregister("src")

    def query(self, sql: str):
        return self.con.sql(sql.format(t="lake.events")).fetchall()

    def files(self) -> int:
        return self.con.sql("SELECT count(*) FROM ducklake_list_files('lake', 'events')").fetchone()[0]


def pct(xs: list[float], p: float) -> float:
    return float(np.percentile(xs, p))


def run_stream(engines: list, feed: list[pa.Table]) -> dict[str, list[float]]:
    lat: dict[str, list[float]] = {e.name: [] for e in engines}
    for b, src in enumerate(feed):
        order = engines[b % len(engines) :] + engines[: b % len(engines)]
        for e in order:
            t = time.perf_counter()
            e.upsert(src)
            lat[e.name].append(time.perf_counter() - t)
    return lat


def compaction_race(root: Path, feed: list[pa.Table], base: pa.Table) -> tuple[float, float]:
    """300 one-batch files (appends) compacted into one: castsql's embedded
    compaction against DuckLake's ducklake_merge_adjacent_files."""
    small = feed[:300]
    uri = str(root / "compact" / "events")
    castsql.write_table(uri, small[0], primary_key=None)
    with castsql.open(uri) as t:
        for src in small[1:]:
            t.append(src)
        c0 = time.perf_counter()
        t.compact()
        c = time.perf_counter() - c0
        assert t._session.snapshot("events").file_count == 1
    lake = Lake(str(root / "compact-lake"), small[0])
    for src in small[1:]:
        lake.con.register("src", src)
        lake.con.execute("INSERT INTO lake.events SELECT * FROM src")
        lake.con.unregister("src")
    d0 = time.perf_counter()
    lake.con.execute("CALL ducklake_merge_adjacent_files('lake')")
    d = time.perf_counter() - d0
    return c, d


class Remote:
    """A store's test server (``s3`` or ``azure``), where its tables live, and
    how CastSQL and deltalake reach it at an endpoint (the server's or a proxy's)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.label = {"s3": "S3", "azure": "Azure"}[kind]
        if kind == "s3":
            from _common import start_s3

            self.server = start_s3()
            self.port = self.server.ports["s3"]
            self.prefix = "s3://bench/stream"
        else:
            from cloudservers import AzuriteServer

            self.server = AzuriteServer().start()
            self.server.create_container("bench")
            self.port = self.server.port
            self.prefix = "az://bench/stream"
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.s3 = self.server.config if kind == "s3" else None
        os.environ.update(self.env(self.endpoint))

    def env(self, endpoint: str) -> dict[str, str]:
        if self.kind == "s3":
            return {}
        return {"AZURE_STORAGE_CONNECTION_STRING": self.server.connection_string.replace(self.endpoint, endpoint)}

    def castsql(self, base: pa.Table | None, endpoint: str | None = None) -> CastSQL:
        import dataclasses

        endpoint = endpoint or self.endpoint
        saved = {k: os.environ.get(k) for k in self.env(endpoint)}
        os.environ.update(self.env(endpoint))  # Azure: the storage reads it when the table opens
        try:
            s3 = dataclasses.replace(self.s3, endpoint_url=endpoint) if self.s3 is not None else None
            e = CastSQL(f"{self.prefix}/events", base, s3)
        finally:
            for k, v in saved.items():
                if v is not None:
                    os.environ[k] = v
        e.name = f"castsql on {self.label}"
        return e

    def delta_options(self, endpoint: str | None = None) -> dict[str, str]:
        endpoint = endpoint or self.endpoint
        if self.kind == "s3":
            cfg = self.server.config
            return {
                "AWS_ENDPOINT_URL": endpoint,
                "AWS_ACCESS_KEY_ID": cfg.key,
                "AWS_SECRET_ACCESS_KEY": cfg.secret,
                "AWS_REGION": cfg.region,
                "AWS_ALLOW_HTTP": "true",
                "AWS_S3_ALLOW_UNSAFE_RENAME": "true",  # one writer
            }
        return {
            "account_name": "devstoreaccount1",
            "account_key": self.server.account_key,
            "endpoint": f"{endpoint}/devstoreaccount1",
            "allow_http": "true",
        }

    def delta(self, base: pa.Table | None, endpoint: str | None = None) -> Delta:
        d = Delta(f"{self.prefix}/delta_events", base, self.delta_options(endpoint))
        d.name = f"deltalake on {self.label}"
        return d

    def delta_copy(self, local: str) -> Delta:
        """The local Delta table at ``local`` copied to this store, and a handle on it."""
        from castsql.storage import open_storage

        st = open_storage(f"{self.prefix}/delta_events", s3=self.s3)
        for d, _, files in os.walk(local):
            for n in files:
                path = os.path.join(d, n)
                st.put(os.path.relpath(path, local).replace(os.sep, "/"), Path(path).read_bytes())
        return self.delta(None)

    def floor(self, one: str, queries: dict[str, str], repeat: int) -> dict[str, float]:
        """The queries over ``one`` (a local Parquet file) put on the server
        and read as CastSQL reads this store."""
        from castsql.engine.duckdb.duck import new_connection
        from castsql.engine.duckdb.stores import make_readable
        from castsql.storage import open_storage

        st = open_storage(self.prefix, s3=self.s3)
        st.put("one.parquet", Path(one).read_bytes())
        con = new_connection()
        make_readable(con, st, self.s3)
        src = f"read_parquet('{self.prefix}/one.parquet')"
        return {
            label: median_time(lambda q=q: con.sql(q.format(t=src)).fetchall(), repeat) for label, q in queries.items()
        }

    def stop(self) -> None:
        self.server.stop()


def delayed_queries(remote: Remote, engines: list, full: str, recent: str, delay: float, repeat: int) -> None:
    """A store's tables' warm queries through a proxy that delays every request
    by ``delay`` (an object store's first-byte latency): CastSQL (each query
    reads the pointer and probes past it), deltalake as a handle that never
    looks for new versions, and deltalake refreshing its handle per query."""
    from faultproxy import FaultProxy

    proxy = FaultProxy(remote.port, rate=0, delay=delay)
    proxy.start()
    try:
        handles = []
        for e in engines:
            if e.name == f"castsql on {remote.label}":
                handles.append((e.name, remote.castsql(None, proxy.endpoint_url)))
            elif e.name == f"deltalake on {remote.label}":
                stale, fresh = remote.delta(None, proxy.endpoint_url), remote.delta(None, proxy.endpoint_url)
                fresh.refresh = True
                handles += [("deltalake, stale handle", stale), ("deltalake, refreshed", fresh)]
        print(
            f"\n{remote.label}: warm queries through a proxy adding {delay * 1000:.0f} ms per request "
            "(ms, requests per query)"
        )
        for label, q in (("full aggregate", full), ("recent 1% of times", recent)):
            cells = []
            for name, h in handles:
                m = median_time(lambda h=h, q=q: h.query(q), repeat)
                proxy.requests.clear()
                h.query(q)
                cells.append(f"{name} {m * 1000:.1f} ({len(proxy.requests)})")
            print(f"  {label:<20}" + "; ".join(cells))
    finally:
        proxy.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--batch-rows", type=int, default=40)
    ap.add_argument("--engines", default="castsql,deltalake,ducklake")
    ap.add_argument("--s3", action="store_true", help="also CastSQL (and deltalake) on the S3 test server")
    ap.add_argument("--azure", action="store_true", help="also CastSQL (and deltalake) on the Azure emulator")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--min-files", type=int, help="castsql.autoCompact.minNumFiles (default: the table default)")
    ap.add_argument(
        "--cdf", action="store_true", help="change feeds on (castsql.changeDataFeed, delta.enableChangeDataFeed)"
    )
    ap.add_argument("--dir")
    ap.add_argument("--race", type=int, metavar="N", help="only the compaction race, N builds, and the median ratio")
    ap.add_argument(
        "--delay",
        type=float,
        default=0.0,
        help="with --s3/--azure: also query those tables through a proxy adding this many seconds to each request",
    )
    args = ap.parse_args(argv)
    if args.min_files:
        PROPS["castsql.autoCompact.minNumFiles"] = str(args.min_files)
    if args.cdf:
        # DuckLake keeps every version's changes anyway (table_changes); the
        # others are asked to, so all three pay for an audit trail.
        PROPS["castsql.changeDataFeed"] = "true"
        Delta.configuration = {"delta.enableChangeDataFeed": "true"}
    root = Path(args.dir or tempfile.mkdtemp(prefix="castsql-stream-bench-"))
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(5)
    base = rows(np.arange(args.rows), np.arange(args.rows), 0)
    feed = batches(args.rows, max(args.batches, 300 if args.race else 0), args.batch_rows, rng)
    if args.race:
        ratios = []
        for i in range(args.race):
            c, d = compaction_race(root / f"race{i}", feed, base)
            ratios.append(c / d)
            print(f"compact 300 one-batch files into one: castsql {c * 1000:.0f} ms, "
                  f"DuckLake merge_adjacent_files {d * 1000:.0f} ms, ratio {c / d:.2f}")  # fmt: skip
        print(f"median ratio of {args.race}: {statistics.median(ratios):.2f}")
        shutil.rmtree(root, ignore_errors=True)
        return 0
    names = args.engines.split(",")
    engines: list = []
    if "castsql" in names:
        engines.append(CastSQL(str(root / "castsql" / "events"), base))
    if "castsql-scan" in names:
        engines.append(CastSQLScan(str(root / "castsql-scan" / "events"), base))
    if "castsql-nofeed" in names:
        engines.append(CastSQLNoFeed(str(root / "castsql-nofeed" / "events"), base))
    if "deltalake" in names:
        engines.append(Delta(str(root / "delta" / "events"), base))
    if "ducklake" in names:
        engines.append(Lake(str(root / "ducklake"), base))
    remotes = [Remote(kind) for kind, on in (("s3", args.s3), ("azure", args.azure)) if on]
    for r in remotes:
        engines.append(r.castsql(base))
        if "deltalake" in names and r.kind == "s3":
            engines.append(r.delta(base))
    print(f"{os.cpu_count()} cores; {args.rows:,} rows, {args.batches} upserts of {args.batch_rows} rows, "
          f"engines in turns; medians of {args.repeat} for queries")  # fmt: skip
    lat = run_stream(engines, feed)
    local_delta = next((e for e in engines if e.name == "deltalake"), None)
    for r in remotes:
        if r.kind == "azure" and local_delta is not None:
            # delta-rs merges fail on Azurite ("Invalid table version"; appends
            # work): its stream's table is copied there instead, for the reads.
            engines.append(r.delta_copy(local_delta.uri))
    lake_p50 = pct(lat["ducklake"], 50) if "ducklake" in lat else None
    print(f"\n{'commit latency (ms)':<22}{'p50':>8}{'p99':>8}{'p99/p50':>8}{'vs lake':>8}"
          f"{'b50-150':>9}{'last 101':>9}{'end/100':>8}{'files':>7}")  # fmt: skip
    for e in (e for e in engines if e.name in lat):
        xs = lat[e.name]
        p50, p99 = pct(xs, 50), pct(xs, 99)
        early = statistics.median(xs[50:151]) if len(xs) > 150 else float("nan")
        late = statistics.median(xs[-101:])
        vs = f"{p50 / lake_p50:>8.2f}" if lake_p50 else f"{'':>8}"
        print(f"{e.name:<22}{p50 * 1000:>8.1f}{p99 * 1000:>8.1f}{p99 / p50:>8.1f}{vs}"
              f"{early * 1000:>9.1f}{late * 1000:>9.1f}{late / early:>8.2f}{e.files():>7}")  # fmt: skip
    for name, xs in lat.items():  # what sets the p99: a cache's fill, an automatic compaction
        top = sorted(range(len(xs)), key=xs.__getitem__)[-4:][::-1]
        print(f"  slowest of {name}: " + ", ".join(f"batch {b} {xs[b] * 1000:.0f} ms" for b in top))
    if args.cdf and "castsql" in lat and CastSQLNoFeed.name in lat:
        on, off = lat["castsql"], lat[CastSQLNoFeed.name]
        paired = statistics.median(a / b for a, b in zip(on, off, strict=True))
        print(f"the feed's cost on a commit (goal <= 1.2): p50 {pct(on, 50) / pct(off, 50):.2f}x, "
              f"median of the per-batch ratios {paired:.2f}x")  # fmt: skip
    # The same live rows as one Parquet file: the floor the queries are held to.
    first = engines[0]
    live = first.t.to_arrow().sort_by("ts") if isinstance(first, CastSQL) else None
    import duckdb

    con = duckdb.connect()
    one = str(root / "one.parquet")
    if live is not None:
        pq.write_table(live, one, row_group_size=122_880)
    hi = (args.rows + args.batches * args.batch_rows) * 1_000_000 + T0
    lo = hi - (hi - T0) // 100
    full = "SELECT count(*), sum(amount), count(DISTINCT kind) FROM {t}"
    recent = (f"SELECT count(*), sum(amount) FROM {{t}} WHERE ts >= make_timestamp({lo}) "
              f"AND ts < make_timestamp({hi})")  # fmt: skip
    floor = {}
    if live is not None:
        for label, q in (("full aggregate", full), ("recent 1% of times", recent)):
            floor[label] = median_time(
                lambda q=q: con.sql(q.format(t=f"read_parquet('{one}')")).fetchall(), args.repeat
            )
    # On a store the floor is the same file on the same server, read as CastSQL reads that store.
    floors = {}
    if live is not None:
        for r in remotes:
            floors[r.label] = r.floor(one, {"full aggregate": full, "recent 1% of times": recent}, args.repeat)
    print(f"\n{'after the stream (ms)':<22}{'one file':>9}" + "".join(f"{e.name:>15}{'x':>6}" for e in engines))
    for label, q in (("full aggregate", full), ("recent 1% of times", recent)):
        cells = ""
        for e in engines:
            m = median_time(lambda e=e, q=q: e.query(q), args.repeat)
            base = next((f for label, f in floors.items() if e.name.endswith(f" on {label}")), floor)
            ratio = m / base[label] if label in base else float("nan")
            cells += f"{m * 1000:>15.1f}{ratio:>6.2f}"
        print(f"{label:<22}{floor.get(label, float('nan')) * 1000:>9.1f}{cells}")
    for store, f in floors.items():
        for label, m in f.items():
            print(f"  one file on the {store} server, {label}: {m * 1000:.1f} ms (the floor of its engines' ratios)")
    if args.delay:
        for r in remotes:
            delayed_queries(r, engines, full, recent, args.delay, args.repeat)
    if "castsql" in names and "ducklake" in names and args.batches >= 300:
        c, d = compaction_race(root, feed, base)
        print(f"\ncompact 300 one-batch files into one: castsql {c * 1000:.0f} ms, "
              f"DuckLake merge_adjacent_files {d * 1000:.0f} ms, ratio {c / d:.2f}")  # fmt: skip
    for r in remotes:
        r.stop()
    if not args.dir:
        shutil.rmtree(root, ignore_errors=True)  # a 3,000-batch run leaves ~15 GB
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
