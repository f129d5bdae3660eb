"""SQL file pruning: CastSQL against plain DuckDB over the same Parquet files.

    .venv/bin/python bench/prune_bench.py [--files 1000] [--rows 2000] [--reps 7] [--backends local,s3]

One table of ``--files`` data files (``--rows`` rows each, ids in file order)
per backend (local disk; SeaweedFS on 127.0.0.1 for S3). Each query runs
through a CastSQL ``Session`` and, as the baseline, through DuckDB's
``read_parquet`` over the list of every data file (what CastSQL's view was
before it pruned, and what a DuckDB user would write), in interleaved rounds
(A B B A); medians and the ratio castsql/raw are printed.

- ``warm``: one session and one connection for all rounds (DuckDB's Parquet
  metadata cache is warm: the footers are read once).
- ``cold``: a new session and a new connection per query, as in a fresh
  shell; CastSQL's time includes reading the pointer and the manifest.

Queries: ``range`` (ids of one file), ``point`` (one id), ``full`` (no
predicate: what the pruning attempt costs a query it cannot help).

Then 1% of the rows of the first half of the files are deleted, and a point
query on a file of the other half runs through CastSQL (pruned to that clean
file: a plain ``read_parquet``) and, as the baseline, the way CastSQL ran it
before: the same freshness check (pointer read, roll-forward probe), then the
version's DuckLake view, which skips the other files by its statistics but
pays DuckLake's per-query cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

import pyarrow as pa
from _common import backend_root, machine
from pyroaring import BitMap

from castsql.engine import Session
from castsql.engine.duckdb.duck import configure_s3, new_connection
from castsql.engine.views import sql_str
from castsql.format import PositionDelete, TableLog, write_data_files
from castsql.storage import open_storage


def build(uri: str, s3, files: int, rows: int) -> list[str]:
    st = open_storage(uri, s3=s3)
    schema = pa.schema([("id", pa.int64()), ("v", pa.int64()), ("s", pa.string())])
    log = TableLog.create(st, schema, primary_key="id")
    out = []
    for k in range(files):
        ids = pa.array(range(k * rows, (k + 1) * rows), pa.int64())
        t = pa.table({"id": ids, "v": ids, "s": pa.array([f"s{k}"] * rows, pa.string())})
        out += write_data_files(st, t, log.latest().schema)
    log.append(out)
    return [st.uri(f.path) for f in log.latest().data_files]


def queries(files: int, rows: int) -> dict[str, str]:
    mid = files // 2 * rows
    return {
        "range": f"SELECT sum(v) FROM {{t}} WHERE id BETWEEN {mid} AND {mid + rows - 1}",
        "point": f"SELECT v FROM {{t}} WHERE id = {mid + 7}",
        "full": "SELECT sum(v) FROM {t}",
    }


def run(uri: str, s3, uris: list[str], files: int, rows: int, reps: int) -> list[tuple[str, str, float, float]]:
    raw_src = f"read_parquet([{', '.join(sql_str(u) for u in uris)}])"

    def connection():
        con = new_connection()
        if s3 is not None:
            configure_s3(con, s3)
        return con

    results = []
    for mode in ("warm", "cold"):
        session = Session(uri, s3=s3) if mode == "warm" else None
        con = connection() if mode == "warm" else None
        for qname, q in queries(files, rows).items():

            def castsql(q=q, session=session):
                if session is not None:
                    return session.sql(q.format(t="t"))
                with Session(uri, s3=s3) as s:
                    return s.sql(q.format(t="t"))

            def raw(q=q, con=con):
                c = con or connection()
                try:
                    return c.sql(q.format(t=raw_src)).fetchall()
                finally:
                    if con is None:
                        c.close()

            assert castsql().to_pylist()[0] and raw()  # warm-up, and both answer
            a, b = [], []
            for i in range(reps):
                for fn, acc in ((castsql, a), (raw, b)) if i % 2 == 0 else ((raw, b), (castsql, a)):
                    t0 = time.perf_counter()
                    fn()
                    acc.append(time.perf_counter() - t0)
            results.append((mode, qname, statistics.median(a), statistics.median(b)))
        if session is not None:
            session.close()
            con.close()
    return results


def run_with_deletes(uri: str, s3, files: int, rows: int, reps: int) -> tuple[float, float]:
    log = TableLog(open_storage(uri, s3=s3))
    first_half = log.latest().data_files[: files // 2]
    log.delete([PositionDelete(f.path.rsplit("/", 1)[1], None, BitMap(range(0, rows, 100))) for f in first_half])
    q = f"SELECT v FROM t WHERE id = {files * 3 // 4 * rows + 7}"
    with Session(uri, s3=s3) as s:
        want = s.sql(q).to_pylist()  # creates the version's view "t" (DuckLake) and the pruned one
        assert [tuple(r.values()) for r in want] == s.con.sql(q).fetchall()
        a, b = [], []
        for i in range(reps):
            pair = ((lambda: s.sql(q), a), (lambda: (s._sync_latest("t"), s.con.sql(q).fetchall()), b))
            for fn, acc in pair if i % 2 == 0 else pair[::-1]:
                t0 = time.perf_counter()
                fn()
                acc.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--backends", default="local,s3")
    args = ap.parse_args()
    print(f"# {machine()}; {args.files} files x {args.rows} rows; median of {args.reps} interleaved rounds")
    print(f"{'backend':8} {'mode':5} {'query':6} {'castsql ms':>11} {'raw ms':>9} {'castsql/raw':>12}")
    for backend in args.backends.split(","):
        with backend_root(backend, "prune") as (s3, root):
            uri = f"{root}/t"
            uris = build(uri, s3, args.files, args.rows)
            for mode, q, a, b in run(uri, s3, uris, args.files, args.rows, args.reps):
                print(f"{backend:8} {mode:5} {q:6} {a * 1e3:11.2f} {b * 1e3:9.2f} {a / b:12.2f}", flush=True)
            a, b = run_with_deletes(uri, s3, args.files, args.rows, args.reps)
            print(
                f"{backend:8} warm  point on a clean file, deletes in half the files: castsql {a * 1e3:.2f} ms, "
                f"unpruned (freshness check + the version's DuckLake view) {b * 1e3:.2f} ms, ratio {a / b:.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
