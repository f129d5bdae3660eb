-- Rows each delete removed, with the commit that removed them (first 100).
SELECT _commit_version, _commit_timestamp, * EXCLUDE (_change_type, _commit_version, _commit_timestamp)
FROM table_changes('events', 0)
WHERE _change_type = 'delete'
ORDER BY _commit_version
LIMIT 100;
