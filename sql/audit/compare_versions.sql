-- Rows present at version 2 and gone at version 5, by primary key.
SELECT a.*
FROM events AS OF VERSION 2 a
ANTI JOIN events AS OF VERSION 5 b ON a.id = b.id
ORDER BY a.id;
