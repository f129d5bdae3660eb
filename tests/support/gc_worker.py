"""A garbage collector process for the fault test: collects the table
over and over until STOP_FILE exists, with the tightest version setting.

    python tests/support/gc_worker.py URI STOP_FILE GRACE_SECONDS

Every round runs :func:`castsql.spark.gc` (which imports no Spark). A round
that fails with a StorageError (the fault proxy's doing) is counted and the
next one starts: an interrupted GC may only leave orphans behind. Prints one
summary line at the end. S3 settings come from AWS_* variables.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

from castsql.storage import StorageError
from castsql.write.garbage import gc


def main() -> None:
    uri, stop_file, grace = sys.argv[1], sys.argv[2], float(sys.argv[3])
    rounds = failed = versions = orphans = 0
    while not os.path.exists(stop_file):
        try:
            report = gc(uri, keep_versions=2, grace=timedelta(seconds=grace))
        except StorageError:
            failed += 1
            continue
        rounds += 1
        versions += len(report.removed_versions)
        orphans += len(report.removed_orphans)
        time.sleep(0.05)
    print(f"gc rounds={rounds} failed={failed} removed_versions={versions} removed_orphans={orphans}", flush=True)


if __name__ == "__main__":
    main()
