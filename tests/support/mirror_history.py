"""Random histories for the mirror tests: a table written by CastSQL through
every kind of change, the mirror brought up to date now and then on the way."""

from __future__ import annotations

import random
from collections.abc import Callable

import pyarrow as pa

import castsql
from castsql.format import KeyRangeDelete, RowGroupDelete, TableLog, write_data_files
from castsql.storage import open_storage


def sorted_rows(rows: list[dict]) -> list[dict]:
    return sorted(rows, key=lambda r: (r["id"] is None, r["id"]))


def random_history(
    uri: str,
    seed: int,
    steps: int,
    s3=None,
    export: Callable | None = None,
    properties: dict[str, str] | None = None,
    halfway: dict[str, str] | None = None,
) -> tuple[castsql.Table, list[int]]:
    """A table, written by CastSQL through every kind of change; the versions
    at which the mirror was brought up to date on the way (so the incremental
    path runs too). ``properties``: the table's at creation; ``halfway``:
    properties set after half the steps."""
    rng = random.Random(seed)
    castsql.write_table(uri, pa.table({"id": pa.array(range(40), pa.int64()), "v": [f"v{i}" for i in range(40)]}),
                        primary_key="id", s3=s3, properties=properties)  # fmt: skip
    t = castsql.open(uri, s3=s3)
    log = TableLog(open_storage(uri, s3=s3))
    next_id, exported, added = 1000, [], False
    for step in range(steps):
        if halfway and step == steps // 2:
            t.set_properties(halfway)
        op = rng.choice(["append", "append_rg", "delete", "update", "merge", "key_range", "row_group", "compact",
                         "add_column", "export"])  # fmt: skip
        live = [r["id"] for r in t.to_arrow(columns=["id"]).to_pylist()]
        if op == "append":
            n = rng.randint(1, 30)
            cols = {"id": pa.array(range(next_id, next_id + n), pa.int64()), "v": [f"a{i}" for i in range(n)]}
            t.append(pa.table(cols))
            next_id += n
        elif op == "append_rg":  # a file of several row groups, for whole-row-group tombstones
            head = log.latest()
            n = 40
            data = pa.table({"id": pa.array(range(next_id, next_id + n), pa.int64()), "v": ["g"] * n})
            data = data.append_column("note", pa.nulls(n, pa.string())) if added else data
            log.append(write_data_files(log.storage, data, head.schema, row_group_size=10))
            next_id += n
        elif op == "delete" and live:
            t.delete(f"id = {rng.choice(live)} OR id % {rng.randint(5, 13)} = 0")
        elif op == "update" and live:
            t.update(set={"v": "v || 'u'"}, where=f"id < {rng.choice(live)}")
        elif op == "merge" and live:
            keys = [*rng.sample(live, min(len(live), 3)), next_id]
            next_id += 1
            src = pa.table({"id": pa.array(keys, pa.int64()), "v": ["m"] * len(keys)})
            src = src.append_column("note", pa.array(["n"] * len(keys))) if added else src
            t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()
        elif op in ("key_range", "row_group"):
            head = log.latest()
            entries = [f for f in log.state(head).entries() if f.row_group_count > (1 if op == "row_group" else 0)]
            if entries:
                f = rng.choice(entries)
                if op == "row_group":
                    log.delete([RowGroupDelete(f.name, rng.randrange(f.row_group_count))])
                else:
                    lo = rng.choice(live) if live else 0
                    log.delete([KeyRangeDelete(f.name, lo, lo + rng.randint(0, 20))])
        elif op == "compact":
            t.compact(sort_by="id")
        elif op == "add_column" and not added:
            t.add_columns({"note": "string"})
            added = True
        elif op == "export" and export is not None:
            exported.append(export(log).latest)
        t = castsql.open(uri, s3=s3)
    return t, exported


def race_exporters(export: Callable, uri: str, threads: int = 3) -> list[str]:
    """``export`` of the table at ``uri`` by ``threads`` exporters at once,
    each on its own log: per exporter, "done" or the conflict it lost with.
    Any other error is raised here (a thread's own would be lost)."""
    import threading

    from castsql.errors import CommitConflict

    outcomes: list[str] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            export(TableLog(open_storage(uri)))
            outcomes.append("done")
        except CommitConflict as e:
            outcomes.append(str(e))
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return outcomes


class MirrorReaders:
    """A table's mirror read by other engines' readers: each name in
    ``READERS`` is a method returning the rows at a version, sorted."""

    READERS: tuple[str, ...] = ()

    def check(self, table: castsql.Table, versions) -> int:
        """Assert every reader returns CastSQL's rows at each of ``versions``; returns the reads checked."""
        checked = 0
        for v in versions:
            want = sorted_rows(table.at(v).to_arrow().to_pylist())
            for name in self.READERS:
                got = getattr(self, name)(v)
                assert got == want, f"{name} at version {v}: {len(got)} rows, CastSQL has {len(want)}"
                checked += 1
        return checked
