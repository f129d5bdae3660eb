-- Who changed the row whose primary key is 42, and when: every version that
-- inserted, updated or deleted it, with its values before and after. On a
-- table with the property castsql.changeDataFeed set, each version's old rows
-- are read from its own small change-data file (docs/PYTHON.md, "Audits").
SELECT h._commit_version, h._commit_timestamp, v.operation, v.writer, h._change_type, h.*
    EXCLUDE (_commit_version, _commit_timestamp, _change_type)
FROM table_row_history('events', 42) h
JOIN table_history('events') v ON v.version = h._commit_version
ORDER BY h._commit_version, h._change_type DESC;
