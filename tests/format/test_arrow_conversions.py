"""castsql.format.arrays builds the arrays pa.array builds, and reads back the
values to_pylist gives, without pandas."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from castsql.format.arrays import build, from_numpy, py_values, scalar, to_numpy

UTC5 = dt.timezone(dt.timedelta(hours=5))
CASES = [
    ([1, None, 3], pa.int64()),
    ([1, -2], pa.int32()),
    ([2**40], pa.uint64()),
    ([1.5, None, 2], pa.float64()),
    ([1.5], pa.float32()),
    ([1e300, -(2**24), 2**24], pa.float32()),
    ([-(2**53), 2**53], pa.float64()),
    ([2**64 - 1, 0], pa.uint64()),
    ([-(2**63), 2**63 - 1], pa.int64()),
    (["a", None, "héllo", ""], pa.string()),
    (["x"], pa.large_string()),
    ([True, None, False], pa.bool_()),
    ([dt.datetime(2024, 1, 2, 3, 4, 5, 678901), None], pa.timestamp("us")),
    ([dt.datetime(2024, 1, 2, 3, 4, 5, 678901, tzinfo=UTC5)], pa.timestamp("us", tz="UTC")),
    ([dt.datetime(2024, 1, 2, 3, 4, 5, 678901)], pa.timestamp("ns")),
    ([dt.datetime(1969, 12, 31, 23, 59, 59, 1)], pa.timestamp("ms")),
    ([dt.date(2024, 2, 29), None, dt.date(1900, 1, 1)], pa.date32()),
    ([[1, 2], None, [], [3]], pa.list_(pa.int64())),
    ([], pa.int64()),
    ([None, None], pa.string()),
]


@pytest.mark.parametrize(("values", "type_"), CASES, ids=[str(t) for _, t in CASES])
def test_built_arrays_equal_pa_array(values, type_):
    got = build(values, type_)
    got.validate(full=True)
    assert got.equals(pa.array(values, type_))


@pytest.mark.parametrize(
    ("values", "type_"),
    [([2**70], pa.int64()), ([1.5], pa.int64()), (["x"], pa.int64()), ([300], pa.int8()), ([-1], pa.uint8()),
     ([2**63], pa.int64()), ([2**70], pa.float64()), ([2**53 + 1], pa.float64()),
     ([-(2**60)], pa.float32()), ([2**24 + 1], pa.float32()),
     ([1], pa.string()), ([1], pa.bool_()), (["2024-01-01"], pa.date32()), ([True], pa.int64())],
)  # fmt: skip
def test_values_pa_array_would_refuse_are_left_to_it(values, type_):
    with pytest.raises((TypeError, ValueError, OverflowError)):
        build(values, type_)


@given(st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))))
def test_any_int64_values(values):
    assert build(values, pa.int64()).equals(pa.array(values, pa.int64()))


@given(st.lists(st.one_of(st.none(), st.text())))
def test_any_strings(values):
    assert build(values, pa.string()).equals(pa.array(values, pa.string()))


@given(st.lists(st.one_of(st.none(), st.datetimes(timezones=st.sampled_from([None, dt.UTC, UTC5])))))
def test_any_timestamps(values):
    t = pa.timestamp("us", tz="UTC")
    assert build(values, t).equals(pa.array(values, t))


def test_numpy_round_trips_and_scalars():
    a = np.arange(10, dtype=np.int64)
    assert to_numpy(from_numpy(a).slice(3, 4)).tolist() == [3, 4, 5, 6]
    assert to_numpy(pa.chunked_array([from_numpy(a[:2]), from_numpy(a[5:7])])).tolist() == [0, 1, 5, 6]
    assert from_numpy(np.array([True, False, True])).to_pylist() == [True, False, True]
    assert scalar(7, pa.int32()).equals(pa.scalar(7, pa.int32()))
    assert scalar("k", pa.string()).equals(pa.scalar("k"))


def _same(a: list, b: list) -> bool:
    return repr(a) == repr(b)  # NaN equals NaN, and -0.0 is not 0.0


@pytest.mark.parametrize(("values", "type_"), CASES, ids=[str(t) for _, t in CASES])
def test_values_read_back_as_to_pylist_reads_them(values, type_):
    few, many = pa.array(values, type_), pa.array(values * 9, type_)  # arrays of a few values go to to_pylist
    for a in (few, many):
        for part in (a, a.slice(1), a.slice(0, max(len(a) - 1, 0)), pa.chunked_array([a, a.slice(1)], type_)):
            assert _same(py_values(part), part.to_pylist())


@given(
    st.one_of(
        st.tuples(st.lists(st.integers(-(2**63), 2**63 - 1), min_size=8), st.just(pa.int64())),
        st.tuples(st.lists(st.integers(0, 2**64 - 1), min_size=8), st.just(pa.uint64())),
        st.tuples(st.lists(st.floats(), min_size=8), st.just(pa.float64())),
        st.tuples(st.lists(st.floats(width=32), min_size=8), st.just(pa.float32())),
        st.tuples(st.lists(st.text(), min_size=8), st.sampled_from([pa.string(), pa.large_string()])),
        st.tuples(st.lists(st.lists(st.integers(-5, 5), max_size=4), min_size=8), st.just(pa.list_(pa.int64()))),
    ),
    st.integers(0, 3),
)
def test_any_values_without_nulls_read_back_as_to_pylist_reads_them(case, cut):
    values, type_ = case
    a = pa.array(values, type_).slice(min(cut, len(values)))
    assert _same(py_values(a), a.to_pylist())
