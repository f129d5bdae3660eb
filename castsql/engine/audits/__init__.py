"""History and audits: versions, diffs, row histories and the change feed
(``audit``), and the changed rows read from the files a version touched
(``changes``)."""
