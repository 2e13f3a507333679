"""Shared pytest fixtures (keep small; helpers live in their own modules next to the tests)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_proc import DaemonProc
from mosquitto import Mosquitto

# a daemon started without a broker logs two lines a second trying to reach one: a failure
# report shows the lines around them
_NOISE = ('"mqtt_connect_failed"', "Client is not connected", '"mqtt_publish_dropped"')

MQTT_USERS = {"dev1": "dev1-secret-pw", "dev2": "dev2-secret-pw", "operator": "operator-pw"}


@pytest.fixture(autouse=True, scope="session")
def private_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Daemons started by the tests publish their `<device>.sock` pointers here, not in
    /run/edge-agent: `edge-agent cmd` in a test finds the test's daemons only."""
    d = tmp_path_factory.mktemp("runtime")
    d.chmod(0o700)
    old = os.environ.get("EDGE_AGENT_RUNTIME_DIR")
    os.environ["EDGE_AGENT_RUNTIME_DIR"] = str(d)
    try:
        yield d
    finally:
        if old is None:
            os.environ.pop("EDGE_AGENT_RUNTIME_DIR", None)
        else:
            os.environ["EDGE_AGENT_RUNTIME_DIR"] = old


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Mosquitto]:
    """A private Mosquitto with password file + ACL on a free 127.0.0.1 port."""
    b = Mosquitto(tmp_path / "mosquitto", MQTT_USERS)
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """A failed test that ran daemons gets their last log lines in its report."""
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.when == "call":
        for i, d in enumerate(DaemonProc.started):
            lines = [ln for ln in d.lines if not any(n in ln for n in _NOISE)]
            left_out = len(d.lines) - len(lines)
            report.sections.append((
                f"daemon {i} ({d.device}) last log lines"
                + (f" ({left_out} MQTT reconnect lines left out)" if left_out else ""),
                "\n".join(lines[-60:])))
    if call.when == "teardown":
        DaemonProc.started.clear()
