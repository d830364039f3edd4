"""What the agent's tests share: a real Mosquitto per test (tests/support/broker.py)."""

from __future__ import annotations

import pytest
from support.broker import running_broker


@pytest.fixture
def broker(tmp_path):
    """A real Mosquitto on a free port, for this test alone."""
    with running_broker(tmp_path) as b:
        yield b
