"""A table streamed into with both mirrors on (issue 53): CDC batches and
merges, the table's automatic compaction in between. The mirrors stay as
small as the table (a bounded number of Iceberg manifests and delete files,
Delta checkpoints) and every reader reads exactly CastSQL's rows at every
version, compacted ones included."""

from __future__ import annotations

import dataclasses
import json
import os
import random

import duckdb
import pyarrow as pa
import pytest
from mirror_history import sorted_rows
from test_mirror_delta import Readers as DeltaReaders
from test_mirror_iceberg import Readers as IcebergReaders

import castsql
from castsql.engine.duckdb.duck import load_extension
from castsql.format import TableLog
from castsql.mirror import iceberg
from castsql.mirror.iceberg import read_metadata
from castsql.mirror.iceberg_avro import FILE_PATH_ID
from castsql.snapshot import resolve
from castsql.storage import open_storage

os.environ.setdefault("POLARS_ICEBERG_PLANNER", "pyiceberg")

STREAM = {
    "castsql.mirror.delta": "true",
    "castsql.mirror.iceberg": "true",
    "castsql.autoCompact": "true",
    "castsql.autoCompact.minNumFiles": "4",
}


def _listed(uri: str, v: int) -> tuple[int, int, list[str], list[str | None]]:
    """Iceberg version ``v``'s data manifests, delete manifests, live data
    files, and for each live delete file the one data file its ``file_path``
    bounds scope it to (None: unscoped)."""
    con = duckdb.connect()
    load_extension(con, "avro")
    snap = next(s for s in read_metadata(open_storage(uri), v)["snapshots"] if s["snapshot-id"] == v)
    listed = con.execute(f"SELECT manifest_path, content FROM read_avro('{snap['manifest-list']}')").fetchall()
    data: list[str] = []
    scopes: list[str | None] = []
    for path, content in listed:
        live = con.execute(
            f"SELECT data_file.file_path, data_file.lower_bounds, data_file.upper_bounds "
            f"FROM read_avro('{path}') WHERE status != 2"
        ).fetchall()
        if content == 0:
            data += [r[0] for r in live]
            continue
        for _, lower, upper in live:
            lo, hi = (lower or {}).get(FILE_PATH_ID), (upper or {}).get(FILE_PATH_ID)
            scopes.append(lo.decode() if lo is not None and lo == hi else None)
    n_data = sum(1 for _, c in listed if c == 0)
    return n_data, len(listed) - n_data, data, scopes


def _one_per_data_file(uri: str, v: int) -> int:
    """Checks that version ``v`` lists at most one delete file per live data
    file, each scoped to it, and few manifests; returns the delete files."""
    n_data, n_deletes, data, scopes = _listed(uri, v)
    # Manifests merged as the table goes, not one per version.
    assert n_data <= iceberg.MANIFESTS_MERGED_AT + 1, f"version {v}: {n_data} data manifests"
    # A few delete files: one delete manifest lists them all.
    most = 1 if len(scopes) <= iceberg.DELETES_IN_ONE_MANIFEST else iceberg.MANIFESTS_MERGED_AT + 1
    assert n_deletes <= most, f"version {v}: {n_deletes} delete manifests"
    assert None not in scopes, f"version {v}: a delete file of several data files"
    assert len(set(scopes)) == len(scopes) and set(scopes) <= set(data), f"version {v}: {scopes} over {data}"
    return len(scopes)


def _stream(uri: str, batches: int, seed: int, forget: bool = False) -> castsql.Table:
    """``batches`` CDC batches and merges of a few rows (updates, deletes, new
    keys) into a table with both mirrors on. ``forget``: now and then the
    process drops the Iceberg mirror state it holds, as a new process would."""
    rng = random.Random(seed)
    base = pa.table({"id": pa.array(range(300), pa.int64()), "v": [f"v{i}" for i in range(300)]})
    castsql.write_table(uri, base, primary_key="id", properties=STREAM)
    t = castsql.open(uri)
    live, next_id = set(range(300)), 1000
    for b in range(batches):
        old = rng.sample(sorted(live), 4)
        new = list(range(next_id, next_id + 3))
        next_id += 3
        if b % 2:
            ops = ["u", "u", "d", "u"] + ["i"] * len(new)
            src = pa.table({"id": pa.array(old + new, pa.int64()), "v": [f"b{b}"] * 7, "op": ops})
            t.apply_cdc(src, key="id", op_column="op")
            live -= {old[2]}
        else:
            src = pa.table({"id": pa.array(old + new, pa.int64()), "v": [f"m{b}"] * 7})
            t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()
        live |= set(new)
        if forget and b % 5 == 4:
            iceberg._HELD.take(t.uri)
    return castsql.open(uri)


def test_a_streamed_table_keeps_its_mirrors_small_and_every_reader_reads_its_rows(tmp_path):
    uri = str(tmp_path / "t")
    t = _stream(uri, 40, seed=1)
    history = t.history().to_pylist()
    latest = history[-1]["version"]
    compacted = [h["version"] for h in history if h["operation"] == "COMPACT"]
    st = open_storage(uri)
    log = TableLog(st)
    assert compacted, "the table's automatic compaction never ran"
    for v in range(1, latest + 1):
        _one_per_data_file(uri, v)
        data = _listed(uri, v)[2]
        # The mirror lists exactly the table's files: a compaction's rewrite is carried over.
        assert sorted(data) == sorted(st.uri(k) for k in (f.key for f in resolve(log, v).files)), f"version {v}"
    from deltalake import DeltaTable

    for v in compacted:  # Delta's live files too: the compaction's, not its inputs
        files = sorted(f.key for f in resolve(log, v).files)
        assert sorted(DeltaTable(uri, version=v).file_uris()) == [f"{uri}/{k}" for k in files], f"version {v}"
    # A Delta reader replays a checkpoint and the few commits after it, not every commit.
    last = json.loads(st.get("_delta_log/_last_checkpoint"))["version"]
    assert latest - last < 20
    versions = sorted({1, latest, *compacted, *(c - 1 for c in compacted), *range(2, latest, 7)})
    assert IcebergReaders(uri).check(t, versions) == 3 * len(versions)
    assert DeltaReaders(uri).check(t, versions) == 3 * len(versions)


@pytest.mark.parametrize("seed", [2, 3])
def test_a_process_continuing_the_mirror_merges_its_delete_files_the_same(tmp_path, seed):
    """A process that did not write the mirror's last version (it reads the
    state back) keeps one delete file per data file: every reader still reads
    CastSQL's rows at every version."""
    uri = str(tmp_path / "t")
    t = _stream(uri, 24, seed=seed, forget=True)
    latest = t.history().to_pylist()[-1]["version"]
    assert sum(_one_per_data_file(uri, v) for v in range(1, latest + 1)) > 0
    want = sorted_rows(t.to_arrow().to_pylist())
    assert len(want) > 300
    assert IcebergReaders(uri).check(t, range(1, latest + 1)) == 3 * latest


def test_polars_reads_a_streamed_mirror_natively_and_exactly(tmp_path):
    """Every delete file names its one data file, so polars reads the mirror
    with its own Parquet reader (``reader_override="native"`` raises where
    it would fall back to PyIceberg), the key range pruned by its statistics
    as it likes, and its rows are CastSQL's at every version."""
    import polars as pl
    from pyiceberg.table import StaticTable

    uri = str(tmp_path / "t")
    t = _stream(uri, 16, seed=5)
    latest = t.history().to_pylist()[-1]["version"]
    for v in range(1, latest + 1):
        table = StaticTable.from_metadata(f"{uri}/{iceberg.metadata_key(v)}")
        got = pl.scan_iceberg(table, reader_override="native").collect().to_dicts()
        assert sorted_rows(got) == sorted_rows(t.at(v).to_arrow().to_pylist()), f"version {v}"


def test_a_mirror_of_delete_files_over_several_data_files_is_continued_one_per_file(tmp_path, monkeypatch):
    """A version 2 mirror written before delete files were one per data file
    (their ``file_path`` bounds unset: a reader applies each to every data
    file it names) is continued by a new process: its next version writes
    every data file's deletes anew, one file each, and drops the old ones."""
    uri = str(tmp_path / "t")
    real = iceberg._delete_file_entries

    def unscoped(*args):
        return [dataclasses.replace(e, referenced=None) for e in real(*args)]

    monkeypatch.setattr(iceberg, "_delete_file_entries", unscoped)
    mirrors = {k: v for k, v in STREAM.items() if k.startswith("castsql.mirror.")}
    base = pa.table({"id": pa.array(range(300), pa.int64()), "v": [f"v{i}" for i in range(300)]})
    castsql.write_table(uri, base, primary_key="id", properties=mirrors)
    t = castsql.open(uri)
    t.delete("id = 1")
    src = pa.table({"id": pa.array([2, 3, 1000, 1001], pa.int64()), "v": ["a", "b", "c", "d"]})
    t.merge(src, on="id").when_matched_update_all().when_not_matched_insert_all().execute()
    t.delete("id = 1000")
    assert _listed(uri, t.history().to_pylist()[-1]["version"])[3] == [None, None]
    monkeypatch.setattr(iceberg, "_delete_file_entries", real)
    iceberg._HELD.take(t.uri)  # a new process: the state read back
    t = castsql.open(uri)
    t.delete("id = 5")
    latest = t.history().to_pylist()[-1]["version"]
    assert _one_per_data_file(uri, latest) > 0
    assert IcebergReaders(uri).check(t, range(1, latest + 1)) == 3 * latest
