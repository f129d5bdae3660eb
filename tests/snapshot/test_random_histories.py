"""Randomized histories against an independent model.

A Hypothesis state machine applies random appends, deletes of every
tombstone kind (row groups, key ranges, positions as lists and bitmaps,
file- and row-group-relative), Spark compactions and garbage collections to a
real table, and after every step checks that EVERY kept version, read through
SQL ``AS OF VERSION`` and through the Arrow scan API, holds exactly the
model's rows (a selective query too, which SQL file pruning serves), that
the changes between two kept versions equal the model's
difference, that a collected version is refused with a clear error, and that
GC left exactly the objects the kept versions reference. Schema changes are
steps too (FORMAT.md §3.4): adding a column (rows written before read NULL
there, rows written after hold a value derived from the id) and widening
``v`` from int32 to int64; every version must read with its own columns and
types, across compactions (which rewrite old files in the head's schema) and
GC.

The model is a set of live ids per version, plus where each live row sits
(file, position): deletes need positions to say which ids they remove. A
compaction keeps the set; the rows of the files it rewrote are located again
by reading the new files with plain pyarrow, which also proves that they hold
exactly those rows, once each.

CASTSQL_SOAK_EXAMPLES raises the budget for a long soak (it prints how many
steps of each kind ran).
"""

from __future__ import annotations

import os
import uuid
from collections import Counter
from datetime import timedelta

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from pyroaring import BitMap

from castsql.engine import Session
from castsql.errors import VersionNotFound
from castsql.format import KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog, fold, write_data_files
from castsql.format.layout import DATA_DIR, META_DIR, TOMBSTONE_DIR, to_table_key
from castsql.spark import compact, gc
from castsql.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int32())])  # v widens to int64 in some histories
ADDED_MAX = 2  # columns a1, a2 an add-column step may add
SOAK = "CASTSQL_SOAK_EXAMPLES" in os.environ
EXAMPLES = int(os.environ.get("CASTSQL_SOAK_EXAMPLES", "10"))
STEPS: Counter[str] = Counter()


def make_machine(root: str, s3, spark):
    class History(RuleBasedStateMachine):
        @initialize()
        def create(self):
            self.storage = open_storage(f"{root}/{uuid.uuid4().hex[:8]}/t", s3=s3)
            self.log = TableLog.create(self.storage, SCHEMA, primary_key="id")
            self.session = Session(self.storage.root, s3=s3)
            self.next_id = 0
            # model: version -> {id: file key, position}; the latest version's files
            self.model: dict[int, dict[int, tuple[str, int]]] = {0: {}}
            self.collected: list[int] = []  # versions GC dropped
            # schema model: version -> (added columns, type of v); id -> added columns when it was written
            self.schemas: dict[int, tuple[int, str]] = {0: (0, "int32")}
            self.written_with: dict[int, int] = {}

        def teardown(self):
            if hasattr(self, "session"):
                self.session.close()

        @property
        def live(self) -> dict[int, tuple[str, int]]:
            return self.model[max(self.model)]

        def _commit(self, m, live):
            assert m.version == max(self.model) + 1
            self.schemas[m.version] = self.schemas[max(self.model)]
            self.model[m.version] = live
            if m.file_objects and m.delete_objects:
                STEPS["versions_with_objects"] += 1
            STEPS["commits"] += 1

        @rule(n=st.integers(1, 60), rg=st.sampled_from([7, 16, 1000]))
        def append(self, n, rg):
            ids = list(range(self.next_id, self.next_id + n))
            self.next_id += n
            schema = self.log.latest().schema
            added, _ = self.schemas[max(self.model)]
            cols = {"id": ids, "v": [i * 3 for i in ids]}
            cols.update({f"a{k}": [i * 10 + k for i in ids] for k in range(1, added + 1)})
            data = pa.table(cols, schema=schema.to_arrow())
            [f] = write_data_files(self.storage, data, schema, row_group_size=rg)
            m = self.log.append([f])
            self.written_with.update(dict.fromkeys(ids, added))
            live = dict(self.live)
            live.update({i: (f.path, p) for p, i in enumerate(ids)})
            self._commit(m, live)

        @precondition(lambda self: self.schemas[max(self.model)][0] < ADDED_MAX)
        @rule()
        def add_column(self):
            added, vt = self.schemas[max(self.model)]
            m = self.log.alter(add={f"a{added + 1}": "int64"})
            assert m.operation == "ALTER" and m.schema.column(f"a{added + 1}").added_in == m.version
            self._commit(m, dict(self.live))
            self.schemas[m.version] = (added + 1, vt)
            STEPS["schema_changes"] += 1

        @precondition(lambda self: self.schemas[max(self.model)][1] == "int32")
        @rule()
        def widen(self):
            added, _ = self.schemas[max(self.model)]
            m = self.log.alter(widen={"v": "int64"})
            assert m.summary["widened_columns"] == [{"name": "v", "from": "int32", "to": "int64"}]
            self._commit(m, dict(self.live))
            self.schemas[m.version] = (added, "int64")
            STEPS["schema_changes"] += 1

        def _files(self):
            # Drawn by index in commit order: file names are random, draws must not depend on them.
            return self.log.state(self.log.latest()).entries()

        @precondition(lambda self: self.live)
        @rule(data=st.data())
        def delete_row_group(self, data):
            files = self._files()
            if not files:
                return
            f = files[data.draw(st.integers(0, len(files) - 1))]
            rg = data.draw(st.integers(0, f.row_group_count - 1))
            start = sum(f.row_group_rows[:rg])
            gone = set(range(start, start + f.row_group_rows[rg]))
            self._delete([RowGroupDelete(f.name, rg)], lambda i, key, p: key == f.path and p in gone)

        @precondition(lambda self: self.live)
        @rule(data=st.data())
        def delete_key_range(self, data):
            if not self.live:
                return
            holding = {k for k, _ in self.live.values()}
            files = [f for f in self._files() if f.path in holding]
            f = files[data.draw(st.integers(0, len(files) - 1))]
            lo = data.draw(st.integers(f.min["id"], f.max["id"]))
            hi = data.draw(st.integers(lo, f.max["id"]))
            self._delete([KeyRangeDelete(f.name, lo, hi)], lambda i, key, p: key == f.path and lo <= i <= hi)

        @precondition(lambda self: self.live)
        @rule(data=st.data(), relative=st.booleans(), many=st.booleans())
        def delete_positions(self, data, relative, many):
            files = self._files()
            if not files:
                return
            f = files[data.draw(st.integers(0, len(files) - 1))]
            if relative:
                rg = data.draw(st.integers(0, f.row_group_count - 1))
                n = f.row_group_rows[rg]
                start = sum(f.row_group_rows[:rg])
            else:
                rg, n, start = None, f.total_rows, 0
            k = n if many else data.draw(st.integers(1, min(n, 5)))
            pos = BitMap(data.draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=k)))
            gone = {start + p for p in pos}
            self._delete([PositionDelete(f.name, rg, pos)], lambda i, key, p: key == f.path and p in gone)

        def _delete(self, records, dead):
            m = self.log.delete(records)
            self._commit(m, {i: loc for i, loc in self.live.items() if not dead(i, *loc)})
            STEPS["deletes"] += 1

        @precondition(lambda self: self.log.latest().tombstone_count)
        @rule(threshold=st.sampled_from([0.01, 0.3, 1.0]), rg=st.sampled_from([8, 1000]), merge=st.booleans())
        def compaction(self, threshold, rg, merge):
            before = set(self.log.state(self.log.latest()).keys().to_pylist())
            m = compact(
                spark,
                self.storage.root,
                threshold=threshold,
                s3=s3,
                row_group_size=rg,
                small_tombstone_bytes=1 << 20 if merge else 0,
            )
            if m is None:
                STEPS["compactions_with_nothing_to_do"] += 1
                return
            assert m.operation == "COMPACT"
            after = set(self.log.state(m).keys().to_pylist())
            gone, new = before - after, after - before
            moved = {i for i, (key, _) in self.live.items() if key in gone}
            live = {i: loc for i, loc in self.live.items() if i not in moved}
            seen = []
            for path in sorted(new):
                ids = pq.read_table(pa.BufferReader(self.storage.get(path)), columns=["id"])["id"].to_pylist()
                seen += ids
                live.update({i: (path, p) for p, i in enumerate(ids)})
            # The new files hold exactly the live rows of the files they replace, once each.
            assert sorted(seen) == sorted(moved), "compaction lost, resurrected or copied rows"
            self._commit(m, live)
            STEPS["compactions"] += 1

        @precondition(lambda self: len(self.model) > 1)
        @rule(keep=st.integers(1, 3))
        def collect(self, keep):
            report = gc(self.storage.root, keep_versions=keep, grace=timedelta(0), s3=s3)
            assert report.kept_versions == sorted(self.model)[-keep:]
            for v in report.removed_versions:
                del self.model[v]
            self.collected += report.removed_versions
            # Exactly what the kept versions reference is left (no writer is in flight).
            refs = set()
            for v in self.model:
                mv = self.log.manifest(v)
                refs |= set(self.log.state(mv).keys().to_pylist())
                refs |= {to_table_key(t, self.storage.root, what="tombstone") for t in mv.tombstones}
                refs |= {r.path for r in (*mv.file_objects, *mv.delete_objects)}
            left = {i.key for d in (DATA_DIR, TOMBSTONE_DIR, META_DIR) for i in self.storage.list(d + "/")}
            assert left == refs
            STEPS["gcs"] += 1
            STEPS["versions_collected"] += len(report.removed_versions)

        @invariant()
        def collected_versions_are_refused(self):
            if not hasattr(self, "session") or not self.collected:
                return
            v = self.collected[-1]
            with pytest.raises(VersionNotFound, match=f"version {v} was garbage-collected"):
                self.session.sql(f"SELECT count(*) FROM t AS OF VERSION {v}")

        @invariant()
        def every_version_matches(self):
            if not hasattr(self, "session"):
                return
            lo, hi = self.next_id // 3, 2 * self.next_id // 3
            for v, live in self.model.items():
                added, vt = self.schemas[v]
                got = self.session.sql(f"SELECT * FROM t AS OF VERSION {v} ORDER BY id")
                names = ["id", "v"] + [f"a{k}" for k in range(1, added + 1)]
                assert got.column_names == names and str(got.schema.field("v").type) == vt, f"version {v}"
                want = [
                    {"id": i, "v": i * 3}
                    | {f"a{k}": (i * 10 + k if self.written_with[i] >= k else None) for k in range(1, added + 1)}
                    for i in sorted(live)
                ]
                assert got.to_pylist() == want, f"version {v}"
                # A selective query: SQL file pruning on versions without deletes.
                q = f"SELECT id FROM t AS OF VERSION {v} WHERE id BETWEEN {lo} AND {hi} ORDER BY id"
                assert self.session.sql(q).column("id").to_pylist() == [i for i in sorted(live) if lo <= i <= hi], q
            latest = max(self.model)
            scanned = self.session.scan("t", ["id"], version=latest)["id"].to_pylist()
            assert sorted(scanned) == sorted(self.model[latest])

        @invariant()
        def changes_match(self):
            if not hasattr(self, "session") or len(self.model) < 2:
                return
            latest, oldest = max(self.model), min(self.model)
            # Two ranges per step, both ends included: the newer half up to the
            # head, and from the oldest kept version to one before the head (the
            # oldest's own change needs the one before it: after it, or from 0).
            first = oldest + 1 if oldest else 0
            for a, b in ((max(latest // 2, first), latest), (first, latest - 1)):
                if a > b:
                    continue
                got = self.session.changes("t", a, b).to_pylist()
                assert {r["_commit_version"] for r in got} <= set(range(a, b + 1))
                for v in range(a, b + 1):
                    before = set(self.model[v - 1]) if v else set()
                    ins = sorted(r["id"] for r in got if r["_commit_version"] == v and r["_change_type"] == "insert")
                    dels = sorted(r["id"] for r in got if r["_commit_version"] == v and r["_change_type"] == "delete")
                    assert ins == sorted(set(self.model[v]) - before), (a, b, v)
                    assert dels == sorted(before - set(self.model[v])), (a, b, v)

    return History


@pytest.mark.spark
def test_random_histories(storage_root, backend, spark, request, monkeypatch):
    s3 = request.getfixturevalue("s3_server").config if backend == "s3" else None
    # Format version 2 with tiny fold and merge thresholds: sixteen steps then
    # fold, merge and rewrite metadata objects (compaction removes from them) all the time.
    monkeypatch.setattr(fold, "FILES_INLINE_MAX", 2)
    monkeypatch.setattr(fold, "DELETES_INLINE_MAX", 1)
    monkeypatch.setattr(fold, "FANOUT", 2)
    monkeypatch.setattr(fold, "OBJECT_TARGET", 4)
    machine = make_machine(storage_root, s3, spark)
    examples = EXAMPLES if backend == "local" else max(4, EXAMPLES // 2)
    STEPS.clear()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=16,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            # CI runs the same histories every time (its asserts below hold for
            # them); a soak draws new ones.
            derandomize=not SOAK,
            database=None if not SOAK else settings.default.database,
        ),
    )
    print(f"\nrandom histories on {backend}: {examples} histories; {dict(STEPS)}")
    assert STEPS["commits"] > 0 and STEPS["compactions"] > 0 and STEPS["versions_collected"] > 0
    assert STEPS["versions_with_objects"] > 0 and STEPS["schema_changes"] > 0


pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
