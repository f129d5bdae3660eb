"""How long the shell takes to start, next to how long Python takes to import DuckDB.

    .venv/bin/python bench/shell_startup_bench.py [--dir WAREHOUSE] [--runs 7]

Three figures, each the median of ``--runs`` runs, measured in the same run so
machine load affects them alike:

* baseline: ``python -c "import duckdb"``
* prompt:   ``castsql DIR`` in a pseudo-terminal, from launch until the prompt
            is drawn, after the banner with every table's latest version (so
            the data is already there)
* command:  ``castsql DIR -c "select 1"``, launch to exit

The target is under 1.5 s to the prompt. Without ``--dir`` a warehouse of
three tables with a few versions each is built in a temporary directory
(no Spark needed). The script also lists heavy modules (Spark, pandas,
prompt_toolkit in script mode…) that the start-up path imports but should not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pexpect

sys.path.insert(0, os.path.dirname(__file__))
from _common import ensure_bytecode

TARGET_SECONDS = 1.5
PYTHON = sys.executable
CASTSQL = str(Path(PYTHON).with_name("castsql"))
HEAVY = ("pyspark", "pandas", "prompt_toolkit", "pygments", "s3fs", "boto3", "botocore")


def build_warehouse(root: Path) -> None:
    import pyarrow as pa
    from pyroaring import BitMap

    from castsql.format import PositionDelete, TableLog, write_data_files
    from castsql.storage import open_storage

    for t, n in (("events", 20_000), ("users", 500), ("orders", 5_000)):
        st = open_storage(str(root / t))
        log = TableLog.create(st, pa.schema([("id", pa.int64()), ("v", pa.string())]), primary_key="id")
        for k in range(4):
            ids = list(range(k * n, (k + 1) * n))
            files = log.append(write_data_files(st, pa.table({"id": ids, "v": [f"r{i}" for i in ids]}))).data_files
        log.delete([PositionDelete(files[-1].name, None, BitMap([0, 1, 2]))])


def time_import_duckdb() -> float:
    t0 = time.perf_counter()
    subprocess.run([PYTHON, "-c", "import duckdb"], check=True)
    return time.perf_counter() - t0


def time_to_prompt(warehouse: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    child = pexpect.spawn(CASTSQL, [warehouse], env=env, dimensions=(40, 120), encoding="utf-8", timeout=30)
    child.expect_exact("Tables: ")  # the banner: every table's latest version has been read
    child.expect_exact("castsql> ")
    elapsed = time.perf_counter() - t0
    child.sendcontrol("d")
    child.expect(pexpect.EOF)
    child.close()
    return elapsed


def time_command(warehouse: str, env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run([CASTSQL, warehouse, "-c", "select 1"], check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def heavy_imports(warehouse: str) -> list[str]:
    code = (
        "import sys\nfrom castsql.shell.app import main\n"
        f"main([{warehouse!r}, '-c', 'select 1'])\n"
        f"print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}} & set({list(HEAVY)!r}))))"
    )
    out = subprocess.run([PYTHON, "-c", code], check=True, capture_output=True, text=True).stdout
    return out.split("\n", 2)[-1].split()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", help="warehouse (or table) to open; default: build a small one")
    p.add_argument("--runs", type=int, default=7)
    args = p.parse_args()
    ensure_bytecode()
    with tempfile.TemporaryDirectory() as tmp:
        warehouse = args.dir
        if warehouse is None:
            warehouse = str(Path(tmp) / "wh")
            build_warehouse(Path(warehouse))
        env = dict(os.environ, CASTSQL_HISTORY=str(Path(tmp) / "history"), TERM="xterm-256color")
        # The pty does not answer cursor-position requests; a real terminal does, at once.
        env["PROMPT_TOOLKIT_NO_CPR"] = "1"
        time_to_prompt(warehouse, env)  # warm the OS file cache and .pyc files; not counted
        base, prompt, command = [], [], []
        for _ in range(args.runs):
            base.append(time_import_duckdb())
            prompt.append(time_to_prompt(warehouse, env))
            command.append(time_command(warehouse, env))
        heavy = heavy_imports(warehouse)
    b, pr, c = (statistics.median(x) for x in (base, prompt, command))
    print(f"warehouse: {args.dir or 'built: events, users, orders (versions 0-5 each)'}; median of {args.runs} runs")
    print(f"  python -c 'import duckdb'        {b:6.3f} s   1.00x")
    print(f"  castsql DIR  (to the prompt)     {pr:6.3f} s   {pr / b:4.2f}x   target < {TARGET_SECONDS} s")
    print(f"  castsql DIR -c 'select 1'        {c:6.3f} s   {c / b:4.2f}x")
    print(f"  heavy modules imported by -c: {', '.join(heavy) if heavy else 'none'}")
    ok = pr < TARGET_SECONDS and not heavy
    print("OK" if ok else "SLOW: over target or heavy imports on the start-up path")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
