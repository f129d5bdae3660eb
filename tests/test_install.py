"""``pip install castsql`` (no extras) in a clean virtualenv gives the shell,
the Python front door and ``gc``, without pyspark and pandas; a command that
needs Spark names the extra to install."""

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

from castsql.format import TableLog, write_data_files
from castsql.storage import open_storage

REPO = Path(__file__).resolve().parent.parent


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


@pytest.fixture(scope="module")
def venv() -> Iterator[Path]:
    # Its own directory: pytest prunes old base temp directories when other
    # pytest runs start, which would remove the virtualenv under a long run.
    tmp = Path(tempfile.mkdtemp(prefix="castsql-install-"))
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", tmp / "dist", REPO)
    [wheel] = (tmp / "dist").glob("castsql-*.whl")
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


def test_gc_needs_no_spark(venv, table):
    p = run(venv / "bin/castsql", "gc", table, "--keep-versions", "1", "--dry-run")
    assert "Traceback" not in p.stderr


def test_a_command_that_needs_spark_names_the_extra(venv, table, tmp_path):
    src = tmp_path / "more.parquet"
    pq.write_table(pa.table({"id": pa.array([10], pa.int64()), "kind": ["c"]}), src)
    p = run(venv / "bin/castsql", "append", table, "--from", src, ok=False)
    assert p.returncode == 1
    assert "pip install 'castsql[spark]'" in p.stderr
    assert "Traceback" not in p.stderr
    assert len(TableLog(open_storage(table)).versions()) == 2  # nothing committed
