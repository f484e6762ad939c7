"""Every plan test starts and ends with no canned host state (tests/plan/fakehosts.py)."""

import pytest

from tests.plan import fakehosts


@pytest.fixture(autouse=True)
def _clean_state():
    fakehosts.STATE.clear()
    yield
    fakehosts.STATE.clear()
