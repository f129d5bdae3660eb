"""A CDC consumer process for the crash tests: ``python tests/support/cdc_worker.py
URI BATCHES START [STEP BATCH]`` applies the batches of the JSON file BATCHES
from index START on, each with ``app_id="feed"`` and its index as
``batch_id`` (as a consumer resuming from its last committed offset does);
with STEP, it SIGKILLs itself at that step (commit_worker.CrashingStorage)
in the first batch from BATCH on that reaches it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import cdc_model
from commit_worker import CrashingStorage

import castsql


def main() -> None:
    uri, path, start = sys.argv[1], sys.argv[2], int(sys.argv[3])
    step, at = (sys.argv[4], int(sys.argv[5])) if len(sys.argv) > 5 else (None, -1)
    batches = json.loads(Path(path).read_text())
    t = castsql.open(uri)
    log = t._session.log(t.name)
    plain = log.storage
    for i in range(start, len(batches)):
        log.storage = CrashingStorage(plain, step) if step and i >= at else plain
        t.apply_cdc(cdc_model.arrow(batches[i]), key="id", op_column="op", sequence="seq", app_id="feed", batch_id=i)
    print("done", t.version)


if __name__ == "__main__":
    main()
