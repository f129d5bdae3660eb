"""Randomized histories against an independent model.

A Hypothesis state machine applies random appends and deletes of every
tombstone kind (row groups, key ranges, positions as lists and bitmaps,
file- and row-group-relative) to a real table, and after every step checks
that EVERY kept version, read through SQL ``AS OF VERSION`` and through the
Arrow scan API, holds exactly the model's rows, and that the changes between
two versions equal the model's difference. CASTSQL_SOAK_EXAMPLES raises the
budget for a long soak (it prints how many steps ran).
"""

from __future__ import annotations

import os
import uuid

import pyarrow as pa
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
from castsql.format import KeyRangeDelete, PositionDelete, RowGroupDelete, TableLog, write_data_files
from castsql.storage import open_storage

SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.int64())])
EXAMPLES = int(os.environ.get("CASTSQL_SOAK_EXAMPLES", "8"))
STEPS = {"n": 0}


def make_machine(root: str, s3):
    class History(RuleBasedStateMachine):
        @initialize()
        def create(self):
            self.storage = open_storage(f"{root}/{uuid.uuid4().hex[:8]}/t", s3=s3)
            self.log = TableLog.create(self.storage, SCHEMA, primary_key="id")
            self.session = Session(self.storage.root, s3=s3)
            self.next_id = 0
            # model: version -> {id: file key, position}; the latest version's files
            self.model: dict[int, dict[int, tuple[str, int]]] = {0: {}}

        def teardown(self):
            if hasattr(self, "session"):
                self.session.close()

        @property
        def live(self) -> dict[int, tuple[str, int]]:
            return self.model[max(self.model)]

        def _commit(self, m, live):
            assert m.version == max(self.model) + 1
            self.model[m.version] = live
            STEPS["n"] += 1

        @rule(n=st.integers(1, 60), rg=st.sampled_from([7, 16, 1000]))
        def append(self, n, rg):
            ids = list(range(self.next_id, self.next_id + n))
            self.next_id += n
            [f] = write_data_files(self.storage, pa.table({"id": ids, "v": [i * 3 for i in ids]}), row_group_size=rg)
            m = self.log.append([f])
            live = dict(self.live)
            live.update({i: (f.path, p) for p, i in enumerate(ids)})
            self._commit(m, live)

        def _files(self):
            # Drawn by index in commit order: file names are random, draws must not depend on them.
            return list(self.log.latest().data_files)

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
            self._delete([RowGroupDelete(f.name, rg)], lambda key, p: key == f.path and p in gone)

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
            self._delete(
                [KeyRangeDelete(f.name, lo, hi)],
                lambda key, p, f=f, lo=lo, hi=hi: key == f.path and lo <= self._id_at(key, p) <= hi,
            )

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
            self._delete([PositionDelete(f.name, rg, pos)], lambda key, p: key == f.path and p in gone)

        def _id_at(self, key, p):
            for i, (k, q) in self.all_rows.items():
                if k == key and q == p:
                    return i
            return None

        @property
        def all_rows(self):
            out = {}
            for live in self.model.values():
                out.update(live)
            return out

        def _delete(self, records, dead):
            m = self.log.delete(records)
            self._commit(m, {i: loc for i, loc in self.live.items() if not dead(*loc)})

        @invariant()
        def every_version_matches(self):
            if not hasattr(self, "session"):
                return
            for v, live in self.model.items():
                got = self.session.sql(f"SELECT id, v FROM t AS OF VERSION {v} ORDER BY id").to_pylist()
                assert got == [{"id": i, "v": i * 3} for i in sorted(live)], f"version {v}"
            latest = max(self.model)
            scanned = self.session.scan("t", ["id"], version=latest)["id"].to_pylist()
            assert sorted(scanned) == sorted(self.model[latest])

        @invariant()
        def changes_match(self):
            if not hasattr(self, "session") or len(self.model) < 2:
                return
            latest = max(self.model)
            a = latest // 2
            got = self.session.changes("t", a, latest).to_pylist()
            for v in range(a + 1, latest + 1):
                ins = {r["id"] for r in got if r["_commit_version"] == v and r["_change_type"] == "insert"}
                dels = {r["id"] for r in got if r["_commit_version"] == v and r["_change_type"] == "delete"}
                assert ins == set(self.model[v]) - set(self.model[v - 1])
                assert dels == set(self.model[v - 1]) - set(self.model[v])

    return History


def test_random_histories(storage_root, backend, request):
    s3 = request.getfixturevalue("s3_server").config if backend == "s3" else None
    machine = make_machine(storage_root, s3)
    examples = EXAMPLES if backend == "local" else max(3, EXAMPLES // 3)
    STEPS["n"] = 0
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=12,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )
    print(f"\nrandom histories on {backend}: {examples} histories, {STEPS['n']} commits checked")
    assert STEPS["n"] > 0


pytestmark = pytest.mark.filterwarnings("ignore::hypothesis.errors.NonInteractiveExampleWarning")
