"""Issue #15 items 3 and 6 on the real daemon (--sim: guardian, rig on a pty), a private
Mosquitto and a real TCP proxy between them: no motion command sent before the latest stop, or
while the daemon was unreachable, and no retained command ever moves the robot.

What counts is what reaches the robot: the rig's record of COMMAND frames in POSITION mode
since the reset (the rig's own e-stop hold is off, so only the host side keeps it still).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MQTT_USERS
from daemon_proc import DaemonProc
from mosquitto import Mosquitto, Probe, wait_until
from tcp_proxy import TcpProxy

from edge_agent.comms.mqtt_common import Topics

T1 = Topics("edge/dev1")  # its command and reply topics

FAST_RESET = "executor.reset_min_interval_s=0"  # no rate-limit retries in these tests


@pytest.fixture
def operator(broker: Mosquitto) -> Iterator[Probe]:
    p = Probe(broker, "operator", MQTT_USERS["operator"])
    assert not p.connect().is_failure
    assert not p.subscribe("edge/dev1/#")[0].is_failure
    yield p
    p.close()


def body(cid: str, **args: Any) -> bytes:
    return json.dumps({"v": 1, "id": cid, **args}).encode()


def payload(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(msg.payload)
    return out


def reply_for(probe: Probe, cid: str, timeout: float = 30.0) -> dict[str, Any]:
    msg = probe.expect(lambda m: "/reply/" in m.topic and payload(m).get("id") == cid, timeout)
    return payload(msg)


def presence(probe: Probe, state: str) -> None:
    probe.expect(lambda m: m.topic == "edge/dev1/status" and payload(m)["state"] == state, 30)


def status(d: DaemonProc) -> dict[str, Any]:
    out: dict[str, Any] = d.socket_cmd("status")["result"]
    return out


def up_and_still(d: DaemonProc) -> None:
    """Ready, link up, commands subscribed; the rig's e-stop hold off (the host alone holds)."""
    d.wait_ready()
    assert d.rig({"cmd": "set", "key": "firmware_estop_hold", "value": False})["ok"]
    wait_until(lambda: (s := status(d))["link_up"] and s["mqtt_connected"]
               and s["mode"] == "idle", 60, "link up, MQTT subscribed, idle")


def estop_and_reset(d: DaemonProc) -> float:
    """A local e-stop and its reset over the control socket; the rig's clock at the reset."""
    assert d.socket_cmd("estop")["ok"]
    assert status(d)["mode"] == "estop"
    r = d.socket_cmd("reset")
    assert r["ok"], r
    assert status(d)["mode"] == "idle"
    return time.monotonic()  # the rig's record is stamped with CLOCK_MONOTONIC too


def moved_since(d: DaemonProc, since: float) -> list[dict[str, Any]]:
    rec = d.rig({"cmd": "record", "type": "COMMAND", "where": {"mode": "POSITION"},
                 "since": since})
    assert rec["ok"], rec
    frames: list[dict[str, Any]] = rec["frames"]
    return frames


@pytest.mark.parametrize("expiry", [None, 60], ids=["no_expiry", "expiry_60s"])
def test_a_command_queued_during_a_broker_blip_never_runs_after_estop_and_reset(
        tmp_path: Path, broker: Mosquitto, operator: Probe, expiry: int | None) -> None:
    """The issue's scenario: the link to the broker is cut; the operator's task.start (QoS 1)
    is published meanwhile; a local e-stop and reset follow; the link comes back. Before, the
    broker had queued it in the daemon's persistent session and the robot moved (~300
    frames); now every connection is a clean session and nothing is delivered."""
    proxy = TcpProxy(broker.host, broker.port)
    d = DaemonProc(tmp_path, broker, extra=(f"mqtt.port={proxy.port}", FAST_RESET)).start()
    try:
        up_and_still(d)
        presence(operator, "online")
        proxy.cut()
        presence(operator, "offline")  # the broker saw the link go: it published our will
        operator.publish(T1.cmd("task.start"), body("queued-start"), expiry=expiry)
        reset_at = estop_and_reset(d)
        proxy.restore()
        presence(operator, "online")
        wait_until(lambda: status(d)["mqtt_connected"], 30, "resubscribed after the blip")
        # A marker behind it: whatever the broker had queued for us arrives (and is handled,
        # one at a time, in order) before the marker's reply comes back.
        operator.publish(T1.cmd("status"), body("after-blip"))
        assert reply_for(operator, "after-blip")["ok"]
        answers = [payload(m) for m in operator.drain()
                   if m.topic == T1.reply("task.start")]
        for a in answers:
            assert not a["ok"] and a["error"]["code"] == "stale", a
        assert status(d)["mode"] == "idle"
        assert moved_since(d, reset_at) == [], "the queued task.start moved the robot"
    finally:
        d.stop()
        proxy.close()


def test_a_command_published_before_the_stop_is_refused_stale_after_the_reset(
        tmp_path: Path, broker: Mosquitto, operator: Probe) -> None:
    """A command held on its way (a bridged broker, a store-and-forward gateway) arrives after
    the stop and the reset: its `ts` says it was published before them, so it is `stale`. A
    `ts` ahead of the daemon's clock is refused `clock_skew`; a fresh one runs. (Skew
    allowance 0 here: the test and the daemon share one clock.)"""
    d = DaemonProc(tmp_path, broker, extra=("mqtt.clock_skew_s=0", FAST_RESET)).start()
    try:
        up_and_still(d)
        published_at = time.time()  # ... and then held somewhere on the way
        reset_at = estop_and_reset(d)
        operator.publish(T1.cmd("task.start"), body("held", ts=published_at))
        held = reply_for(operator, "held")
        assert not held["ok"] and held["error"]["code"] == "stale", held
        operator.publish(T1.cmd("task.start"), body("ahead", ts=time.time() + 60))
        ahead = reply_for(operator, "ahead")
        assert not ahead["ok"] and ahead["error"]["code"] == "clock_skew", ahead
        assert status(d)["mode"] == "idle"
        assert moved_since(d, reset_at) == [], "a stale task.start moved the robot"
        operator.publish(T1.cmd("task.start"), body("fresh", ts=time.time()))
        assert reply_for(operator, "fresh")["ok"]
        # the same record does show motion once a fresh command permits it
        wait_until(lambda: bool(moved_since(d, reset_at)), 30, "the fresh task to move")
    finally:
        d.stop()


def test_a_retained_task_start_is_refused_and_never_runs(
        tmp_path: Path, broker: Mosquitto, operator: Probe) -> None:
    """Brokers clear the retain flag on live delivery; with retain-as-published the daemon
    still sees it, answers `retained` and does not run it (before: the robot moved)."""
    d = DaemonProc(tmp_path, broker).start()
    try:
        up_and_still(d)
        since = time.monotonic()
        operator.publish(T1.cmd("task.start"), body("retained-start"), retain=True)
        r = reply_for(operator, "retained-start")
        assert not r["ok"] and r["error"]["code"] == "retained", r
        # a marker: the retained one was handled (and refused) before it
        operator.publish(T1.cmd("status"), body("after-retained"))
        assert reply_for(operator, "after-retained")["ok"]
        assert status(d)["mode"] == "idle"
        assert moved_since(d, since) == [], "a retained task.start moved the robot"
    finally:
        operator.publish(T1.cmd("task.start"), b"", retain=True)  # clear it
        d.stop()
