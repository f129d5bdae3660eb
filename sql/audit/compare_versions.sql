-- What version 5 holds that version 2 did not, and the reverse, row by row
-- (updates paired by primary key). Reads only the files that differ.
SELECT *
FROM table_diff('events', 2, 5)
ORDER BY id, _change_type DESC;
