"""DuckDB wiring: the connection (``duck``), CastSQL's own DuckDB extensions
(``native``), DuckLake lineages (``lake``), the threads of remote reads
(``threads``), object stores made readable by DuckDB (``stores``; the
fsspec adapter it registers is storage's, :mod:`castsql.storage.objectfs`).

Not DuckDB itself: ``import duckdb`` is always the library."""
