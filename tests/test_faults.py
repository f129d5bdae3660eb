"""Writers committing through a proxy that fails, drops and slows a share of
S3 requests, while other writers are SIGKILLed at random points: afterwards
every committed version reads, versions are contiguous, no commit is lost or
made twice, and no committed object is missing."""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pytest
from faultproxy import FaultProxy

from castsql.format import TableLog
from castsql.format.layout import to_table_key
from castsql.storage import S3Config, open_storage

WORKER = str(Path(__file__).with_name("commit_worker.py"))
WRITERS, COMMITS = 4, 12


@pytest.mark.s3
def test_commits_survive_faults_and_kills(s3_server, s3_root):
    upstream = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    proxy = FaultProxy(upstream, rate=0.15, seed=7)
    proxy.start()
    try:
        cfg = s3_server.config
        TableLog.create(open_storage(s3_root, s3=cfg), pa.schema([("id", pa.int64()), ("writer", pa.int64())]))
        env = {
            **__import__("os").environ,
            "AWS_ENDPOINT_URL": proxy.endpoint_url,
            "AWS_ACCESS_KEY_ID": cfg.key,
            "AWS_SECRET_ACCESS_KEY": cfg.secret,
            "AWS_REGION": cfg.region,
        }
        steady = [
            subprocess.Popen(
                [sys.executable, WORKER, s3_root, str(w), str(COMMITS), "--uncertain-retries", "5"],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            for w in range(WRITERS)
        ]
        # Writers killed at a random moment of their work.
        rng = random.Random(3)
        doomed = [
            subprocess.Popen(
                [sys.executable, WORKER, s3_root, str(100 + k), "50", "--uncertain-retries", "5"],
                env=env,
                stderr=subprocess.PIPE,
                text=True,
            )
            for k in range(3)
        ]
        for p in doomed:
            time.sleep(rng.uniform(2.0, 5.0))
            p.send_signal(signal.SIGKILL)
        for p in steady:
            _, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
        for p in doomed:
            _, err = p.communicate(timeout=60)
            assert p.returncode == -signal.SIGKILL, err[-3000:]  # killed while still committing
    finally:
        proxy.stop()
    assert proxy.counts["drop_after"] > 0 and proxy.counts["error"] > 0, proxy.counts

    log = TableLog(open_storage(s3_root, s3=S3Config(**{**cfg.__dict__})))
    latest = log.latest_version()
    assert log.versions() == list(range(latest + 1))
    last = log.latest()
    ids = [f.min["id"] for f in last.data_files]
    assert len(ids) == len(set(ids)) == latest  # one file per commit, none twice
    steady_ids = {w * 1_000_000 + i for w in range(WRITERS) for i in range(COMMITS)}
    assert steady_ids <= set(ids)  # no commit of a surviving writer lost
    killed_commits = len(ids) - len(steady_ids)
    for m in log.history():
        for f in m.data_files:
            assert log.storage.exists(to_table_key(f.path, log.uri, what="data file"))
    print(f"\nfaults injected: {dict(proxy.counts)}; versions: {latest}, by killed writers: {killed_commits}")
