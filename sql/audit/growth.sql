-- Live rows per version and the change from the version before.
SELECT version, committed_at, live_rows,
       live_rows - lag(live_rows) OVER (ORDER BY version) AS net_change
FROM table_history('events')
ORDER BY version;
