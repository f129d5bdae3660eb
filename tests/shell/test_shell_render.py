"""Output modes: fitting the width, truncating cells, head and tail with a footer, NULLs, types, data modes."""

from __future__ import annotations

import datetime as dt
import decimal
import io
import json
import re

import numpy as np
import pyarrow as pa
import pytest

from castsql.shell.render import (
    RenderOptions,
    collect,
    display_width,
    format_value,
    render_table,
    write_result,
)
from castsql.shell.text_modes import TextOptions

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def grid(table: pa.Table, **kw) -> list[str]:
    return render_table(table, RenderOptions(**kw)).splitlines()


def test_long_cells_are_cut_with_an_ellipsis_to_fit_the_width() -> None:
    t = pa.table({"id": [1, 2], "text": ["x" * 300, "short"]})
    lines = grid(t, width=60)
    assert all(display_width(ln) <= 60 for ln in lines)
    assert max(display_width(ln) for ln in lines[:-1]) == 60  # the grid uses the width it has
    assert "x…" in lines[3] and "short" in lines[4]
    assert lines[-1] == "2 rows"


def test_unlimited_width_keeps_everything() -> None:
    t = pa.table({"text": ["x" * 300]})
    assert "x" * 300 in render_table(t, RenderOptions(width=None))


def test_too_many_columns_drops_middle_ones() -> None:
    t = pa.table({f"column_{i:02d}": [i] for i in range(40)})
    lines = grid(t, width=80)
    assert all(display_width(ln) <= 80 for ln in lines)
    header = lines[1]
    assert "column_00" in header and "column_39" in header and "…" in header
    assert re.fullmatch(r"1 row  40 columns \(\d+ shown\)", lines[-1])


def test_head_and_tail_of_long_results() -> None:
    t = pa.table({"n": list(range(1000))})
    lines = grid(t, maxrows=6, mode="table")
    body = [ln for ln in lines if ln.startswith("|")][1:]
    assert [ln.strip("| ") for ln in body] == ["0", "1", "2", "·", "997", "998", "999"]
    assert lines[-1] == "1,000 rows (6 shown)"


def test_maxrows_zero_shows_everything() -> None:
    t = pa.table({"n": list(range(100))})
    lines = grid(t, maxrows=0, mode="table")
    assert len([ln for ln in lines if ln.startswith("|")]) == 101
    assert lines[-1] == "100 rows"


def test_null_is_visible_and_dimmed_on_a_terminal() -> None:
    t = pa.table({"name": ["a", None]})
    assert "│ NULL │" in render_table(t, RenderOptions())
    colored = render_table(t, RenderOptions(color=True))
    assert "\x1b[2mNULL" in colored
    assert ANSI.sub("", colored) == render_table(t, RenderOptions())


def test_types_under_the_header() -> None:
    t = pa.table(
        {
            "id": pa.array([1], pa.int64()),
            "at": pa.array([dt.datetime(2025, 1, 1, tzinfo=dt.UTC)], pa.timestamp("us", tz="UTC")),
            "tags": pa.array([["a", "b"]], pa.list_(pa.string())),
        }
    )
    lines = grid(t, types=True)
    assert re.search(r"│\s+bigint\s+│\s+timestamptz\s+│\s+varchar\[\]\s+│", lines[2]), lines[2]
    assert "['a', 'b']" in lines[4]
    assert "2025-01-01 00:00:00+00:00" in lines[4]


def test_wide_characters_and_control_characters_keep_the_grid_straight() -> None:
    t = pa.table({"s": ["한글", "a\nb\tc"]})
    lines = grid(t)
    widths = {display_width(ln) for ln in lines[:-1]}
    assert len(widths) == 1, lines
    assert "a\\nb\\tc" in lines[4]


def test_numbers_align_right_text_left() -> None:
    lines = grid(pa.table({"n": [1, 1000], "s": ["a", "bbbb"]}), mode="table")
    assert lines[3] == "|    1 | a    |"


def test_csv_mode() -> None:
    t = pa.table(
        {"i": [1, None], "s": ['a,"b"', None], "b": [True, False], "d": pa.array([decimal.Decimal("1.50"), None])}
    )
    out = render_table(t, RenderOptions(mode="csv"))
    # DuckDB's CLI text: NULL spelled out, quotes only where needed
    assert out == 'i,s,b,d\n1,"a,""b""",true,1.50\nNULL,NULL,false,NULL\n'
    empty = TextOptions(null="", separator=";", header=False)
    assert render_table(t, RenderOptions(mode="csv"), empty) == '1;"a,""b""";true;1.50\n;;false;\n'


def test_json_modes() -> None:
    t = pa.Table.from_arrays(
        [pa.array([1.5, float("nan")]), pa.array([1, 2]), pa.array([{"k": 1}, None], pa.struct([("k", pa.int8())]))],
        names=["x", "x", "st"],
    )
    out = render_table(t, RenderOptions(mode="json"))
    assert out == '[{"x":1.5,"x":1,"st":{"k":1}},\n{"x":NaN,"x":2,"st":null}]\n'  # NaN as DuckDB's CLI writes it
    assert json.loads(out)  # Python's reader takes it (duplicate keys collapse only when parsed)
    lines = render_table(t, RenderOptions(mode="jsonlines")).splitlines()
    assert len(lines) == 2 and lines[1] == '{"x":NaN,"x":2,"st":null}'
    assert render_table(pa.table({"a": pa.array([], pa.int64())}), RenderOptions(mode="json")) == "[]\n"


def test_markdown_and_line_modes() -> None:
    t = pa.table({"id": [1, 22], "note": ["a|b", None]})
    assert render_table(t, RenderOptions(mode="markdown")) == (
        "| id | note |\n|---:|------|\n| 1  | a\\|b |\n| 22 | NULL |\n"
    )
    assert render_table(t, RenderOptions(mode="line")) == "   id = 1\n note = a|b\n\n   id = 22\n note = NULL\n"


def test_statements_without_a_result_print_nothing() -> None:
    for mode in ("box", "csv", "json", "line"):
        assert render_table(pa.table({}), RenderOptions(mode=mode)) == ""


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (None, "NULL"),
        (True, "true"),
        (1.0, "1.0"),
        (float("inf"), "inf"),
        (decimal.Decimal("1E+2"), "100"),
        (dt.date(2025, 1, 2), "2025-01-02"),
        (b"ab\x00", "ab\\x00"),
        ({"a": "x"}, "{'a': 'x'}"),
        ([("k", 1)], "{'k'=1}"),
        ([None, "s"], "[NULL, 's']"),
    ],
)
def test_format_value(value: object, text: str) -> None:
    assert format_value(value) == text


def test_big_results_stream_through_keeping_only_what_is_shown() -> None:
    """Box mode on a result too big to hold: rows are counted as batches pass, only head and tail kept."""
    held: list[int] = []

    def batches():
        for i in range(200):  # 200 x 100,000 rows = 20 million
            batch = pa.record_batch({"n": pa.array(np.arange(i * 100_000, (i + 1) * 100_000, dtype=np.int64))})
            held.append(i)
            yield batch

    buf = io.StringIO()
    n = write_result(batches(), pa.schema([("n", pa.int64())]), buf, RenderOptions(mode="table", maxrows=4))
    assert n == 20_000_000 and len(held) == 200
    lines = buf.getvalue().splitlines()
    assert [ln.strip("| ") for ln in lines if ln.startswith("|")][1:] == ["0", "1", "·", "19999998", "19999999"]
    assert lines[-1] == "20,000,000 rows (4 shown)"


def test_collect_keeps_head_and_tail_exactly() -> None:
    for total in (0, 1, 5, 6, 7, 50):
        for chunk in (1, 3, 100):
            t = pa.table({"x": list(range(total))})
            c = collect(t.to_batches(max_chunksize=chunk), t.schema, 6)
            shown = [r[0] for r in c.head] + [r[0] for r in c.tail]
            expected = list(range(total)) if total <= 6 else [0, 1, 2, total - 3, total - 2, total - 1]
            assert shown == expected and c.total == total


def test_explain_plans_print_as_drawn() -> None:
    t = pa.table({"explain_key": ["physical_plan"], "explain_value": ["┌─┐\n│x│\n└─┘"]})
    assert render_table(t, RenderOptions()) == "┌─┐\n│x│\n└─┘\n"


def test_very_narrow_terminals_still_show_something() -> None:
    for width in (12, 20):
        for t in (pa.table({"a_long_column_name": ["value " * 10]}), pa.table({f"c{i}": ["v" * 30] for i in range(5)})):
            lines = grid(t, width=width)
            assert all(display_width(ln) <= width for ln in lines[:-1]), (width, lines)
            assert "v" in lines[3]


@pytest.mark.parametrize(
    ("sql", "shown"),
    [
        ("SELECT 'infinity'::TIMESTAMPTZ AS v", "infinity"),
        ("SELECT '-infinity'::DATE AS v", "-infinity"),
        ("SELECT TIMETZ '12:00:00+05' AS v", "12:00:00+05"),
        ("SELECT INTERVAL '1 month 2 days 3 hours' AS v", "1 month 2 days 03:00:00"),
        ("SELECT DATE '5881580-07-10' AS v", "5881580-07-10"),
        ("SELECT DATE '0044-03-15 (BC)' AS v", "0044-03-15 (BC)"),
        ("SELECT TIMESTAMP '2025-01-01 12:00:00.5' AS v", "2025-01-01 12:00:00.5"),
    ],
)
@pytest.mark.parametrize("mode", ["box", "csv", "json", "line"])
def test_values_print_as_duckdbs_own_shell_prints_them(sql, shown, mode) -> None:
    import io

    from castsql.engine import Session
    from castsql.shell.core import Settings, Shell

    out = io.StringIO()
    sh = Shell(Session(), stdout=out, stderr=out, settings=Settings(mode=mode))
    try:
        assert sh.run_lines([sql + ";\n"], "<test>")
    finally:
        sh.close()
    assert shown in out.getvalue(), out.getvalue()
    assert "out of range" not in out.getvalue() and "32103" not in out.getvalue()


def test_types_row_shows_the_duckdb_type_of_spelled_columns() -> None:
    import io

    from castsql.engine import Session
    from castsql.shell.core import Settings, Shell

    out = io.StringIO()
    sh = Shell(Session(), stdout=out, stderr=out, settings=Settings(mode="box", types=True))
    try:
        sh.run_lines(["SELECT TIMETZ '12:00:00+05' AS a, TIMESTAMPTZ '2025-01-01' AS b, 1 AS c;\n"], "<test>")
    finally:
        sh.close()
    assert re.search(r"│\s+timetz\s+│\s+timestamptz\s+│\s+integer\s+│", out.getvalue()), out.getvalue()


# ---------------------------------------------------------------- control characters

# ESC (a CSI sequence that clears the screen), BEL, CR, DEL, C1 CSI (\x9b) and
# an OSC title change, in a value, inside a list value and in a column name.
EVIL = "x\x1b[2J\x07\r\x7f\x9b31m\x1b]0;pwned\x07"
EVIL_TABLE = pa.table({"n" + EVIL: [EVIL], "l": [[EVIL]], "i": [1]})


def _raw_controls(text: str) -> list[str]:
    return [c for c in text if not c.isprintable() and c not in "\n\t"]  # tabs and newlines move no cursor back


@pytest.mark.parametrize("mode", ["box", "table", "csv", "tabs", "list", "json", "jsonlines", "markdown", "line"])
def test_a_terminal_never_receives_a_raw_control_character(mode) -> None:
    out = render_table(EVIL_TABLE, RenderOptions(mode=mode, terminal=True))
    assert _raw_controls(out) == []
    assert "\\x1b[2J" in out or "\\u001b[2J" in out  # shown, not dropped


def test_csv_and_markdown_into_a_file_or_pipe_keep_the_bytes() -> None:
    import csv as csvlib

    out = render_table(EVIL_TABLE, RenderOptions(mode="csv", terminal=False))
    assert list(csvlib.reader(io.StringIO(out))) == [["n" + EVIL, "l", "i"], [EVIL, f"['{EVIL}']", "1"]]
    out = render_table(EVIL_TABLE, RenderOptions(mode="markdown", terminal=False))
    assert EVIL.replace("\r", "") in out.replace("\r", "") and "\x1b[2J" in out
    # the grids are for reading and escape anywhere; JSON escapes what JSON must, and a reader gets the same string
    for mode in ("box", "table"):
        assert _raw_controls(render_table(EVIL_TABLE, RenderOptions(mode=mode, terminal=False))) == []
    out = render_table(EVIL_TABLE, RenderOptions(mode="jsonlines", terminal=False))
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert json.loads(out) == {"n" + EVIL: EVIL, "l": [EVIL], "i": 1}


def test_json_keeps_characters_beyond_the_basic_plane() -> None:
    t = pa.table({"s": ["a\U000e0001b\u2028"]})  # a tag character and a line separator
    out = render_table(t, RenderOptions(mode="jsonlines", terminal=False))
    assert out == '{"s":"a\U000e0001b\u2028"}\n' and json.loads(out) == {"s": "a\U000e0001b\u2028"}
