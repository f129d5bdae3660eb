"""Finding a version's data file by the name a tombstone gives it."""

from __future__ import annotations

from castsql.errors import FormatError
from castsql.format.layout import to_table_key
from castsql.format.manifest import DataFile, Manifest
from castsql.storage.base import is_normal_key


class FileIndex:
    """Data files of one version, by table key and by base name.

    Tombstones name a file by base name or full path; base names are UUIDs in
    practice, but two files with one base name make the short form ambiguous,
    and that is an error rather than a guess.
    """

    def __init__(self, manifest: Manifest, table_root: str) -> None:
        self._root = table_root
        files = manifest.data_files
        paths = [f.path for f in files]
        self.by_key: dict[str, DataFile]
        if all(map(is_normal_key, paths)):  # CastSQL's own manifests: the paths are the keys
            self.by_key = dict(zip(paths, files, strict=True))
        else:
            self.by_key = {to_table_key(f.path, table_root, what="data file"): f for f in files}
        self._names: dict[str, str | None] | None = None

    @property
    def _by_name(self) -> dict[str, str | None]:
        """Base name -> table key (None: ambiguous); built on first use (tombstones)."""
        if self._names is None:
            names: dict[str, str | None] = {k.rpartition("/")[2]: k for k in self.by_key}
            if len(names) < len(self.by_key):  # some base name twice: mark those ambiguous
                names = {}
                for key in self.by_key:
                    name = key.rpartition("/")[2]
                    names[name] = None if name in names else key
            self._names = names
        return self._names

    def key_of(self, f: DataFile) -> str:
        return to_table_key(f.path, self._root, what="data file")

    def lookup_key(self, name: str, where: str) -> str:
        """The table key of the data file a tombstone's ``file`` field names, or FormatError."""
        key: str | None
        if "/" in name:
            key = to_table_key(name, self._root, what=f"{where}: tombstone file")
            if key not in self.by_key:
                key = None
        else:
            if name in self._by_name and self._by_name[name] is None:
                raise FormatError(f"{where}: tombstone names {name!r}, which matches several data files")
            key = self._by_name.get(name)
        if key is None:
            raise FormatError(f"{where}: tombstone names {name!r}, which is not a data file of this version")
        return key

    def lookup(self, name: str, where: str) -> DataFile:
        """The data file a tombstone's ``file`` field names, or FormatError."""
        return self.by_key[self.lookup_key(name, where)]
