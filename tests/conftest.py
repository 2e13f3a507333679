"""Shared pytest fixtures (keep small; helpers live in their own modules next to the tests)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from mosquitto import Mosquitto

MQTT_USERS = {"dev1": "dev1-secret-pw", "dev2": "dev2-secret-pw", "operator": "operator-pw"}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A private Mosquitto with password file + ACL on a free 127.0.0.1 port."""
    b = Mosquitto(tmp_path / "mosquitto", MQTT_USERS)
    b.start()
    try:
        yield b
    finally:
        b.stop()
