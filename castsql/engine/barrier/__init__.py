"""The statement barrier, one unit a reviewer reads alone: names and functions
no statement may use (``guard``), what a statement may do in the session's
mode (``policy``), and safe mode's DuckDB settings and checks (``safety``).
docs/RELIABILITY.md lists what each one enforces."""
