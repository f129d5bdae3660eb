"""Writers committing through a proxy that fails, drops and slows a share of
S3 requests, while other writers are SIGKILLed at random points and a garbage
collector keeps dropping all but the last two versions: afterwards every kept
version reads, versions are contiguous, no commit is lost or made twice, and
no object a kept version references is missing."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pyarrow as pa
import pytest
from faultproxy import FaultProxy
from paths import SUPPORT

from castsql.format import TableLog
from castsql.snapshot import resolve
from castsql.storage import S3Config, open_storage
from castsql.write.garbage import gc

TESTS = SUPPORT
WRITERS, COMMITS = 4, 35
# Longer than any writer here takes from its data-file put to its commit
# (asserted below): FORMAT.md §8 rules 4 and 5 make GC safe only then. Short
# enough that versions older than it are dropped while the writers run.
GRACE_S = 20.0


@pytest.mark.s3
def test_commits_survive_faults_kills_and_concurrent_gc(s3_server, s3_root, tmp_path):
    upstream = int(s3_server.endpoint_url.rsplit(":", 1)[1])
    proxy = FaultProxy(upstream, rate=0.15, seed=7)
    proxy.start()
    stop = tmp_path / "stop-gc"
    try:
        cfg = s3_server.config
        TableLog.create(open_storage(s3_root, s3=cfg), pa.schema([("id", pa.int64()), ("writer", pa.int64())]))
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": proxy.endpoint_url,
            "AWS_ACCESS_KEY_ID": cfg.key,
            "AWS_SECRET_ACCESS_KEY": cfg.secret,
            "AWS_REGION": cfg.region,
        }

        def worker(script: str, *args: str) -> subprocess.Popen:
            return subprocess.Popen(
                [sys.executable, str(TESTS / script), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )

        collector = worker("gc_worker.py", s3_root, str(stop), str(GRACE_S))
        steady = [
            worker("commit_worker.py", s3_root, str(w), str(COMMITS), "--uncertain-retries", "5")
            for w in range(WRITERS)
        ]
        # Writers killed at a random moment of their work.
        rng = random.Random(3)
        doomed = [worker("commit_worker.py", s3_root, str(100 + k), "50", "--uncertain-retries", "5") for k in range(3)]
        for p in doomed:
            time.sleep(rng.uniform(2.0, 5.0))
            p.send_signal(signal.SIGKILL)
        slowest = 0.0
        for p in steady:
            out, err = p.communicate(timeout=600)
            assert p.returncode == 0, err[-3000:]
            slowest = max(slowest, float(re.search(r"slowest_commit_s=([\d.]+)", out).group(1)))
        for p in doomed:
            _, err = p.communicate(timeout=60)
            assert p.returncode == -signal.SIGKILL, err[-3000:]  # killed while still committing
        stop.touch()
        gc_out, gc_err = collector.communicate(timeout=120)
        assert collector.returncode == 0, gc_err[-3000:]
    finally:
        stop.touch()
        proxy.stop()
    assert proxy.counts["drop_after"] > 0 and proxy.counts["error"] > 0, proxy.counts
    rounds = dict(kv.split("=") for kv in gc_out.split()[1:])
    assert int(rounds["rounds"]) >= 3 and int(rounds["removed_versions"]) > 0, gc_out
    assert slowest < GRACE_S, f"a writer took {slowest:.1f} s to commit: GRACE_S is too short for this test"

    log = TableLog(open_storage(s3_root, s3=S3Config(**{**cfg.__dict__})))
    latest = log.latest_version()
    kept = log.versions()
    assert kept == list(range(kept[0], latest + 1)) and len(kept) >= 2  # contiguous up to the head
    last = log.latest()
    ids = [f.min["id"] for f in log.state(last).entries()]
    assert len(ids) == len(set(ids)) == latest  # one file per commit, none twice
    steady_ids = {w * 1_000_000 + i for w in range(WRITERS) for i in range(COMMITS)}
    assert steady_ids <= set(ids)  # no commit of a surviving writer lost
    killed_commits = len(ids) - len(steady_ids)
    for v in kept:  # every kept version resolves, and every object it names is there
        snap = resolve(log, v)
        for f in snap.files:
            assert log.storage.exists(f.key), (v, f.key)
    # Now that no writer is in flight, orphans of the killed writers may go at once.
    final = gc(s3_root, keep_versions=1, grace=timedelta(0), s3=cfg)
    assert log.versions() == [latest] and resolve(log, latest).live_rows == latest
    print(
        f"\nfaults injected: {dict(proxy.counts)}; versions: {latest}, by killed writers: {killed_commits}; "
        f"concurrent {gc_out.strip()}; slowest commit {slowest:.2f} s (grace {GRACE_S:.0f} s); "
        f"final gc removed {len(final.removed_orphans)} orphan(s)"
    )
