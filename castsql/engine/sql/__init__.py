"""SQL text: DuckDB's tokens, the plan of a query's text, time travel lowered
into it, the filters DuckDB's parse tree gives for pruning, quoting,
literals, and the names CastSQL gives its own DuckDB objects."""
