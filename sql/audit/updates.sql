-- Each row an update changed, with its whole row before and after (updates
-- come paired by primary key: an update_preimage row and an update_postimage row).
WITH c AS (SELECT * FROM table_changes('events', 0) WHERE _change_type LIKE 'update_%')
SELECT pre._commit_version, pre._commit_timestamp, pre.id, pre AS before, post AS after
FROM c pre JOIN c post USING (_commit_version, id)
WHERE pre._change_type = 'update_preimage' AND post._change_type = 'update_postimage'
ORDER BY pre._commit_version, pre.id;
