"""Finding a version's data file by the name a tombstone gives it."""

from __future__ import annotations

from castsql.errors import FormatError
from castsql.format.layout import to_table_key
from castsql.format.manifest import DataFile, Manifest


class FileIndex:
    """Data files of one version, by table key and by base name.

    Tombstones name a file by base name or full path; base names are UUIDs in
    practice, but two files with one base name make the short form ambiguous,
    and that is an error rather than a guess.
    """

    def __init__(self, manifest: Manifest, table_root: str) -> None:
        self.by_key: dict[str, DataFile] = {}
        self._by_name: dict[str, DataFile | None] = {}
        self._root = table_root
        for f in manifest.data_files:
            key = to_table_key(f.path, table_root, what="data file")
            self.by_key[key] = f
            name = key.rsplit("/", 1)[-1]
            self._by_name[name] = None if name in self._by_name else f

    def key_of(self, f: DataFile) -> str:
        return to_table_key(f.path, self._root, what="data file")

    def lookup(self, name: str, where: str) -> DataFile:
        """The data file a tombstone's ``file`` field names, or FormatError."""
        if "/" in name:
            key = to_table_key(name, self._root, what=f"{where}: tombstone file")
            f = self.by_key.get(key)
        else:
            if name in self._by_name and self._by_name[name] is None:
                raise FormatError(f"{where}: tombstone names {name!r}, which matches several data files")
            f = self._by_name.get(name)
        if f is None:
            raise FormatError(f"{where}: tombstone names {name!r}, which is not a data file of this version")
        return f
