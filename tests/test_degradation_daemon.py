"""Issue #18 "Done means", per single fault on the real daemon (`--sim`, a private Mosquitto,
`health.period_s` short): the fault injected with `failure.inject` → the right mode (or, for a
fault with no mode, the probe's level) within 3 probe periods, the `degraded` event,
`state.degraded`; the fault removed → `recovered` and the level back. Broker loss is
tests/test_health_daemon.py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from daemon_proc import DaemonProc
from mosquitto import Mosquitto, wait_until
from test_health_daemon import _log_time

PERIOD_S = 0.2


def _status(d: DaemonProc) -> dict[str, Any]:
    r = d.socket_cmd("status")
    assert r["ok"], r
    return r["result"]  # type: ignore[no-any-return]


def _probe(d: DaemonProc, name: str) -> dict[str, Any]:
    return (_status(d)["health"] or {}).get("probes", {}).get(name) or {}


def _events(d: DaemonProc, kind: str) -> list[dict[str, Any]]:
    return [e for e in d.events("event") if e.get("type") == kind]


def _inject(d: DaemonProc, **args: Any) -> None:
    r = d.socket_cmd("failure.inject", args)
    assert r["ok"], r


@pytest.fixture
def daemon(tmp_path: Path, broker: Mosquitto) -> Any:
    d = DaemonProc(tmp_path, broker, extra=(f"health.period_s={PERIOD_S}",
                                            "link.fault_after=2")).start()
    try:
        d.wait_ready()
        wait_until(lambda: _probe(d, "link").get("level") == "ok", 30, "the link probe ok")
        yield d
    finally:
        d.stop()


def test_link_corruption_sets_the_link_probe_to_error_and_back_to_ok_without_a_mode(
        daemon: DaemonProc) -> None:
    d = daemon
    runs_before = _probe(d, "link")["runs"]
    # every byte the firmware sends has a 1 % chance of a flipped bit (configs/rig): many
    # frames are bad, and link.fault_after=2 of them in a row is a link fault
    _inject(d, target="link", mode="corrupt", severity=1.0)
    wait_until(lambda: bool(_events(d, "link_fault")), 30, "a link_fault event")
    fault_at = _log_time(_events(d, "link_fault")[0])
    wait_until(lambda: _probe(d, "link").get("level") == "error", 30, "the link probe in error")
    p = _probe(d, "link")
    assert p["fast_fails"] >= 1, p  # the link_fault event counted at once (the fast path)
    assert p["figures"]["link_up"] is False and p["strikes"] >= 1, p
    assert p["mode"] is None and p["runs"] > runs_before, p
    st = _status(d)
    # no mode for a link fault (a protective stop already holds the robot); the frames lost
    # to corruption may leave a predicted channel to its estimator, and nothing else
    assert set(st["degraded"]) <= {"sensor_predicted"}, st["health"]
    assert {e["mode"] for e in _events(d, "degraded")} <= {"sensor_predicted"}
    assert st["stop"]["cause"] == "link_fault" or "link_fault" in st["stop"]["causes"], st

    r = d.rig({"cmd": "clear", "target": "link"})
    assert r["ok"], r
    wait_until(lambda: _status(d)["link_up"], 30, "the link up again")
    wait_until(lambda: _probe(d, "link").get("level") == "ok", 30, "the link probe ok again")
    up = [e for e in _events(d, "link_up") if _log_time(e) >= fault_at]
    assert up, "a link_up event after the fault"
    p = _probe(d, "link")
    assert p["strikes"] == 0 and p["figures"]["guardian_alive"] is True, p
    wait_until(lambda: _status(d)["degraded"] == [], 30, "nothing degraded")
