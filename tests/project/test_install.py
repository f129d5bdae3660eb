"""Installing the wheel (no extras) into a clean virtualenv gives the shell,
the Python front door and ``gc``, without pyspark and pandas; a command that
needs Spark names the extra to install. Installed next to newer pyarrow and
pandas than the development set, it downgrades nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from paths import REPO

from castsql.format import TableLog, write_data_files
from castsql.storage import open_storage


def clean_env() -> dict[str, str]:
    """This process's environment without what points Python at the repository
    (the shared Spark session sets PYTHONPATH for its workers): the virtualenv
    must see only what the wheel installed."""
    drop = ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith(("SPARK_", "PYSPARK_"))}


def run(*cmd: str | Path, ok: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, env=clean_env())
    if ok and p.returncode != 0:
        raise AssertionError(f"{cmd}: exit {p.returncode}\n{p.stdout}\n{p.stderr}")
    return p


def build_wheel(dest: Path) -> Path:
    """The wheel, built from a private copy of what it is made of: setuptools
    builds in the source tree (``build/``, ``castsql.egg-info``), and the
    repository's tree is shared with every other test of the run (one CI run
    failed with a file gone from under the build)."""
    src = dest / "src"
    for name in ("pyproject.toml", "README.md"):
        src.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, src / name)
    shutil.copytree(
        REPO / "castsql",
        src / "castsql",
        ignore=shutil.ignore_patterns("__pycache__", "*.duckdb_extension", "*.stamp", "*.jar", "include-*", ".tmp-*"),
    )
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", dest / "dist", src)
    [wheel] = (dest / "dist").glob("castsql-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    # Its own directory: pytest prunes old base temp directories when other
    # pytest runs start, which would remove the virtualenv under a long run.
    tmp = Path(tempfile.mkdtemp(prefix="castsql-install-"))
    wheel = build_wheel(tmp)
    env = tmp / "venv"
    run(sys.executable, "-m", "venv", env)
    run(env / "bin/python", "-m", "pip", "install", "-q", wheel)
    yield env
    shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("installed") / "events")
    store = open_storage(root)
    data = pa.table({"id": pa.array(range(10), pa.int64()), "kind": ["a", "b"] * 5})
    log = TableLog.create(store, data.schema, primary_key="id")
    log.append(write_data_files(store, data, log.latest().schema))
    return root


def test_no_spark_and_no_pandas_come_with_the_plain_install(venv):
    for module in ("pyspark", "pandas"):
        p = run(venv / "bin/python", "-c", f"import {module}", ok=False)
        assert p.returncode != 0, f"{module} was installed"


def test_the_shell_and_the_python_front_door_work(venv, table):
    out = run(venv / "bin/castsql", table, "-c", "SELECT count(*) AS n FROM events WHERE kind = 'b'").stdout
    assert "5" in out
    code = f"import castsql; t = castsql.open({table!r}); print(t.version, t.to_arrow(filter='id < 4').num_rows)"
    assert run(venv / "bin/python", "-c", code).stdout.split() == ["1", "4"]


def test_the_ui_works_from_the_plain_install(venv, table):
    """``castsql ui`` needs nothing beyond the plain install, its scripts and chart library included."""
    import re
    import signal
    import urllib.request

    proc = subprocess.Popen(
        [venv / "bin/castsql", "ui", table, "--no-browser", "--port", "0"], stdout=subprocess.PIPE, text=True
    )
    try:
        m = re.search(r"(http://127\.0\.0\.1:\d+)/\?token=(\S+)", proc.stdout.readline())
        assert m, "castsql ui printed no URL"
        http = urllib.request.build_opener()
        http.addheaders = [("Cookie", f"castsql_ui_token_{m.group(1).rsplit(':', 1)[1]}={m.group(2)}")]
        assert b"id=versions" in http.open(m.group(1) + "/tables/events").read()
        assert b"uPlot" in http.open(m.group(1) + "/static/uPlot.iife.min.js").read()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0


def test_gc_needs_no_spark(venv, table):
    p = run(venv / "bin/castsql", "gc", table, "--keep-versions", "1", "--dry-run")
    assert "Traceback" not in p.stderr


def test_a_command_that_needs_spark_names_the_extra(venv, table, tmp_path):
    src = tmp_path / "more.parquet"
    pq.write_table(pa.table({"id": pa.array([10], pa.int64()), "kind": ["c"]}), src)
    # Append runs in-process; asking for Spark needs the extra.
    p = run(venv / "bin/castsql", "append", table, "--from", src, "--engine", "spark", ok=False)
    assert p.returncode == 1
    assert "pip install 'castsql[spark]'" in p.stderr
    assert "Traceback" not in p.stderr
    assert len(TableLog(open_storage(table)).versions()) == 2  # nothing committed


# Packages a dependency of CastSQL's caps below their newest release, so that a
# user who has the newest gets it downgraded by pip; not CastSQL's ranges.
CAPPED_ELSEWHERE = {
    "python-dateutil": "botocore requires python-dateutil < 3 (where a user's other packages bring it)",
}


def _versions(python: Path) -> dict[str, str]:
    import json

    out = run(python, "-m", "pip", "list", "--format", "json").stdout
    return {p["name"].lower().replace("_", "-"): p["version"] for p in json.loads(out)}


def test_the_wheel_keeps_the_newer_pyarrow_and_pandas_a_user_has(table, tmp_path):
    """A user's environment with pyarrow and pandas newer than constraints.txt's
    (the newest pip can get): installing the wheel downgrades nothing, and the
    shell works on them."""
    wheel = build_wheel(tmp_path)
    env = tmp_path / "user"
    run(sys.executable, "-m", "venv", env)
    python = env / "bin/python"
    run(python, "-m", "pip", "install", "-q", "--upgrade", "pyarrow", "pandas")
    before = _versions(python)
    pinned = {
        line.split("==")[0].lower(): line.split("==")[1].strip()
        for line in (REPO / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    }
    for name in ("pyarrow", "pandas"):
        have = tuple(int(x) for x in before[name].split(".")[:2])
        assert have > tuple(int(x) for x in pinned[name].split(".")[:2]), f"{name} {before[name]} is not newer"
    run(python, "-m", "pip", "install", "-q", wheel)
    after = _versions(python)
    changed = {n: (v, after.get(n)) for n, v in before.items() if after.get(n) != v}
    assert "pyarrow" not in changed and "pandas" not in changed and "numpy" not in changed, changed
    # What CastSQL's own ranges cannot prevent: a cap of a package it needs.
    assert set(changed) <= set(CAPPED_ELSEWHERE), f"installing the wheel changed the user's packages: {changed}"
    out = run(env / "bin/castsql", table, "-c", "SELECT count(*) AS n FROM events WHERE kind = 'b'").stdout
    assert out.split() == ["n", "5"]
    code = f"import castsql; print(castsql.open({table!r}).to_pandas().shape)"
    assert run(python, "-c", code).stdout.strip() == "(10, 2)"
