"""Running a script that builds its own SparkSession, as a user's program would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def run_flaky(tmp_path: Path, script: str) -> str:
    """Run ``script`` (``argv``: a table URI and a marker file that the first,
    failing task attempt creates) in a fresh interpreter; return the URI once
    it exited 0 with the marker made (so an attempt did fail)."""
    uri = str(tmp_path / "t")
    path = tmp_path / "flaky.py"
    path.write_text(script)
    marker = tmp_path / "failed-once"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK")}
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    out = subprocess.run(
        [sys.executable, str(path), uri, str(marker)], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert marker.exists(), "no task attempt failed"
    return uri
