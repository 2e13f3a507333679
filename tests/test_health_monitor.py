"""The health monitor (edge_agent/health/monitor.py): periods on a fake clock, the event fast
path, the budget (a hung or raising probe never stops the others), status and transitions; and
the daemon's own probes (health/probes.py) on counters."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from mosquitto import wait_until

from edge_agent.health.modes import Transition
from edge_agent.health.monitor import HealthMonitor
from edge_agent.health.probe import ProbeResult
from edge_agent.health.probes import BrokerProbe, LinkProbe, LoopProbe, StartupProbe, StoreProbe
from edge_agent.vocab import DegradationMode as DM
from edge_agent.vocab import EventType


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeProbe:
    """A probe whose answer the test sets; counts its runs."""

    def __init__(self, name: str, mode: DM | None = None, period_s: float | None = None,
                 subject: str = "") -> None:
        self.name, self.mode, self.period_s, self.subject = name, mode, period_s, subject
        self.answer = ProbeResult.ok("fine")
        self.runs: list[float] = []
        self.gate: threading.Event | None = None  # set: the check blocks until it is set
        self.raises = False

    def check(self, now: float) -> ProbeResult:
        self.runs.append(now)
        if self.gate is not None:
            self.gate.wait(10)
        if self.raises:
            raise RuntimeError("boom")
        return self.answer


def _monitor(probes: list[Any], clock: Clock, **kw: Any) -> tuple[HealthMonitor, list[Transition]]:
    seen: list[Transition] = []
    m = HealthMonitor(probes, clock=clock, wall=lambda: 1_000_000.0 + clock.t,
                      on_transition=lambda t, _m: seen.append(t), **kw)
    return m, seen


def test_each_probe_runs_at_its_own_period() -> None:
    clock = Clock()
    fast, slow, named = FakeProbe("a", period_s=1.0), FakeProbe("b"), FakeProbe("sensor:cam")
    m, _ = _monitor([fast, slow, named], clock, period_s=10.0, periods={"sensor": 5.0})
    try:
        assert m.run_due() == 3  # every probe runs once at the start
        for _ in range(20):
            clock.t += 1.0
            m.run_due()
        assert len(fast.runs) == 21 and len(slow.runs) == 3 and len(named.runs) == 5
        st = m.status()["probes"]
        assert st["a"]["period_s"] == 1.0 and st["sensor:cam"]["period_s"] == 5.0
        assert st["b"]["next_run_in_s"] == 10.0 and st["b"]["next_run_wall"] == 1_000_130.0
    finally:
        m.stop()


def test_three_failures_enter_the_mode_and_three_good_runs_leave_it() -> None:
    clock = Clock()
    p = FakeProbe("broker", DM.BROKER_LOST, period_s=1.0)
    m, seen = _monitor([p], clock, fail_after=3, recover_after=3)
    try:
        p.answer = ProbeResult.error("not connected", connected=False)
        for _ in range(3):
            m.run_due()
            clock.t += 1.0
        assert [t.entered for t in seen] == [True] and m.degraded() == ["broker_lost"]
        assert seen[0].figures == {"connected": False} and seen[0].cause == "not connected"
        st = m.status()
        assert st["degraded"] == ["broker_lost"] and st["probes"]["broker"]["strikes"] == 3
        assert st["probes"]["broker"]["level"] == "error" and st["probes"]["broker"]["holding"]
        p.answer = ProbeResult.ok("up")
        for _ in range(3):
            m.run_due()
            clock.t += 1.0
        assert [t.entered for t in seen] == [True, False] and m.degraded() == []
    finally:
        m.stop()


def test_fail_now_counts_at_once_and_reruns_the_probe_now() -> None:
    clock = Clock()
    p = FakeProbe("broker", DM.BROKER_LOST, period_s=10.0)
    m, seen = _monitor([p], clock, fail_after=3)
    try:
        m.run_due()
        clock.t += 1.0
        p.answer = ProbeResult.error("not connected")
        m.fail_now("broker", "MQTT connection lost", rc=7)
        st = m.status()["probes"]["broker"]
        assert st["strikes"] == 1 and st["fast_fails"] == 1 and st["next_run_in_s"] == 0.0
        assert st["message"] == "MQTT connection lost" and st["figures"] == {"rc": 7}
        assert m.run_due() == 1  # not waiting for its 10 s period
        assert m.status()["probes"]["broker"]["strikes"] == 2 and not seen
        clock.t += 10.0
        m.run_due()
        assert [t.entered for t in seen] == [True]
        m.fail_now("no-such-probe", "ignored")  # not part of this daemon: nothing happens
    finally:
        m.stop()


def test_a_hung_probe_is_stale_and_the_others_keep_running() -> None:
    clock = Clock()
    hung, other = FakeProbe("hung", DM.REMOTE_POLICY_LOST, period_s=1.0), FakeProbe("other")
    hung.gate = threading.Event()
    m, seen = _monitor([hung, other], clock, budget_s=0.05, period_s=1.0)
    try:
        m.run_due()
        st = m.status()["probes"]
        assert st["hung"]["level"] == "stale" and st["hung"]["next_run_in_s"] is None
        assert st["other"]["level"] == "ok"
        clock.t += 1.0
        assert m.run_due() == 1 and len(other.runs) == 2 and len(hung.runs) == 1
        assert m.status()["probes"]["hung"]["strikes"] == 0 and not seen  # STALE: no strike
        hung.gate.set()  # it returns at last: back on the schedule
        wait_until(lambda: m.next_run("hung") is not None or m.run_due() > 0, 5, "reaped")
        m.run_due()
        assert len(hung.runs) == 2
    finally:
        hung.gate.set()
        m.stop()


def test_a_raising_probe_is_an_error_strike() -> None:
    clock = Clock()
    p = FakeProbe("x", DM.CACHED_POLICY, period_s=1.0)
    p.raises = True
    m, seen = _monitor([p], clock, fail_after=2)
    try:
        m.run_due()
        clock.t += 1.0
        m.run_due()
        st = m.status()["probes"]["x"]
        assert st["level"] == "error" and "RuntimeError: boom" in st["message"]
        assert [t.mode for t in seen] == [DM.CACHED_POLICY]
    finally:
        m.stop()


def test_the_thread_runs_probes_on_time_and_stops_idempotently() -> None:
    p = FakeProbe("broker", DM.BROKER_LOST, period_s=0.05)
    m = HealthMonitor([p], period_s=0.05)
    m.start()
    m.start()  # once only
    wait_until(lambda: len(p.runs) >= 5, 5, "five runs on the monitor's thread")
    p.answer = ProbeResult.error("down")
    m.fail_now("broker", "lost")
    wait_until(lambda: m.degraded() == ["broker_lost"], 5, "broker_lost entered")
    m.stop()
    m.stop()
    n = len(p.runs)
    assert not m.status()["running"] and m.cpu_s() >= 0.0
    assert len(p.runs) <= n + 1


def test_probes_added_later_run_at_once() -> None:
    clock = Clock()
    m, _ = _monitor([FakeProbe("a")], clock)
    try:
        m.run_due()
        late = FakeProbe("gpu", DM.CPU_INFERENCE)
        m.add_probes([late])
        assert m.run_due() == 1 and late.runs == [100.0]
        assert "gpu" in m.status()["probes"]
    finally:
        m.stop()


# -- the daemon's own probes --------------------------------------------------------------
def test_broker_probe() -> None:
    state: dict[str, Any] = {"ready": False, "pending": 0}
    detail: dict[str, Any] = {"connected": False, "bridge": True, "error": None,
                              "connections": 0}
    p = BrokerProbe(lambda: state["ready"], lambda: detail, lambda: state["pending"],
                    backlog_warn=5)
    r = p.check(0.0)
    assert r.level.label == "warn" and "connecting" in r.message  # nothing failed yet
    detail["error"] = "refused"
    r = p.check(0.5)
    assert r.failed and "refused" in r.message and p.mode is DM.BROKER_LOST
    detail["error"], detail["connections"] = None, 1  # lost after it was connected
    assert p.check(0.7).failed
    state["ready"] = True
    assert p.check(1.0).level.label == "ok"
    state["pending"] = 6
    assert p.check(2.0).level.label == "warn"


def test_link_probe_levels_and_rates() -> None:
    s: dict[str, Any] = {"frames": 0, "up": True, "alive": True}
    p = LinkProbe(lambda: s["frames"], lambda: s["up"], lambda: s["alive"], min_frames_hz=500.0)
    assert p.check(0.0).level.label == "ok"  # no window yet
    s["frames"] = 1000
    r = p.check(1.0)
    assert r.level.label == "ok" and r.figures["frames_hz"] == 1000.0
    s["frames"] = 1100
    assert p.check(2.0).level.label == "warn"  # 100 frames/s
    s["frames"] = 2100
    for _ in range(50):  # the firmware's bad_frame events: counted, not failures now
        assert p.fails_on({"type": EventType.FIRMWARE_EVENT, "code": "bad_frame"}) is None
    r = p.check(3.0)
    assert r.level.label == "warn" and r.figures["bad_frames"] == 50
    s["up"] = False
    assert p.check(4.0).failed
    s["alive"] = False
    assert "guardian" in p.check(5.0).message


def test_loop_probe() -> None:
    st = SimpleNamespace(ticks=0, overruns=0, missed_periods=0, tick_errors=0,
                         last_tick_mono=10.0, max_late_s=0.0)
    gc = {"n": 0}
    p = LoopProbe(lambda: st, lambda: gc["n"], rate_hz=200.0)
    assert p.check(10.0).level.label == "ok"
    st.ticks, st.missed_periods, st.last_tick_mono = 2000, 1, 20.0
    r = p.check(20.0)
    assert r.level.label == "warn" and r.figures["missed_periods"] == 1
    st.ticks, gc["n"], st.last_tick_mono = 4000, 1, 30.0
    assert "garbage" in p.check(30.0).message
    st.tick_errors = 1
    st.last_tick_mono = 40.0
    assert p.check(40.0).failed
    assert "no control tick" in p.check(45.0).message
    assert LoopProbe(lambda: None, lambda: 0, rate_hz=1.0).check(0.0).level.label == "ok"


def test_store_and_startup_probes(tmp_path: Path) -> None:
    j: dict[str, Any] = {"disabled": None}
    p = StoreProbe(tmp_path, lambda: j, warn_free_bytes=0, min_free_bytes=0)
    r = p.check(0.0)
    assert r.level.label == "ok" and float(r.figures["free_mb"] or 0) > 0
    j["disabled"] = "io_error"  # no storage fallback for an I/O error: a level, not a strike
    r = p.check(1.0)
    assert r.level.label == "warn" and "journal is off" in r.message, r
    assert p.fails_on({"type": "journal_disabled", "cause": "io_error"}) is None
    assert p.fails_on({"type": "journal_disabled", "cause": "disk_full"})  # a full disk: at once
    assert StoreProbe(tmp_path, lambda: None, min_free_bytes=1 << 62).check(0.0).failed
    low = StoreProbe(tmp_path, lambda: None, warn_free_bytes=1 << 62)
    assert low.check(0.0).level.label == "warn"
    assert StoreProbe(tmp_path / "gone", lambda: None).check(0.0).failed
    bg: dict[str, Any] = {}
    s = StartupProbe(bg)
    assert s.check(0.0).message == "start-up work running"
    bg["estimators"] = {"ok": True, "ms": 3.0}
    assert s.check(1.0).level.label == "ok"
    bg["calibration"] = {"ok": False, "reason": "link never came up"}
    r = s.check(2.0)
    assert r.failed and "calibration: link never came up" in r.message


def test_events_fail_the_probes_that_claim_them() -> None:
    clock = Clock()
    state = {"ready": True}
    broker = BrokerProbe(lambda: state["ready"], lambda: {"connected": False}, lambda: 0)
    link = LinkProbe(lambda: 0, lambda: True, lambda: True, min_frames_hz=0.0)
    m, _ = _monitor([broker, link, FakeProbe("plain")], clock, period_s=10.0)
    try:
        m.run_due()
        m.on_event({"type": EventType.TASK_DONE})  # nobody's failure
        m.on_event({"type": EventType.MQTT_DISCONNECTED})
        st = m.status()["probes"]
        assert st["broker"]["strikes"] == 1 and st["broker"]["fast_fails"] == 1
        assert st["broker"]["figures"] == {"event": "mqtt_disconnected"}
        assert st["link"]["strikes"] == 0 and st["plain"]["strikes"] == 0
        m.on_event({"type": EventType.LINK_FAULT, "cause": "serial_link"})
        assert m.status()["probes"]["link"]["message"] == "link fault: serial_link"
        assert m.run_due() == 2  # both again at once, not at their 10 s period
    finally:
        m.stop()
