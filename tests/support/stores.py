"""The stores a module's tests run on.

``from stores import every_store`` in a test module overrides the ``backend``
fixture of conftest.py (local and S3) with every store CastSQL speaks: its
``storage``, ``storage_root``, ``s3_config`` and ``worker_env`` tests then run
on local disk, S3 (SeaweedFS), GCS (fake-gcs-server) and Azure (Azurite).
Kept out of conftest.py, where a second fixture named ``backend`` would
replace the first for every module.
"""

from __future__ import annotations

import pytest
from conftest import BACKENDS

ALL_STORES = [
    *BACKENDS,
    pytest.param("gcs", marks=pytest.mark.gcs),
    pytest.param("azure", marks=pytest.mark.azure),
]


@pytest.fixture(params=ALL_STORES, name="backend")
def every_store(request: pytest.FixtureRequest) -> str:
    return request.param
