"""The snapshot resolver: a table version as pruned files plus rows to drop."""

from castsql.snapshot.prune import Predicate, prune_files, prune_mask, prune_refs
from castsql.snapshot.resolve import ResolvedFile, Snapshot, resolve

__all__ = ["Predicate", "ResolvedFile", "Snapshot", "prune_files", "prune_mask", "prune_refs", "resolve"]
