"""NumPy and Arrow conversions that never import pandas.

pyarrow imports pandas (when installed) the first time it converts Python or
NumPy values — ``pa.array``, ``pa.scalar``, ``Array.to_numpy``, a compute
call given a Python number — to check whether they are pandas objects. That
import costs ~0.3 s, as much as importing CastSQL itself, and a query that
never sees a DataFrame paid it in every fresh process (the shell's ``-c``,
scripts, the first query of an audit). The read path converts through these
instead; a user's own ``to_pandas`` still imports it as before.

Example::

    >>> import numpy as np
    >>> from_numpy(np.arange(3)).to_pylist(), to_numpy(from_numpy(np.arange(3))).tolist()
    ([0, 1, 2], [0, 1, 2])
    >>> scalar(0, pa.int64()).as_py()
    0
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Sequence
from datetime import UTC, date, datetime
from typing import Any

import numpy as np
import pyarrow as pa


def from_numpy(a: np.ndarray, type: pa.DataType | None = None) -> pa.Array:
    """A one-dimensional NumPy array of numbers or booleans as an Arrow array
    without nulls (``type``: the Arrow type of the same width, e.g. a timestamp
    for int64 microseconds)."""
    a = np.ascontiguousarray(a)
    if a.dtype == np.bool_:
        return pa.Array.from_buffers(pa.bool_(), len(a), [None, pa.py_buffer(np.packbits(a, bitorder="little"))])
    t = pa.from_numpy_dtype(a.dtype) if type is None else type
    return pa.Array.from_buffers(t, len(a), [None, pa.py_buffer(a)])


def to_numpy(a: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """The values of a fixed-width numeric Arrow array without nulls, as NumPy
    (zero-copy for one chunk)."""
    if isinstance(a, pa.ChunkedArray):
        if a.num_chunks == 1:
            return to_numpy(a.chunk(0))
        return np.concatenate([to_numpy(c) for c in a.chunks]) if a.num_chunks else np.empty(0, _dtype(a.type))
    if a.null_count:
        raise ValueError("to_numpy: the array has nulls")
    dtype = _dtype(a.type)
    buf = a.buffers()[1]
    if buf is None:
        return np.empty(0, dtype)
    return np.frombuffer(buf, dtype=dtype, count=len(a), offset=a.offset * dtype.itemsize)


_FEW = 8  # values to_pylist reads as fast as the buffers are taken apart (one entry of a part, looked up)


def py_values(a: pa.Array | pa.ChunkedArray) -> list[Any]:
    """``a.to_pylist()``: for integers, floats, strings and lists of integers
    without nulls read from the buffers, a twentieth of the time (pyarrow
    builds a scalar per value; ``Array.to_numpy`` would import pandas).
    Every other array, and one with nulls, goes to ``to_pylist``."""
    if isinstance(a, pa.ChunkedArray):
        if a.num_chunks != 1:
            return [v for c in a.chunks for v in py_values(c)]
        a = a.chunk(0)
    t = a.type
    if len(a) < _FEW or a.null_count:
        return [None] * len(a) if a.null_count == len(a) else a.to_pylist()
    if pa.types.is_integer(t) or pa.types.is_float32(t) or pa.types.is_float64(t):
        return to_numpy(a).tolist()
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        width = np.int64 if pa.types.is_large_string(t) else np.int32
        _, offsets, data = a.buffers()
        ends = np.frombuffer(offsets, dtype=width, count=len(a) + 1, offset=a.offset * np.dtype(width).itemsize)
        lo, hi = int(ends[0]), int(ends[-1])  # a slice's bytes only: one entry of a large object is read alone
        text = data[lo:hi].to_pybytes() if data is not None else b""
        at = (ends - lo).tolist()
        return [text[i:j].decode() for i, j in itertools.pairwise(at)]
    if pa.types.is_list(t) and pa.types.is_integer(t.value_type):
        ends = to_numpy(a.offsets)  # into the whole child array, a slice's too
        lo, hi = int(ends[0]), int(ends[-1])
        child = a.values.slice(lo, hi - lo)
        if not child.null_count:
            values = to_numpy(child).tolist()
            return [values[i:j] for i, j in itertools.pairwise((ends - lo).tolist())]
    return a.to_pylist()


def scalar(value: Any, type: pa.DataType) -> pa.Scalar:
    """``value`` as an Arrow scalar of ``type`` (as :func:`py_array`)."""
    return py_array([value], type)[0]


def py_array(values: Sequence[Any], type: pa.DataType) -> pa.Array:
    """Python values (None for null) as an Arrow array of ``type``, as
    ``pa.array(values, type)`` makes it. Until something has imported pandas,
    numbers, booleans, strings, dates, timestamps (an aware ``datetime`` as
    its UTC instant) and lists of integers are built here, without it; any
    other type, or a value ``pa.array`` would refuse, goes to ``pa.array``."""
    if "pandas" in sys.modules:
        return pa.array(values, type)  # nothing to save: its C conversion is faster
    try:
        return build(values, type)
    except (TypeError, ValueError, OverflowError):
        return pa.array(values, type)  # pa.array's own error, or its result


def build(values: Sequence[Any], type: pa.DataType) -> pa.Array:
    """:func:`py_array`'s own conversion (TypeError, ValueError or
    OverflowError for a type or value it does not take)."""
    n = len(values)
    valid = [v is not None for v in values]
    present = [v for v in values if v is not None]
    mask = None if len(present) == n else pa.py_buffer(np.packbits(np.array(valid, dtype=bool), bitorder="little"))
    if pa.types.is_string(type) or pa.types.is_large_string(type):
        if not all(isinstance(v, str) for v in present):
            raise TypeError("not all strings")
        data = [v.encode() if v is not None else b"" for v in values]
        offsets = np.zeros(n + 1, dtype=np.int64 if pa.types.is_large_string(type) else np.int32)
        np.cumsum([len(d) for d in data], out=offsets[1:])
        return pa.Array.from_buffers(type, n, [mask, pa.py_buffer(offsets), pa.py_buffer(b"".join(data))])
    if pa.types.is_boolean(type):
        if not all(isinstance(v, bool) for v in present):
            raise TypeError("not all booleans")
        bits = np.packbits(np.array([v is True for v in values], dtype=bool), bitorder="little")
        return pa.Array.from_buffers(type, n, [mask, pa.py_buffer(bits)])
    if pa.types.is_timestamp(type) or pa.types.is_date32(type):
        ticks = [_ticks(v, type) if v is not None else None for v in values]
        return build(ticks, pa.int64() if pa.types.is_timestamp(type) else pa.int32()).view(type)
    if pa.types.is_integer(type) or pa.types.is_floating(type):
        whole = pa.types.is_integer(type)
        if not all(isinstance(v, int) if whole else isinstance(v, int | float) for v in present) or any(
            isinstance(v, bool) for v in present
        ):
            raise TypeError("not all numbers")
        # Bounds checked here, not left to NumPy (1.x wraps an integer out of
        # range): as pa.array, an integer type takes only what it holds, a
        # float type only integers it holds exactly (|v| <= 2**mantissa bits).
        ints = [v for v in present if isinstance(v, int)]
        if whole:
            lo, hi = int(np.iinfo(_dtype(type)).min), int(np.iinfo(_dtype(type)).max)
        else:
            hi = 2 ** {16: 11, 32: 24, 64: 53}[type.bit_width]
            lo = -hi
        if ints and (min(ints) < lo or max(ints) > hi):
            raise OverflowError(f"an integer out of the range of {type}")
        with np.errstate(over="ignore"):  # a float past float32's range is inf, as pa.array makes it
            numbers = np.array([v if v is not None else 0 for v in values], dtype=_dtype(type))
        return pa.Array.from_buffers(type, n, [mask, pa.py_buffer(numbers)])
    if pa.types.is_list(type) and pa.types.is_integer(type.value_type):
        if not all(isinstance(v, list | tuple) for v in present):
            raise TypeError("not all lists")
        offsets = np.zeros(n + 1, dtype=np.int32)
        np.cumsum([len(v) if v is not None else 0 for v in values], out=offsets[1:])
        inner = build([x for v in present for x in v], type.value_type)
        return pa.ListArray.from_buffers(type, n, [mask, pa.py_buffer(offsets)], children=[inner])
    raise TypeError(f"not built here: {type}")


_EPOCH = datetime(1970, 1, 1)
_EPOCH_UTC = datetime(1970, 1, 1, tzinfo=UTC)
_PER_SECOND = {"s": 1, "ms": 1000, "us": 1_000_000, "ns": 1_000_000_000}


def _ticks(v: Any, type: pa.DataType) -> int:
    """A date's days or a datetime's units since the epoch."""
    if pa.types.is_date32(type):
        if isinstance(v, datetime) or not isinstance(v, date):
            raise TypeError(f"{v!r} is not a date")
        return (v - _EPOCH.date()).days
    if not isinstance(v, datetime):
        raise TypeError(f"{v!r} is not a datetime")
    d = v - (_EPOCH_UTC if v.tzinfo is not None else _EPOCH)
    per = _PER_SECOND[type.unit]
    return (d.days * 86_400 + d.seconds) * per + d.microseconds * per // 1_000_000


def _dtype(t: pa.DataType) -> np.dtype:
    """The NumPy type of ``t``'s values: floats as floats, every other
    fixed-width type (integers, times, dates) as integers of its width
    (``DataType.to_pandas_dtype`` would import pandas)."""
    if pa.types.is_floating(t):
        return np.dtype(f"float{t.bit_width}")
    if pa.types.is_unsigned_integer(t):
        return np.dtype(f"uint{t.bit_width}")
    if t.bit_width in (8, 16, 32, 64) and not pa.types.is_boolean(t):
        return np.dtype(f"int{t.bit_width}")
    raise TypeError(f"no NumPy view of Arrow type {t}")


FALSE = from_numpy(np.zeros(1, dtype=bool))[0]  # for pc.fill_null, which imports pandas for Python's False
