"""SQL that writes a table: a statement recognised before it is planned
(``intercept``), row statements (``writes``: DELETE, UPDATE, INSERT, MERGE
INTO, TRUNCATE) and table statements (``ddl``: CREATE/ALTER TABLE, RESTORE,
OPTIMIZE, VACUUM), handed to the runner the embedded engine registers."""
