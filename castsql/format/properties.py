"""Table properties: settings a table carries in its manifest (FORMAT.md §3.2),
as Delta tables carry ``delta.*`` properties. Names in the ``castsql.``
namespace are CastSQL's own and checked when set; any other name is the
user's to use (a team, an owner, a retention note) and kept as it is.

CastSQL's own:

=================================  ========  ===============================================
``castsql.autoCompact``            false     ``true``: a commit that changes the rows (any
                                             writer) is followed by a compaction once the
                                             table has ``autoCompact.minNumFiles`` small data
                                             files or tombstone files (no job to schedule)
``castsql.autoCompact.minNumFiles`` 10       how many small files (or tombstone files) trigger it
``castsql.autoCompact.maxFileSize`` 16 MiB   a data file whose live data is under this is small;
                                             small files are packed into files of this size
``castsql.compact.sortBy``          (none)   the column compactions order rows by (event time)
``castsql.mirror.delta``            false     ``true``: every writer (either engine) writes the Delta
                                             mirror of each version they commit (FORMAT.md §10)
``castsql.mirror.iceberg``          false     the same for the Iceberg mirror
``castsql.mirror.iceberg.formatVersion`` 2   the Iceberg format version the mirror writes from this
                                             version on: 2 (position delete files) or 3
                                             (deletion vectors in Puffin files); it never goes down
``castsql.changeDataFeed``          false     ``true``: deletes, updates and merges also write the
                                             rows they delete, as they were (FORMAT.md §3.5), so
                                             audits read a version's change, not the row groups
                                             its tombstones hit (Delta's ``enableChangeDataFeed``)
``castsql.cdc.deleteRetention``     30 days   how long a sequenced CDC batch's delete markers are
                                             kept (FORMAT.md §3.7): ``30 days``, ``12 hours``,
                                             ``interval 7 days``, ``forever``. A change older than
                                             a dropped marker, arriving later, is applied as if the
                                             key had never been deleted
=================================  ========  ===============================================

Example::

    >>> check({"castsql.autoCompact": "true", "owner": "growth"}, "t")
    {'castsql.autoCompact': 'true', 'owner': 'growth'}
    >>> AutoCompact.of({"castsql.autoCompact": "true"}).min_files
    10
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta

from castsql.errors import CastSQLError

AUTO_COMPACT = "castsql.autoCompact"
MIN_FILES = "castsql.autoCompact.minNumFiles"
MAX_FILE_SIZE = "castsql.autoCompact.maxFileSize"
SORT_BY = "castsql.compact.sortBy"
MIRROR_DELTA = "castsql.mirror.delta"  # every commit also writes its Delta mirror version
MIRROR_ICEBERG = "castsql.mirror.iceberg"  # ... and its Iceberg one
ICEBERG_FORMAT_VERSION = "castsql.mirror.iceberg.formatVersion"  # 2 or 3 (FORMAT.md §10.2)
MIRROR_ASYNC = "castsql.mirror.async"  # mirrors written after the commit returns (FORMAT.md §10)
CHANGE_DATA_FEED = "castsql.changeDataFeed"  # deletes write their rows' preimages (FORMAT.md §3.5)
DELETE_RETENTION = "castsql.cdc.deleteRetention"  # how long CDC delete markers are kept (FORMAT.md §3.7)
# Longer than Kafka's default retention (7 days), as Delta's log retention:
# a batch replayed from the source arrives well within it.
_DEFAULT_DELETE_RETENTION = timedelta(days=30)
_DEFAULT_MIN_FILES = 10  # measured (bench/stream_bench.py): with tiered compactions cheap, fewer files read faster
_DEFAULT_MAX_FILE_SIZE = 16 * 1024 * 1024


def _bool(v: str) -> bool:
    if v.lower() not in ("true", "false"):
        raise ValueError("true or false")
    return v.lower() == "true"


def _iceberg_version(v: str) -> int:
    if v not in ("2", "3"):
        raise ValueError("2 or 3")
    return int(v)


_MAX_DURATION = 100 * 366 * 86400
_UNITS = {"day": 86400, "hour": 3600, "minute": 60, "second": 1, "week": 604800, "d": 86400, "h": 3600, "m": 60, "s": 1}


def _duration(v: str) -> timedelta | None:
    """``30 days``, ``interval 12 hours``, ``7d``, ``forever`` (None)."""
    text = v.strip().lower()
    if text in ("forever", "infinite", "infinity"):
        return None
    m = re.fullmatch(r"(?:interval\s+)?(\d+)\s*(weeks?|days?|hours?|minutes?|seconds?|[dhms])", text)
    if m is None:
        raise ValueError("a duration")
    seconds = int(m.group(1)) * _UNITS[m.group(2).rstrip("s") if len(m.group(2)) > 1 else m.group(2)]
    if seconds > _MAX_DURATION:
        raise ValueError("a duration")  # past a century a time minus it leaves the calendar: say forever
    return timedelta(seconds=seconds)


def _positive(v: str) -> int:
    n = int(v)
    if n <= 0:
        raise ValueError("a positive integer")
    return n


_KNOWN: dict[str, Callable[[str], object]] = {
    AUTO_COMPACT: _bool,
    MIN_FILES: _positive,
    MAX_FILE_SIZE: _positive,
    SORT_BY: str,
    MIRROR_DELTA: _bool,
    MIRROR_ICEBERG: _bool,
    ICEBERG_FORMAT_VERSION: _iceberg_version,
    MIRROR_ASYNC: _bool,
    CHANGE_DATA_FEED: _bool,
    DELETE_RETENTION: _duration,
}


def change_data_feed(props: Mapping[str, str]) -> bool:
    """Whether writers record the rows each version deletes (``castsql.changeDataFeed``)."""
    return _bool(props.get(CHANGE_DATA_FEED, "false"))


def delete_retention(props: Mapping[str, str]) -> timedelta | None:
    """How long CDC delete markers are kept (``castsql.cdc.deleteRetention``); None: forever.

    >>> delete_retention({}), delete_retention({DELETE_RETENTION: "interval 12 hours"})
    (datetime.timedelta(days=30), datetime.timedelta(seconds=43200))
    """
    v = props.get(DELETE_RETENTION)
    return _DEFAULT_DELETE_RETENTION if v is None else _duration(v)


def mirrors(props: Mapping[str, str]) -> list[str]:
    """The mirrors (``delta``, ``iceberg``) the table's properties ask writers to keep in step."""
    return [
        name for name, key in (("delta", MIRROR_DELTA), ("iceberg", MIRROR_ICEBERG)) if _bool(props.get(key, "false"))
    ]


def mirrors_async(props: Mapping[str, str]) -> bool:
    """Whether a commit returns before its mirrors are written (``castsql.mirror.async``):
    a thread of the committing process writes them, as Delta's UniForm writes
    its Iceberg metadata after the Delta commit."""
    return _bool(props.get(MIRROR_ASYNC, "false"))


def iceberg_format_version(props: Mapping[str, str]) -> int:
    """The Iceberg format version a version's properties ask its mirror for (2 unless set)."""
    return _iceberg_version(props.get(ICEBERG_FORMAT_VERSION, "2"))


def check(props: Mapping[str, str | None], where: str) -> dict[str, str | None]:
    """``props`` checked: names in the ``castsql.`` namespace must be known and
    their values valid (None removes a property); CastSQLError naming the
    property and what it takes otherwise."""
    out: dict[str, str | None] = {}
    for k, v in props.items():
        if not isinstance(k, str) or not k:
            raise CastSQLError(f"{where}: a property name must be a non-empty string, not {k!r}")
        if v is not None and not isinstance(v, str):
            v = str(v).lower() if isinstance(v, bool) else str(v)
        if k.lower().startswith("castsql."):
            parse = _KNOWN.get(k)
            if parse is None:
                raise CastSQLError(f"{where}: unknown property {k!r} (CastSQL's are: {', '.join(sorted(_KNOWN))})")
            if v is not None:
                try:
                    parse(v)
                except ValueError:
                    takes: dict[Callable[[str], object], str] = {
                        _bool: "true or false",
                        _positive: "a positive integer",
                        _iceberg_version: "2 or 3",
                        _duration: "a duration of at most 100 years ('30 days', '12 hours'), or 'forever'",
                    }
                    what = takes.get(parse, "a string")
                    raise CastSQLError(f"{where}: property {k!r} takes {what}, not {v!r}") from None
        out[k] = v
    return out


def check_unchanged(have: Mapping[str, str], given: Mapping[str, str | None] | None, where: str) -> None:
    """CastSQLError unless the properties ``have`` of an existing table already
    hold ``given`` (checked first): properties given to a write that would
    have created the table are that table's, and a write to an existing one
    does not change them by the way (``castsql alter --set-property``,
    ``Table.set_properties`` do). Equal ones pass, so the same command runs
    again.

    >>> check_unchanged({"owner": "ops"}, {"owner": "ops"}, "t")
    >>> check_unchanged({"owner": "ops"}, {"owner": "data"}, "t")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    castsql.errors.CastSQLError: t: the table exists and its property 'owner' is 'ops', not 'data'; ...
    """
    for k, v in check(given or {}, where).items():
        if have.get(k) != v:
            raise CastSQLError(
                f"{where}: the table exists and its property {k!r} is {have.get(k)!r}, not {v!r}; properties are "
                "set when a write creates the table (castsql alter URI --set-property, Table.set_properties change "
                "an existing one)"
            )


@dataclass(frozen=True)
class AutoCompact:
    """The automatic compaction a table's properties ask for."""

    min_files: int
    max_file_size: int
    sort_by: str | None

    @classmethod
    def of(cls, props: Mapping[str, str]) -> AutoCompact | None:
        """The setting, or None when ``castsql.autoCompact`` is not true."""
        if not _bool(props.get(AUTO_COMPACT, "false")):
            return None
        return cls(
            int(props.get(MIN_FILES, _DEFAULT_MIN_FILES)),
            int(props.get(MAX_FILE_SIZE, _DEFAULT_MAX_FILE_SIZE)),
            props.get(SORT_BY) or None,
        )
