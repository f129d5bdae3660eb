"""Fuzzing the parsers of everything a table holds, and the SQL rewriter:
arbitrary input gives a result or the project's own clear error, never a
crash, never a hang."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_format import SEED_MANIFEST

from castsql.engine.sql.rewrite import SQLRewriteError, TimeTravel, rewrite
from castsql.errors import FormatError
from castsql.format.manifest import parse_manifest
from castsql.format.metadata import parse_pointer
from castsql.format.tombstone import parse_tombstones

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)


@FUZZ
@given(st.binary(max_size=300))
def test_manifest_parser_bytes(data):
    try:
        parse_manifest(data, "m.json")
    except FormatError as e:
        assert "m.json" in str(e)


@FUZZ
@given(st.sampled_from(sorted(SEED_MANIFEST)), json_values)
def test_manifest_parser_mutated_fields(key, value):
    doc = json.loads(json.dumps(SEED_MANIFEST))
    doc[key] = value
    try:
        parse_manifest(json.dumps(doc).encode(), "m.json")
    except FormatError as e:
        assert "m.json" in str(e)


@FUZZ
@given(st.sampled_from(["path", "size_bytes", "row_group_count", "total_rows", "min", "max", "row_group_rows"]),
       json_values)  # fmt: skip
def test_manifest_parser_mutated_data_file(key, value):
    doc = json.loads(json.dumps(SEED_MANIFEST))
    doc["data_files"][0][key] = value
    try:
        parse_manifest(json.dumps(doc).encode(), "m.json")
    except FormatError as e:
        assert "m.json" in str(e)


@FUZZ
@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_pointer_parser(data):
    try:
        v = parse_pointer(data, "_latest_manifest")
        assert isinstance(v, int) and v >= 0
    except FormatError as e:
        assert "_latest_manifest" in str(e)


tomb_lines = st.dictionaries(
    st.sampled_from(["file", "row_group", "pk_min", "pk_max", "deleted_rows", "deleted_rows_bitmap", "x"]),
    json_values,
    max_size=4,
).map(lambda d: json.dumps(d))


@FUZZ
@given(st.lists(tomb_lines | st.text(max_size=30), max_size=5) | st.binary(max_size=200).map(lambda b: [b]))
def test_tombstone_parser(lines):
    data = b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines)
    try:
        parse_tombstones(data, "t.del")
    except FormatError as e:
        assert "t.del" in str(e)


SQL_WORDS = st.sampled_from(
    ["SELECT", "*", "FROM", "t", "u", "AS", "OF", "VERSION", "TIMESTAMP", "AT", "(", ")", "=>", "3", "'2025-01-01'",
     "JOIN", "ON", "a", ".", ",", "--", "/*", "*/", "'", '"', "FOR", "SYSTEM_TIME", "WHERE", "x", "=", "1.5", "\n"]
)  # fmt: skip


def _name(ref: TimeTravel) -> str:
    return "tt_view"


@FUZZ
@given(st.lists(SQL_WORDS, max_size=25).map(" ".join))
def test_rewriter_never_crashes(sql):
    try:
        out, refs = rewrite(sql, _name)
    except SQLRewriteError:
        return
    if not refs:
        assert out == sql  # nothing to rewrite: the text is untouched
    else:
        assert out.count("tt_view") == len(refs)


@FUZZ
@given(st.text(max_size=80))
def test_rewriter_on_arbitrary_text(sql):
    try:
        out, refs = rewrite(sql, _name)
    except SQLRewriteError:
        return
    if not refs:
        assert out == sql
