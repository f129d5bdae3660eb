"""The meta-commands. Each returns a result table to print (in the current
mode, like a query) or None, and raises ShellError with a usage hint on bad
arguments."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pyarrow as pa

from castsql.shell.catalog import latest_versions
from castsql.shell.errors import Reported, ShellError
from castsql.shell.render import MODES
from castsql.shell.special.registry import COMMANDS, lookup, meta_command
from castsql.shell.text_modes import normal_mode

if TYPE_CHECKING:
    from castsql.shell.special.host import Shell

_ON = {"on", "true", "yes", "1"}
_OFF = {"off", "false", "no", "0"}


def _on_off(name: str, args: list[str], current: bool) -> bool:
    if not args:
        return not current  # ".timer" alone toggles, and says what it is now
    word = args[0].lower()
    if word in _ON:
        return True
    if word in _OFF:
        return False
    raise ShellError(f"usage: {name} on|off")


def _toggle(shell: Shell, name: str, setting: str, args: list[str]) -> None:
    """An on/off setting: set from ``args``, or toggled and said when there are none."""
    value = _on_off(name, args, getattr(shell.settings, setting))
    setattr(shell.settings, setting, value)
    if not args:
        shell.say(f"{name[1:]}: {'on' if value else 'off'}")


def _count_setting(
    shell: Shell, args: list[str], setting: str, usage: str, unit: str, zero: str, shown: str = ""
) -> None:
    """A count setting (0 or more): set from ``args``, or said (``shown`` for 0) when there are none."""
    name = usage.split()[0]
    if not args:
        value = getattr(shell.settings, setting)
        shell.say(f"{name[1:]}: {shown if value == 0 and shown else value}")
        return
    try:
        n = int(args[0])
    except ValueError:
        raise ShellError(f"usage: {usage} (a number of {unit}, not {args[0]!r})") from None
    if n < 0:
        raise ShellError(f"usage: {usage} (0 or more; {zero})")
    setattr(shell.settings, setting, n)


def _version_arg(value: str, what: str) -> int:
    try:
        v = int(value)
    except ValueError:
        raise ShellError(f"{what} must be a version number, not {value!r}") from None
    if v < 0:
        raise ShellError(f"{what} must be a version number (0 or more), not {v}")
    return v


def _table_arg(shell: Shell, args: list[str], usage: str) -> str:
    if args:
        shell.session.log(args[0])  # TableNotFound lists the open tables
        return args[0]
    tables = shell.session.tables
    if len(tables) == 1:
        return tables[0]
    raise ShellError(f"usage: {usage}" + (f" (tables: {', '.join(tables)})" if tables else " (no tables open)"))


# ---------------------------------------------------------------- help and exit


@meta_command(".help", ".help [COMMAND]", "show the commands, or one command's help", args=("command",))
def help_(shell: Shell, args: list[str]) -> None:
    if args:
        name = args[0] if args[0].startswith(".") else "." + args[0]
        cmd = lookup(name)
        if cmd is None:
            raise ShellError(f"no command {name} (.help lists the commands)")
        also = f"   (also {', '.join(cmd.aliases)})" if cmd.aliases else ""
        shell.say(f"{cmd.usage}\n    {cmd.help}{also}")
        return
    width = max(len(c.usage) for c in COMMANDS.values())
    lines = [
        f"{c.usage:<{width}}  {c.help}" + (f" (also {', '.join(c.aliases)})" if c.aliases else "")
        for c in sorted(COMMANDS.values(), key=lambda c: c.name)
    ]
    lines += [
        "",
        "SQL statements end with ';' (Enter on an unfinished one starts a new line; Alt-Enter runs it anyway).",
        "Time travel: t AS OF VERSION n, t VERSION AS OF n, t AT (VERSION => n), t AS OF TIMESTAMP '…'.",
        "Audits: DESCRIBE HISTORY t, SELECT * FROM table_history('t'), table_changes('t', a, b), "
        "table_diff('t', a, b), table_row_history('t', key).",
        "Writes, one version each: DELETE, UPDATE, INSERT, MERGE INTO, CREATE TABLE, ALTER TABLE, "
        "RESTORE TABLE t TO VERSION AS OF n, OPTIMIZE t, VACUUM t.",
        "Keys: Tab completes, Ctrl-R searches history, Ctrl-C cancels a query or clears the line, Ctrl-D quits.",
    ]
    shell.say("\n".join(lines))


@meta_command(".quit", ".quit", "leave the shell", aliases=(".exit", ".q"))
def quit_(shell: Shell, args: list[str]) -> None:
    shell.exit_requested = True


# ---------------------------------------------------------------- tables


@meta_command(".tables", ".tables", "list the open tables with their latest versions", threaded=True)
def tables(shell: Shell, args: list[str]) -> pa.Table | None:
    names = shell.session.tables
    if not names:
        shell.say("No tables open. Open a table or a warehouse with .open URI")
        return None
    versions = latest_versions(shell.session, names)
    return pa.table(
        {
            "table": names,
            "latest_version": pa.array([versions[n] for n in names], pa.int64()),
            "location": [shell.session.log(n).uri for n in names],
        }
    )


@meta_command(".schema", ".schema [TABLE]", "columns and types of one table or of all", args=("table",), threaded=True)
def schema(shell: Shell, args: list[str]) -> pa.Table | None:
    names = [args[0]] if args else shell.session.tables
    if not names:
        shell.say("No tables open. Open a table or a warehouse with .open URI")
        return None
    rows: dict[str, list] = {"table": [], "column": [], "type": [], "key": []}
    for name in names:
        m = shell.session.log(name).latest()
        display = next((t for t in shell.session.tables if t.lower() == name.lower()), name)
        for c in m.schema.columns:
            rows["table"].append(display)
            rows["column"].append(c.name)
            rows["type"].append(c.type)
            rows["key"].append("primary key" if c.name == m.primary_key else "")
    if not any(rows["key"]):
        del rows["key"]
    if len(names) == 1:
        del rows["table"]
    return pa.table(rows)


@meta_command(
    ".history",
    ".history [TABLE]",
    "versions of a table: commit time, operation, rows inserted, updated and deleted",
    args=("table",),
    threaded=True,
)
def history(shell: Shell, args: list[str]) -> pa.Table:
    table = _table_arg(shell, args, ".history TABLE")
    h = shell.session.history(table)
    cols = ["version", "committed_at", "operation", "rows_inserted", "rows_updated", "rows_deleted", "live_rows"]
    if h.column("error").null_count < h.num_rows:
        cols.append("error")  # some version cannot be read: say which and why
    out = h.select(cols)
    said = [_one_line(t) for t in h.column("statement").to_pylist()]
    if any(said):
        # What a SQL statement wrote the version with (its summary's
        # ``statement``), cut to a line: who did what, beside how many rows.
        out = out.append_column("statement", pa.array(said, pa.string()))
    return out


STATEMENT_SHOWN = 60  # characters of a version's statement .history shows


def _one_line(text: str | None) -> str | None:
    if text is None:
        return None
    text = " ".join(text.split())
    return text if len(text) <= STATEMENT_SHOWN else text[: STATEMENT_SHOWN - 1] + "…"


@meta_command(
    ".diff",
    ".diff TABLE FROM [TO]",
    "rows version TO (default: latest) holds and FROM does not, and the reverse; updates paired by key",
    args=("table", "version", "version"),
    min_args=2,
    threaded=True,
)
def diff(shell: Shell, args: list[str]) -> pa.Table:
    table = args[0]
    start = _version_arg(args[1], "FROM")
    end = _version_arg(args[2], "TO") if len(args) > 2 else shell.session.log(table).latest_version()
    ch = shell.session.diff(table, start, end)
    ch = ch.select(["_change_type"] + [c for c in ch.column_names if c != "_change_type"])
    kinds = ch.column("_change_type").to_pylist()
    inserted, deleted, updated = kinds.count("insert"), kinds.count("delete"), kinds.count("update_postimage")
    shell.say(
        f"{table}: version {end} against {start}: {inserted:,} rows inserted, {updated:,} updated, {deleted:,} deleted"
    )
    return ch


# ---------------------------------------------------------------- session


@meta_command(
    ".open",
    ".open [--add] URI [NAME]",
    "open a table or warehouse (local path, s3://…, gs://…, az://…) instead of the current one; --add keeps the "
    "current tables (NAME: what to call an added table)",
    args=("uri",),
    min_args=1,
    max_args=3,
    threaded=True,
)
def open_(shell: Shell, args: list[str]) -> None:
    shell.refuse_in_safe_mode(".open")
    add = args[0] == "--add"
    if add:
        if len(args) not in (2, 3):
            raise ShellError("usage: .open [--add] URI [NAME]")
        shell.session.open(args[1], args[2] if len(args) == 3 else None)
        shell.catalog.invalidate()
    else:
        if len(args) != 1 or args[0].startswith("--"):
            raise ShellError("usage: .open [--add] URI [NAME]")
        from castsql.engine import Session

        shell.replace_session(Session(args[0]))  # a failure leaves the current session as it was
    _say_versions(shell, "Tables")


@meta_command(".refresh", ".refresh", "forget cached state and re-read every table's latest version", threaded=True)
def refresh(shell: Shell, args: list[str]) -> None:
    shell.session.refresh()
    shell.catalog.invalidate()
    _say_versions(shell, "Latest versions")


def _say_versions(shell: Shell, label: str) -> None:
    vs = latest_versions(shell.session)
    if not vs:
        shell.say("No tables open.")
        return
    shell.say(f"{label}: " + ", ".join(f"{n} v{v}" if v is not None else f"{n} (unreadable)" for n, v in vs.items()))


# ---------------------------------------------------------------- output settings


@meta_command(".mode", ".mode [MODE]", f"output mode: {'|'.join(MODES)}", args=("mode",))
def mode(shell: Shell, args: list[str]) -> None:
    if not args:
        shell.say(f"mode: {shell.settings.mode} (modes: {', '.join(MODES)})")
        return
    m = normal_mode(args[0])
    if m not in MODES:
        raise ShellError(f"unknown mode {args[0]!r} (modes: {', '.join(MODES)})")
    shell.settings.mode = m


def _unescape(text: str) -> str:
    r"""DuckDB's CLI reads ``\t``, ``\n`` and ``\\`` in .separator and .nullvalue."""
    return re.sub(r"\\([tnr\\])", lambda m: {"t": "\t", "n": "\n", "r": "\r", "\\": "\\"}[m.group(1)], text)


@meta_command(
    ".headers", ".headers on|off", "column names in csv, tabs and list modes", args=("onoff",), aliases=(".header",)
)
def headers(shell: Shell, args: list[str]) -> None:
    _toggle(shell, ".headers", "header", args)


@meta_command(".separator", ".separator SEP", "column separator of csv and list modes (\\t for a tab)", args=("text",))
def separator(shell: Shell, args: list[str]) -> None:
    if not args:
        shown = shell.settings.separator
        shell.say(f"separator: {shown!r}" if shown is not None else "separator: the mode's own (, | or tab)")
        return
    if not args[0]:
        raise ShellError("usage: .separator SEP (one or more characters)")
    shell.settings.separator = _unescape(args[0])


@meta_command(".nullvalue", ".nullvalue TEXT", "text shown for NULL (default NULL)", args=("text",))
def nullvalue(shell: Shell, args: list[str]) -> None:
    if not args:
        shell.say(f"nullvalue: {shell.settings.null!r}")
        return
    shell.settings.null = _unescape(args[0])


@meta_command(".echo", ".echo on|off", "print each command before running it", args=("onoff",))
def echo(shell: Shell, args: list[str]) -> None:
    _toggle(shell, ".echo", "echo", args)


@meta_command(".bail", ".bail on|off", "stop a script read from standard input at its first error", args=("onoff",))
def bail(shell: Shell, args: list[str]) -> None:
    _toggle(shell, ".bail", "bail", args)


@meta_command(".timer", ".timer on|off", "print how long each statement took", args=("onoff",))
def timer(shell: Shell, args: list[str]) -> None:
    _toggle(shell, ".timer", "timer", args)


@meta_command(".types", ".types on|off", "show column types under the header (box and table modes)", args=("onoff",))
def types(shell: Shell, args: list[str]) -> None:
    _toggle(shell, ".types", "types", args)


@meta_command(".maxrows", ".maxrows [N]", "rows shown in box and table modes (head and tail); 0 shows all", max_args=1)
def maxrows(shell: Shell, args: list[str]) -> None:
    _count_setting(shell, args, "maxrows", ".maxrows N", "rows", "0 shows every row")


@meta_command(".maxwidth", ".maxwidth [N]", "width of box and table modes; 0 fits the terminal", max_args=1)
def maxwidth(shell: Shell, args: list[str]) -> None:
    _count_setting(shell, args, "maxwidth", ".maxwidth N", "columns", "0 fits the terminal", "the terminal width")


@meta_command(
    ".output", ".output [FILE]", "write results to FILE from now on; without FILE, back to the screen", args=("path",)
)
def output(shell: Shell, args: list[str]) -> None:
    if args:
        shell.refuse_in_safe_mode(".output FILE")
    shell.set_output(args[0] if args else None)


@meta_command(".once", ".once FILE", "write the next result to FILE", args=("path",), min_args=1)
def once(shell: Shell, args: list[str]) -> None:
    shell.refuse_in_safe_mode(".once")
    shell.set_output(args[0], once=True)


@meta_command(
    ".read",
    ".read FILE",
    "run the statements and commands of a SQL file, stopping at the first error",
    args=("path",),
    min_args=1,
)
def read(shell: Shell, args: list[str]) -> None:
    shell.refuse_in_safe_mode(".read")
    if not shell.run_file(args[0]):
        raise Reported()
