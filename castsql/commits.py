"""The after-commit point: what follows every commit of every table, whoever
made it.

:meth:`castsql.format.TableLog.commit` (and ``create``) run the hooks
registered with :func:`castsql.format.log.register_after_commit` once a
version is committed and the pointer moved. Every writer commits through
them — the write pipeline of both engines, overwrite, compaction, restore,
alter, upgrade, set_properties, Spark's driver and the Spark data source —
so none can skip them. The format layer knows nothing of what runs there (it
imports no mirror, DuckDB or Spark); this module, imported with ``castsql``
itself (so by anything that can commit), registers the two:

1. ``mirrors``: the Delta log and Iceberg metadata the table's properties ask
   for (``castsql.mirror.delta``, ``castsql.mirror.iceberg``) are written up
   to the new version (:func:`castsql.mirror.keep_in_step`), also after a
   commit a hook made (the automatic compaction's ``COMPACT`` version);
2. ``autoCompact``: the automatic compaction the properties ask for
   (``castsql.autoCompact``, :func:`castsql.embedded.compactor.maintain`),
   after a commit that changed the rows — by any engine: Spark's commits
   included, as the compaction runs in the committing process with DuckDB
   and needs no JVM — never after a commit a hook made, so a compaction
   never follows itself.

Neither ever fails the write that committed: an error is logged, and the
next commit catches up (a mirror writes every version it lacks). A table
without those properties pays nothing: the committed manifest, in hand,
says so.

Example::

    >>> from castsql.format.log import after_commit_hooks
    >>> after_commit_hooks()
    ['mirrors', 'autoCompact']
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from castsql.format.log import register_after_commit

if TYPE_CHECKING:
    from castsql.format import Manifest, TableLog


def mirrors(log: TableLog, m: Manifest) -> None:
    """Bring the mirrors ``m``'s properties ask for up to version ``m``."""
    from castsql.format.properties import mirrors as wanted

    if not wanted(m.properties):
        return None  # no import, no request: most tables
    from castsql.mirror import keep_in_step

    keep_in_step(log, m.version)
    return None


def auto_compact(log: TableLog, m: Manifest) -> Manifest | None:
    """Automatic compaction after ``m``, when its properties ask for it; the
    compaction's manifest, or None."""
    from castsql.format.properties import AutoCompact

    if AutoCompact.of(m.properties) is None:
        return None  # DuckDB not imported for a table that never compacts by itself
    from castsql.embedded.compactor import maintain

    return maintain(log, m)


register_after_commit("mirrors", mirrors, after_hook_commits=True)
register_after_commit("autoCompact", auto_compact, after_hook_commits=False)
