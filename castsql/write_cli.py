"""The old home of the writer subcommands, kept importable for one release:
they live in :mod:`castsql.cli` now (:mod:`castsql.cli.writes`,
:mod:`castsql.cli.tables`, :mod:`castsql.cli.common`, dispatched through
:mod:`castsql.cli.registry`).

Example::

    >>> from castsql.write_cli import parse_age
    >>> parse_age("7d")
    datetime.timedelta(days=7)
"""

from __future__ import annotations

import sys

from castsql.cli import run_command as main
from castsql.cli.common import UsageError, parse_age, parse_assignment
from castsql.cli.registry import parser as _parser

__all__ = ["UsageError", "_parser", "main", "parse_age", "parse_assignment"]

if __name__ == "__main__":
    sys.exit(main())
