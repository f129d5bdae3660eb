"""``castsql ui``: a local, read-only web page of a warehouse's history,
diffs, row histories, schemas and SQL (docs/UI.md).

The UI sits above every other layer: it reads through :mod:`castsql.engine`
(a safe-mode session) and the format's version log, and nothing imports it
but the ``castsql`` command.

Example::

    $ castsql ui ./demo-warehouse --no-browser
    CastSQL UI on ./demo-warehouse: http://127.0.0.1:8642/?token=…
"""
