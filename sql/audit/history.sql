-- Every kept version: when, what, and exactly how many rows it inserted,
-- updated (a key deleted and inserted again by one version) and deleted.
SELECT version, committed_at, operation, rows_inserted, rows_updated, rows_deleted, live_rows, data_files,
       tombstone_files
FROM table_history('events')
ORDER BY version;
