"""The fleet tools' pure parts: the wave plan, what acknowledges a fleet e-stop, the status row
and table, the prefix pattern, the CLI's arguments (tests/test_fleet_daemons.py runs them all
against five real daemons)."""

from __future__ import annotations

import time

import pytest

from edge_agent.cli import _parser
from edge_agent.comms.client import MqttTarget
from edge_agent.fleet.bus import FleetBus, Robot
from edge_agent.fleet.estop import is_ack
from edge_agent.fleet.rollout import RobotRun, plan_waves
from edge_agent.fleet.view import lines, row, summary


def test_waves_canary_then_a_percentage_of_the_rest() -> None:
    ids = [f"r{i}" for i in range(10)]
    assert plan_waves(ids, 1, 25) == [["r0"], ["r1", "r2", "r3"], ["r4", "r5", "r6"],
                                      ["r7", "r8", "r9"]]
    assert plan_waves(ids, 2, 100) == [["r0", "r1"], ids[2:]]
    assert plan_waves(ids[:3], 0, 1) == [["r0"], ["r1"], ["r2"]]  # at least one per wave
    assert plan_waves(ids[:1], 3, 50) == [["r0"]]


def test_failed_outcomes() -> None:
    assert [RobotRun("x", outcome=o).failed for o in
            ("committed", "already", "refused", "rolled_back", "timeout", "no_reply")] == [
        False, False, True, True, True, True]


def test_what_acknowledges_the_fleet_estop() -> None:
    assert is_ack("event", {"type": "stop", "kind": "estop", "cause": "estop_fleet"})
    assert not is_ack("event", {"type": "stop", "kind": "estop", "cause": "estop_mqtt"})
    assert not is_ack("event", {"type": "stop", "kind": "protective_stop",
                                "cause": "estop_fleet"})
    assert is_ack("state", {"stop": {"kind": "estop", "cause": "estop_mqtt",
                                     "causes": ["estop_mqtt", "estop_fleet"]}})
    assert not is_ack("state", {"stop": {"kind": "estop", "cause": "estop_mqtt"}})
    assert not is_ack("state", {"mode": "idle"})
    assert not is_ack("report", {"kind": "estop"})


def test_status_row_and_table() -> None:
    now = time.time()
    r = Robot("r1", "edge/r1", status={"state": "online", "version": "0.1.0"},
              state={"mode": "holding", "state": "lift", "task": {"task_id": "job-7"},
                     "degraded": ["cpu_inference"],
                     "stop": {"kind": "estop", "cause": "estop_fleet"}},
              last_seen=now - 3,
              details={"model": {"current": {"name": "pp", "version": "1.1", "sha256": "ab" * 32},
                                 "previous": None,
                                 "trial": {"state": "on_trial", "sha256": "ab" * 32,
                                           "tasks_done": 3, "tasks_required": 20}},
                       "reports": {"built": 2}})
    off = Robot("r2", "edge/r2", status={"state": "offline"})
    rows = [row(r, now), row(off, now)]
    assert rows[0]["task"] == "job-7" and rows[0]["stop"]["cause"] == "estop_fleet"
    assert rows[1]["online"] is False and rows[1]["model"] is None
    table = lines(rows, now)
    assert table[0].split() == ["robot", "online", "mode", "stop", "degraded", "task", "model",
                                "trial", "report", "seen"]
    assert "estop:estop_fleet" in table[1] and "pp@1.1:abababab" in table[1]
    assert "on_trial:abababab 3/20" in table[1] and "built=2" in table[1] and "3s" in table[1]
    assert table[2].split()[:2] == ["r2", "offline"]
    assert "2 robots: 1 online, 1 stopped, 1 degraded, 1 on trial" in summary(rows)


@pytest.mark.parametrize("pattern", ["edge/#", "edge/+/+", "edge", "/+", "edge//+"])
def test_prefix_pattern_needs_one_plus_level(pattern: str) -> None:
    with pytest.raises(ValueError):
        FleetBus(MqttTarget("+"), pattern)


def test_cli_arguments() -> None:
    a = _parser().parse_args(["fleet", "rollout", "m.onnx", "--canary", "2", "--wave", "20%",
                              "--abort-at", "10", "--host", "h", "--pattern", "site/+"])
    assert (a.canary, a.wave_pct, a.abort_at_pct, a.pattern, a.host) == (2, 20.0, 10.0,
                                                                        "site/+", "h")
    with pytest.raises(SystemExit):
        _parser().parse_args(["fleet", "rollout", "m.onnx", "--wave", "0%"])
    a = _parser().parse_args(["fleet", "estop", "--deadline-s", "0.5", "--json"])
    assert a.deadline_s == 0.5 and a.json
