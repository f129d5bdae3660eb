"""The one table of URI schemes: each object store's scheme, the other
spellings users and engines write it with, the backend that serves it, and a
URI's canonical form. Every layer asks here rather than spelling a scheme.

The canonical form is what manifests and mirrors hold (FORMAT.md): changing
it changes bytes already written, so :func:`canonical_uri` keeps its rules
exactly (only an alias is rewritten; a canonical name keeps its case).

Example::

    >>> canonical_uri("abfss://c@acct.dfs.core.windows.net/t/x"), scheme_of("s3a://b/t").backend
    ('az://c/t/x', 's3')
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Scheme:
    """One object store's URI scheme.

    ``name`` is the canonical spelling (``s3``), ``aliases`` the others
    (``s3a``, Hadoop's), ``backend`` the module of :mod:`castsql.storage` that
    serves it and ``example`` a good URI, for errors.
    """

    name: str
    aliases: tuple[str, ...]
    backend: str
    example: str

    @property
    def prefix(self) -> str:
        """``name://``, how the store's roots are spelt."""
        return self.name + "://"

    @property
    def names(self) -> tuple[str, ...]:
        """Every spelling, the canonical one first (fsspec's ``protocol``)."""
        return (self.name, *self.aliases)

    @property
    def prefixes(self) -> tuple[str, ...]:
        """Every ``spelling://``, the canonical one first."""
        return tuple(n + "://" for n in self.names)


S3 = Scheme("s3", ("s3a",), "s3", "s3://bucket/prefix")
GCS = Scheme("gs", ("gcs",), "gcs", "gs://bucket/prefix")
# ADLS Gen2's abfss://container@account.dfs.core.windows.net/ names the account too.
AZURE = Scheme("az", ("azure", "abfss", "abfs"), "azure", "az://container/prefix")
SCHEMES = (S3, GCS, AZURE)

OBJECT_STORE_SCHEMES = tuple(p for s in SCHEMES for p in s.prefixes)

_ALIASES = {a + "://": s.prefix for s in SCHEMES for a in s.aliases}


def scheme_of(uri: str) -> Scheme | None:
    """The object store ``uri`` names, as spelt (case matters); None for a
    local path, a ``file:`` URI or a scheme no store serves."""
    for s in SCHEMES:
        if uri.startswith(s.prefixes):
            return s
    return None


def is_object_store(uri: str) -> bool:
    """Whether ``uri`` names an object store (not a local path)."""
    return scheme_of(uri) is not None


def canonical_uri(uri: str) -> str:
    """``uri`` under the one scheme CastSQL spells each store with: ``s3a://``
    is ``s3://``, ``gcs://`` is ``gs://``, ``azure://`` and ADLS Gen2's
    ``abfss://container@account.dfs.core.windows.net/`` are ``az://container/``.

    >>> canonical_uri("abfss://c@acct.dfs.core.windows.net/t/x"), canonical_uri("gcs://b/t")
    ('az://c/t/x', 'gs://b/t')
    """
    scheme_part, sep, after = uri.partition("://")
    canonical = _ALIASES.get(scheme_part.lower() + sep) if sep else None
    if canonical is None:
        return uri
    container, slash, tail = after.partition("/")
    return canonical + container.split("@", 1)[0] + slash + tail


def canonical_scheme(uri: str) -> str:
    """The canonical scheme of ``uri`` (``gcs`` is ``gs``, ``abfss`` is
    ``az``); ``""`` for a path without one.

    >>> canonical_scheme("abfss://c@a.dfs.core.windows.net/t"), canonical_scheme("/tmp/t")
    ('az', '')
    """
    scheme, sep, _ = uri.partition("://")
    return canonical_uri(scheme + sep).partition("://")[0] if sep else ""


def is_file_uri(uri: str) -> bool:
    """Whether ``uri`` is a local path or a ``file:`` URI, as opposed to some
    other scheme (``http://``, ``ftp://``) no store serves."""
    return "://" not in uri or uri.startswith("file://")


def local_path(uri: str) -> str:
    """The path of a ``file:`` URI in any of its spellings (``file:///t``,
    ``file://localhost/t``, and ``file:/t``, which is how Spark qualifies a
    path); anything else is a path as it is.

    >>> local_path("file:///t"), local_path("file:/t"), local_path("file://localhost/t"), local_path("/t")
    ('/t', '/t', '/t', '/t')
    """
    for prefix in ("file://localhost/", "file:///"):
        if uri.startswith(prefix):
            return "/" + uri[len(prefix) :]
    if uri.startswith("file:/") and not uri.startswith("file://"):
        return uri.removeprefix("file:")
    return uri.removeprefix("file://")
