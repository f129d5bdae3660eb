"""Mirrors of a CastSQL table in other formats, over its own data files: a
Delta log (:mod:`castsql.mirror.delta`) and Iceberg metadata
(:mod:`castsql.mirror.iceberg`), written on demand or after every commit
(:func:`keep_in_step`, which the after-commit point, :mod:`castsql.commits`,
runs and nothing else does; with ``castsql.mirror.async`` after the commit
returns, :mod:`castsql.mirror.background`)."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from typing import Any

from castsql.format import TableLog

_log = logging.getLogger(__name__)

# name -> (its format, what it writes, the function that writes it). Imported
# on use: the Iceberg mirror needs PyIceberg, which a table without it never loads.
MIRRORS = {
    "delta": ("Delta", "Delta log", "castsql.mirror.delta", "export_delta"),
    "iceberg": ("Iceberg", "Iceberg metadata", "castsql.mirror.iceberg", "export_iceberg"),
}


def exporter(name: str) -> Callable[[TableLog, int | None], Any]:
    """The function that mirrors a table's versions as ``name`` (``delta`` or ``iceberg``)."""
    _, _, module, function = MIRRORS[name]
    return getattr(importlib.import_module(module), function)


def keep_in_step(log: TableLog, version: int) -> list[str]:
    """What follows every commit of ``version`` (:mod:`castsql.commits`): each mirror the
    table's properties ask for (``castsql.mirror.delta``,
    ``castsql.mirror.iceberg``) is written up to it, before the commit
    returns, or after it by a thread of this process when
    ``castsql.mirror.async`` is set (:mod:`castsql.mirror.background`). The
    write has committed whatever happens here: a mirror that cannot be
    written (a racing exporter, a type the format lacks, a store error,
    PyIceberg missing) is logged and left to the next write or ``castsql
    export``, which write every version still missing. Returns the mirrors
    brought up to date (none yet when they are left to the thread)."""
    from castsql.format.properties import mirrors_async

    if mirrors_async(log.manifest(version).properties):
        from castsql.mirror.background import schedule

        schedule(log, version)
        return []
    return write_mirrors(log, version)


def write_mirrors(log: TableLog, version: int) -> list[str]:
    """Each mirror ``version``'s properties ask for written up to it, now;
    the names of those written (a failure is logged, as :func:`keep_in_step` says)."""
    from castsql.format.properties import mirrors
    from castsql.storage.base import in_background

    m = log.manifest(version)  # just committed: from the log's cache
    names = list(mirrors(m.properties))
    # Both mirrors at once: each waits on its own writes (a few small objects
    # in turn), so the commit waits on the slower, not on the two in a row.
    others = {name: in_background(write_one, log, name, version) for name in names[1:]}
    done = [name for name in names[:1] if write_one(log, name, version)]
    return done + [name for name, f in others.items() if f.result()]


def write_one(log: TableLog, name: str, version: int) -> bool:
    """Mirror ``name`` written up to ``version``; False (logged) when it could not be."""
    try:
        exporter(name)(log, version)
        return True
    except Exception as e:
        _log.warning(
            "table %s: %s mirror of version %d not written: %s", log.storage.root, MIRRORS[name][0], version, e
        )
        return False
