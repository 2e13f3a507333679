"""Repair reports end to end: a real daemon with --sim, a real broker, a real HTTP receiver.

Faults are injected while the webhook receiver is down; once it starts every report arrives,
each exactly once after de-duplication by its idempotency key, and also on MQTT `report` and on
disk. A kill -9 while a delivery is in flight, then a restart: still exactly once. The webhook's
token appears in no log line, no report and no status.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProc
from mosquitto import Mosquitto, Probe, wait_until
from test_reports_chat import classic_problems, missing_fields

from edge_agent.reports.record import Report
from hil.webhook_receiver import Receiver

TOKEN = "wecomkey-7f3a9c2e5b1d4f60"


def _extra(recv: Receiver, *more: str) -> tuple[str, ...]:
    # health.period_s: a daemon without a broker enters broker_lost after 3 broker probes
    # (a mode report of its own); the reports counted here are the stops' only
    return (f'reports.webhook_url="{recv.url(TOKEN)}"', "reports.retry_min_s=0.2",
            "reports.retry_max_s=1.0", "health.period_s=3600", *more)


def _reports(d: DaemonProc) -> dict[str, dict[str, Any]]:
    out = {}
    for p in (d.state_dir / "reports").glob("*.json"):
        out[p.stem] = json.loads(p.read_text())
    return out


def _assert_no_token(d: DaemonProc, status: dict[str, Any]) -> None:
    assert not [ln for ln in d.lines if TOKEN in ln], "the webhook token reached the log"
    assert TOKEN not in json.dumps(status)
    for p in list((d.state_dir / "reports").iterdir()) + list(
            (d.state_dir / "outbox").iterdir()):
        if p.is_file():
            assert TOKEN.encode() not in p.read_bytes(), p.name


def test_faults_while_the_receiver_is_down_all_arrive_exactly_once(
        tmp_path: Path, broker: Mosquitto) -> None:
    recv = Receiver()  # its port is chosen, nothing listens yet
    operator = Probe(broker, "operator", "operator-pw")
    operator.connect()
    operator.subscribe("edge/dev1/report")
    d = DaemonProc(tmp_path, broker, extra=_extra(
        recv, "executor.l3_threshold=1", "executor.l1_timeouts_s.grasp=2")).start()
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        # 1: an e-stop from the local socket
        assert d.socket_cmd("estop")["ok"]
        wait_until(lambda: d.socket_cmd("reset")["ok"], 30, "reset accepted")
        # 2: the physical button
        assert d.rig({"cmd": "inject", "target": "estop", "mode": "press"})["ok"]
        wait_until(lambda: d.socket_cmd("status")["result"]["mode"] == "estop", 30, "estop")
        assert d.rig({"cmd": "inject", "target": "estop", "mode": "release"})["ok"]
        wait_until(lambda: d.socket_cmd("reset")["ok"], 30, "reset accepted")
        wait_until(lambda: d.socket_cmd("status")["result"]["mode"] == "idle", 30, "idle")
        # 3: an L3 diagnosis: the gripper never closes hard enough, one failure is the limit
        assert d.rig({"cmd": "inject", "target": "gripper", "mode": "weak_close",
                      "severity": "unrecoverable"})["ok"]
        assert d.socket_cmd("task.start", {"task": "pick_place"})["ok"]
        wait_until(lambda: d.socket_cmd("status")["result"]["mode"] == "diagnostic", 90,
                   "diagnostic")
        wait_until(lambda: len(_reports(d)) == 3, 60, "three reports on disk")
        st = d.socket_cmd("status")["result"]["reports"]
        assert st["delivered"].get("webhook", 0) == 0 and st["failed_attempts"]["webhook"] >= 1
        assert recv.snapshot() == []

        recv.start()
        ids = set(_reports(d))
        wait_until(lambda: set(recv.unique()) >= ids, 60, "every report at the receiver")
        wait_until(lambda: d.socket_cmd("status")["result"]["reports"]["pending"] == 0, 60,
                   "the outbox empty")
        status = d.socket_cmd("status")
    finally:
        d.stop()
        recv.stop()
        operator.disconnect() if hasattr(operator, "disconnect") else None
    reports = _reports(d)
    kinds = sorted(r["kind"] for r in reports.values())
    assert kinds == ["diagnosis", "estop", "estop"]
    causes = sorted(r["details"].get("cause", "") for r in reports.values())
    assert causes == ["", "estop_input", "estop_local"]
    diag = next(r for r in reports.values() if r["kind"] == "diagnosis")
    assert diag["window"]["samples"] == len(diag["window"]["rows"]) > 10  # the raw samples
    # the webhook: each report's Markdown once after de-dup, and its plot as an image
    uniq = recv.unique()
    assert sorted(recv.report_ids()) == sorted(reports)
    assert {k for k, u in uniq.items() if u["body"]["msgtype"] == "image"} == {
        f"{i}.plot" for i in reports}
    for i, r in reports.items():  # the phone-sized summary (#27), not the full Markdown
        content = uniq[i]["body"]["markdown"]["content"]
        assert classic_problems(content) == [], content
        assert missing_fields(content, Report.from_dict(r), "edge/dev1/report") == [], content
    # MQTT `report`: every report, with its title, Markdown and plot reference
    got: dict[str, dict[str, Any]] = {}
    wait_until(lambda: _drain(operator, got) >= set(reports), 30, "reports on MQTT")
    for i, p in got.items():
        assert p["v"] == 1 and p["title"] == reports[i]["title"] and p["markdown"].startswith("# ")
        assert p["plot"]["file"] == f"{i}.png"
    _assert_no_token(d, status)


def _drain(probe: Probe, got: dict[str, dict[str, Any]]) -> set[str]:
    while not probe.messages.empty():
        m = probe.messages.get_nowait()
        p = json.loads(m.payload)
        got[p["id"]] = p
    return set(got)


def _webhook_done(d: DaemonProc) -> bool:
    st = d.socket_cmd("status")["result"]["reports"]
    return st["delivered"].get("webhook", 0) >= 1 and not any(
        json.loads(p.read_text())["sinks"]["webhook"]["state"] != "done"
        for p in (d.state_dir / "outbox").glob("0*.json"))


def test_kill_9_mid_delivery_then_restart_still_exactly_once(tmp_path: Path) -> None:
    recv = Receiver()
    recv.hold = __import__("threading").Event()  # the first request is received, not answered
    recv.start()
    d = DaemonProc(tmp_path, None, extra=_extra(recv)).start()
    try:
        d.wait_ready()
        assert d.socket_cmd("estop")["ok"]
        assert recv.held.wait(60), "the webhook request never came"
        first = recv.snapshot()[0]["headers"]["Idempotency-Key"]
        assert d.proc is not None
        os.killpg(d.proc.pid, signal.SIGKILL)  # daemon, guardian and rig: a power cut
        d.proc.wait(10)
        recv.hold.set()  # answered now, to a process that is gone
        recv.hold = None
        d2 = DaemonProc(tmp_path, None, extra=_extra(recv)).start()
        try:
            d2.wait_ready()
            wait_until(lambda: len(_reports(d2)) == 2, 60, "both reports on disk")
            ids = set(_reports(d2))
            wait_until(lambda: set(recv.unique()) >= ids, 60, "every report at the receiver")
            wait_until(lambda: _webhook_done(d2), 60, "the webhook deliveries done")
            status = d2.socket_cmd("status")
        finally:
            d2.stop()
    finally:
        d.stop()
        recv.stop()
    reports = _reports(d2)
    assert first in reports and reports[first]["kind"] == "estop"
    other = next(r for i, r in reports.items() if i != first)
    assert other["details"]["cause"] == "unclean_restart"
    sent = [r["headers"]["Idempotency-Key"] for r in recv.snapshot()
            if r["body"]["msgtype"] == "markdown"]
    assert sent.count(first) >= 2  # sent again after the restart, under the same key
    assert sorted(recv.report_ids()) == sorted(reports)  # once each after de-duplication
    _assert_no_token(d2, status)
    assert not [ln for ln in d.lines if TOKEN in ln]
