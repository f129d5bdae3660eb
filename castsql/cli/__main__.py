"""``python -m castsql.cli``: the ``castsql`` command (tests and ``castsql demo``
start it so, in a fresh process).

Example::

    $ python -m castsql.cli ./demo-warehouse -c "SELECT 1"
"""

import sys

from castsql.cli import main

sys.exit(main())
