"""The tables a session knows: their names, version logs and places.

A table is a URI holding ``_latest_manifest`` (or ``manifest/v00000000.json``),
named by its last path component; a warehouse is a URI whose immediate
sub-directories are tables, each named by its sub-directory. Names are
case-insensitive, like SQL's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import datetime

from castsql.errors import CastSQLError, StorageError, TableNotFound, VersionNotFound
from castsql.format import TableLog
from castsql.format.layout import POINTER_KEY, manifest_key
from castsql.format.manifest import parse_time
from castsql.snapshot import Snapshot, resolve
from castsql.storage import ObjectNotFound, Storage, StorageUnreachable


def is_table(storage: Storage) -> tuple[bytes, str] | bool:
    """Whether ``storage`` holds a table: its pointer's bytes and ETag where
    it has one (a GET costs what a HEAD does, and the table's first query
    then need not read the pointer again: ``TableLog.prime_pointer``),
    else whether version 0 exists (a creator that died before the pointer)."""
    # ObjectNotFound only when the store says the object is absent; a
    # request that fails (StorageUnreachable after all its attempts) raises
    # and ends the open, so a stalled endpoint costs one request's budget.
    try:
        return storage.get_with_etag(POINTER_KEY)
    except ObjectNotFound:
        return storage.exists(manifest_key(0))


def _empty(storage: Storage) -> bool:
    """Whether ``storage`` holds nothing at all: an existing empty local
    directory, or an object-store prefix with no object under it (which is
    all an empty "directory" is there). A local path that does not exist is
    no warehouse."""
    if storage.list_dirs() or next(iter(storage.list("")), None) is not None:
        return False
    return "://" in storage.root or os.path.isdir(storage.root)


class Catalog:
    """Tables by name (any case): their logs, the names as spelled, the opened URIs."""

    def __init__(self) -> None:
        self.logs: dict[str, TableLog] = {}  # name (lower) -> log
        self.display: dict[str, str] = {}  # name (lower) -> name as spelled
        self.uris: list[str] = []
        self.skipped: list[str] = []  # sub-directories of opened warehouses that are not readable tables
        self.generation = 0  # grows with every open: what a plan memoised by text depends on

    def _warehouse_tables(self, storage: Storage, pointers: dict[str, tuple[bytes, str]]) -> dict[str, Storage]:
        """The tables directly under the warehouse ``storage``, by name (their
        pointers, where the probe read them, into ``pointers``); entries that
        cannot be probed go to ``skipped``."""
        found: dict[str, Storage] = {}
        for child in storage.list_dirs():
            try:
                sub = storage.child(child)
                if held := is_table(sub):
                    found[child] = sub
                    if isinstance(held, tuple):
                        pointers[child] = held
            except StorageUnreachable:
                raise  # the endpoint, not this entry: every other probe would wait as long
            except StorageError as e:
                self.skipped.append(f"{storage.uri(child)}: {e}")
        return found

    def add(self, storage: Storage, name: str | None = None) -> list[str]:
        """Add the table or every table of the warehouse at ``storage``; returns the names added.

        A warehouse's sub-directories that cannot be tables (a symbolic link
        leading out of it, an unreadable entry) are skipped and listed in
        ``skipped``; two tables whose names differ only in case cannot both be
        queried (SQL names are case-insensitive) and are refused together.
        """
        pointers: dict[str, tuple[bytes, str]] = {}
        if held := is_table(storage):
            found = {name or storage.root.rstrip("/").rsplit("/", 1)[-1]: storage}
            if isinstance(held, tuple):
                pointers[next(iter(found))] = held
        else:
            found = self._warehouse_tables(storage, pointers)
            if not found and _empty(storage):
                # A warehouse with no table yet: opened, with nothing to query.
                self.uris.append(storage.root)
                self.generation += 1
                return []
            if not found:
                raise TableNotFound(f"{storage.root}: neither a table nor a warehouse of tables")
            if name is not None:
                raise TableNotFound(
                    f"{storage.root}: a warehouse of tables; a name is given to one table (open {storage.root}/TABLE)"
                )
        taken = [n for n in found if n.lower() in self.display]
        if taken:
            where = ", ".join(f"{n!r} ({self.logs[n.lower()].storage.root})" for n in taken)
            raise TableNotFound(
                f"{storage.root}: a table of the same name is open already: {where}; "
                "open a table under another name (the shell's .open --add URI NAME, Session.open(uri, name))"
            )
        by_lower: dict[str, list[str]] = {}
        for n in [*self.display.values(), *found]:
            by_lower.setdefault(n.lower(), []).append(n)
        clash = [spellings for spellings in by_lower.values() if len(spellings) > 1]
        if clash:
            pairs = "; ".join(" and ".join(repr(n) for n in spellings) for spellings in clash)
            raise TableNotFound(
                f"{storage.root}: tables {pairs} differ only in case, and SQL names are case-insensitive; "
                "open one of them directly (castsql URI/NAME)"
            )
        for n, st in found.items():
            log = self.logs[n.lower()] = TableLog(st)
            if n in pointers:
                log.prime_pointer(*pointers[n])
            self.display[n.lower()] = n
        self.uris.append(storage.root)
        self.generation += 1
        return list(found)

    def add_log(self, log: TableLog, name: str | None = None) -> str:
        """Add the table ``log`` reads, through that log, under ``name``
        (default: the last component of its root); returns the name."""
        name = name or log.storage.root.rstrip("/").rsplit("/", 1)[-1]
        if name.lower() in self.display:
            raise TableNotFound(f"{log.uri}: a table named {name!r} is open already")
        self.logs[name.lower()] = log
        self.display[name.lower()] = name
        self.uris.append(log.storage.root)
        self.generation += 1
        return name

    @property
    def tables(self) -> list[str]:
        return sorted(self.display.values())

    def log(self, table: str) -> TableLog:
        """The version log of ``table``; TableNotFound names the known tables."""
        try:
            return self.logs[table.lower()]
        except KeyError:
            known = ", ".join(self.tables) or "none"
            raise TableNotFound(f"no table named {table!r} (tables: {known})") from None

    def name(self, table: str) -> str:
        """``table`` as the catalog spells it."""
        return self.display[table.lower()]

    def snapshot(self, table: str, version: int | None = None) -> Snapshot:
        """``table`` at ``version`` (default: latest), resolved; a collected version is refused."""
        return resolve(self.log(table), version, probe=version is not None)

    def version(self, table: str, version: int) -> Snapshot:
        """``table`` at ``version``; a collected version is refused naming the table."""
        log = self.log(table)
        # A version's rows never change, but GC can drop the version: the probe
        # (one existence check per time-travel query) refuses a collected
        # version in a long-lived session just as in a new one.
        try:
            return resolve(log, version, probe=True)
        except VersionNotFound as e:
            raise VersionNotFound(f"table {self.name(table)}: {str(e).split(': ', 1)[-1]}") from None

    def resolve_time(self, table: str, when: str | datetime) -> int:
        """The latest version of ``table`` committed at or before ``when``."""
        log = self.log(table)
        try:
            t = parse_time(when) if isinstance(when, str) else when
        except ValueError:
            raise CastSQLError(f"table {table}: {when!r} is not a timestamp") from None
        try:
            return log.version_at(t)
        except VersionNotFound as e:
            raise VersionNotFound(f"table {self.name(table)}: {str(e).split(': ', 1)[-1]}") from None

    def check_columns(self, table: str, snap: Snapshot, columns: Sequence[str]) -> None:
        """CastSQLError naming ``table`` and its columns unless every one of ``columns`` is one."""
        have = snap.schema.names
        for c in columns:
            if c not in have:
                raise CastSQLError(f"table {table}: no column {c!r} (columns: {', '.join(have)})")
