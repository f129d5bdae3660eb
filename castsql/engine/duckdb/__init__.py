"""DuckDB wiring: the connection (``duck``), CastSQL's own DuckDB extensions
(``native``), DuckLake lineages (``lake``), the threads of remote reads
(``threads``), object stores made readable by DuckDB (``stores``, and the
fsspec adapter over CastSQL's storage, ``objectfs``).

Not DuckDB itself: ``import duckdb`` is always the library."""
