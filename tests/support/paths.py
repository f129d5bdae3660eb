"""Where the repository and the test helpers are, for tests in any folder."""

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
REPO = SUPPORT.parents[1]
