"""The first read in a fresh process: ``castsql.open(uri).to_arrow()`` against
``deltalake.DeltaTable(uri).to_pyarrow_table()`` on the same live rows.

    .venv/bin/python bench/open_bench.py [--rows 1000000] [--files 4] [--rounds 7]

Builds ``--rows`` rows in ``--files`` files twice: a CastSQL table whose
version 2 deletes 1% (then, another table, 25%) of the rows by position
(random positions, one tombstone), and a Delta table holding the same live
rows. Then, ``--rounds`` times and alternating which goes first, starts a
fresh Python process per reader and case, which imports its library, opens
the table and reads every live row (and, as a second case, the rows with
``id < rows / 100``: the filter prunes files, the set-up stays). Each child
reports the seconds from before its import to the last row; printed are the
medians and the ratio CastSQL / deltalake (issue 21's goal: at most 1.0).

CastSQL's modules are byte-compiled first, as ``pip install`` does for any
wheel (deltalake's are): a checkout installed editable, in an environment with
``PYTHONDONTWRITEBYTECODE`` set, would otherwise compile ~40 modules from
source in every child, which no installed user pays.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import pyarrow as pa

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
kind, uri, cut = sys.argv[1], sys.argv[2], int(sys.argv[3])
if kind == "castsql":
    import castsql
    t = castsql.open(uri)
    n = (t.to_arrow(filter=f"id < {cut}") if cut >= 0 else t.to_arrow()).num_rows
else:
    from deltalake import DeltaTable
    import pyarrow.dataset as ds
    dt = DeltaTable(uri)
    if cut >= 0:
        n = dt.to_pyarrow_dataset().to_table(filter=ds.field("id") < cut).num_rows
    else:
        n = dt.to_pyarrow_table().num_rows
print(json.dumps({"s": time.perf_counter() - t0, "rows": n}))
"""


def rows(lo: int, hi: int) -> pa.Table:
    ids = np.arange(lo, hi, dtype=np.int64)
    h = (ids * 2654435761) % 1_000_003
    return pa.table(
        {
            "id": ids,
            "user": pa.array(np.char.add("u", (h % 10_000).astype(str)).astype(object), pa.string()),
            "amount": (h % 100_000) / 100.0,
        }
    )


def build(base: Path, n: int, files: int, share: float, rng: np.random.Generator) -> tuple[str, str]:
    from deltalake import write_deltalake
    from pyroaring import BitMap

    from castsql.format import PositionDelete, TableLog, write_data_files
    from castsql.storage import open_storage

    name = f"del{round(share * 100)}"
    cs, dl = base / name / "castsql", base / name / "delta"
    st = open_storage(str(cs))
    log = TableLog.create(st, rows(0, 1).schema, primary_key="id")
    per = n // files
    entries = []
    for i in range(files):
        entries += write_data_files(st, rows(i * per, (i + 1) * per), log.latest().schema, target_file_bytes=1 << 40)
    log.append(entries)
    records, live = [], []
    for i, f in enumerate(entries):
        dead = rng.choice(per, int(per * share), replace=False)
        records.append(PositionDelete(f.path, None, BitMap(dead.astype(np.uint32).tolist())))
        keep = np.ones(per, dtype=bool)
        keep[dead] = False
        live.append(rows(i * per, (i + 1) * per).filter(pa.array(keep)))
    log.delete(records)
    for part in live:
        write_deltalake(str(dl), part, mode="append", target_file_size=1 << 40)
    return str(cs), str(dl)


def run(kind: str, uri: str, cut: int) -> tuple[float, int]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    out = subprocess.run([sys.executable, "-c", CHILD, kind, uri, str(cut)], capture_output=True, text=True, env=env)
    lines = out.stdout.strip().splitlines()
    # The child's answer counts once printed: a process importing pyarrow and
    # deltalake alone aborts now and then at interpreter exit ("terminate
    # called without an active exception", rc 134), after its work is done.
    if not lines or (out.returncode and "terminate called" not in out.stderr):
        raise SystemExit(f"{kind} reader failed (rc {out.returncode}): {out.stderr[-500:]}")
    r = json.loads(lines[-1])
    return r["s"], r["rows"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args(argv)
    compileall.compile_dir(str(Path(__file__).resolve().parents[1] / "castsql"), quiet=1)
    base = Path(tempfile.mkdtemp(prefix="castsql-open-bench-"))
    rng = np.random.default_rng(3)
    print(f"{os.cpu_count()} cores; {args.rows:,} rows in {args.files} files; fresh process per read; "
          f"medians of {args.rounds}")  # fmt: skip
    print(f"{'deletes':>8} {'read':<10}{'castsql s':>10}{'delta s':>10}{'ratio':>8}")
    for share in (0.01, 0.25):
        cs, dl = build(base, args.rows, args.files, share, rng)
        for label, cut in (("all rows", -1), ("id < 1%", args.rows // 100)):
            times: dict[str, list[float]] = {"castsql": [], "delta": []}
            counts = set()
            for r in range(args.rounds):
                for kind in ("castsql", "delta") if r % 2 else ("delta", "castsql"):
                    s, n = run(kind, cs if kind == "castsql" else dl, cut)
                    times[kind].append(s)
                    counts.add(n)
            if len(counts) != 1:
                raise SystemExit(f"the readers disagree on the rows: {counts}")
            c, d = statistics.median(times["castsql"]), statistics.median(times["delta"])
            print(f"{share:>8.0%} {label:<10}{c:>10.3f}{d:>10.3f}{c / d:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
