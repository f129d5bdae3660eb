-- Every kept version: when, what, and exactly how many rows it added and deleted.
SELECT version, committed_at, operation, rows_added, rows_deleted, live_rows, data_files, tombstone_files
FROM table_history('events')
ORDER BY version;
