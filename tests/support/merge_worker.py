"""A writer process for the crash tests: ``python tests/support/merge_worker.py URI STEP [OP]``
runs one write with the embedded engine and SIGKILLs itself at STEP (see
commit_worker.CrashingStorage). OP ``merge`` (default) upserts id 5 (update)
and id 100 (insert); ``update`` sets n = -1 where id = 5; ``delete`` deletes id 5."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).parent))

from commit_worker import CrashingStorage

import castsql


def main() -> None:
    uri, step = sys.argv[1], sys.argv[2]
    op = sys.argv[3] if len(sys.argv) > 3 else "merge"
    t = castsql.open(uri)
    log = t._session.log(t.name)
    log.storage = CrashingStorage(log.storage, step)
    if op == "update":
        t.update(set={"n": "-1"}, where="id = 5")
    elif op == "delete":
        t.delete("id = 5")
    else:
        src = pa.table({"id": [5, 100], "v": ["new", "new"], "n": [50, 1000]})
        t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()


if __name__ == "__main__":
    main()
