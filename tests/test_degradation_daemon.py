"""Issue #18 "Done means", per single fault on the real daemon (`--sim`, a private Mosquitto,
`health.period_s` short), injected with `failure.inject`: the right mode or, for a fault with
no mode, the probe's level — sensor dropouts and link corruption through the fast path (the
stale watch, the link_fault event: at once, not after probe periods), a stuck encoder (its
repeats refused: a lost channel, then the sensor_bound stop), a spike storm (`sensor_filtered`,
from the spikes probe's ratio) — the `degraded` event and `state.degraded`; the fault removed →
`recovered` and the level back. Broker loss is tests/test_health_daemon.py's."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import MQTT_USERS
from daemon_proc import REPO, DaemonProc
from mosquitto import Mosquitto, Probe, wait_until
from test_health_daemon import _log_time

from hil.degraded_faults import storm_rig_config

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
    assert p["strikes"] >= 1, p
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


# -- sensors (edge_agent/health/sensor_probes.py) ---------------------------------------------
SENSOR_PERIOD_S = 0.1  # a 0.45 s wrist-force dropout (bound 0.5 s) is entered well inside it
QUALITY_PERIOD_S = 0.3


def _sensor_daemon(tmp: Path, broker: Mosquitto, *extra: str,
                   period_s: float = SENSOR_PERIOD_S) -> DaemonProc:
    d = DaemonProc(tmp, broker, extra=(f"health.period_s={period_s}", *extra)).start()
    d.wait_ready()
    wait_until(lambda: all(_probe(d, f"sensor:{c}").get("level") == "ok"
                           for c in ("object_pose", "wrist_force", "joint_encoders")), 30,
               "the sensor probes ok")
    # and no mode held from the start-up (the camera's first frame may come after a probe run)
    wait_until(lambda: _status(d)["degraded"] == [], 30, "no mode in force")
    return d


def _since(d: DaemonProc, kind: str, mode: str, subject: str, t: float) -> list[dict[str, Any]]:
    return [e for e in _events(d, kind) if e.get("mode") == mode
            and e.get("subject", "") == subject and _log_time(e) >= t]


def _first(d: DaemonProc, kind: str, mode: str, subject: str, t: float,
           timeout: float = 30) -> dict[str, Any]:
    """Waits for the first `kind` event of mode/subject logged at or after `t`."""
    wait_until(lambda: bool(_since(d, kind, mode, subject, t)), timeout,
               f"{kind} {mode}/{subject or '-'}")
    return _since(d, kind, mode, subject, t)[0]


def _cleared_and_ok(d: DaemonProc, channel: str, mode: str, probe: str, t: float) -> None:
    """The rig's fault on `channel` cleared: `mode` left for it and `probe` ok again."""
    r = d.rig({"cmd": "clear", "target": f"sensor:{channel}"})
    assert r["ok"], r
    _first(d, "recovered", mode, channel, t)
    wait_until(lambda: _probe(d, probe).get("level") == "ok", 30, f"{probe} ok again")


@pytest.mark.parametrize(("channel", "duration_s"), [("object_pose", 0.8), ("wrist_force", 0.45)])
def test_a_sensor_dropout_inside_its_bound_is_sensor_predicted_then_recovered(
        tmp_path: Path, broker: Mosquitto, channel: str, duration_s: float) -> None:
    """The camera (bound 1 s) or the wrist force sensor (bound 0.5 s) drops out inside its
    bound: `sensor_predicted` with the channel as subject, reported by the hub's stale watch
    (the fast path) and entered while the channel is still out, in `state.degraded` while held;
    left after the channel is back, with no protective stop."""
    d = _sensor_daemon(tmp_path, broker)
    try:
        probe = f"sensor:{channel}"
        watcher = Probe(broker, "operator", MQTT_USERS["operator"])
        watcher.connect()
        watcher.subscribe(f"edge/{d.device}/state")
        try:
            t_inject = time.time()  # the daemon's log stamps are wall time on this machine
            _inject(d, target=f"sensor:{channel}", mode="dropout", duration_s=duration_s)
            # the retained state as published names the mode while it is held
            watcher.expect(lambda m: "sensor_predicted" in json.loads(m.payload).get(
                "degraded", []), 30)
        finally:
            watcher.close()
        deg = _first(d, "degraded", "sensor_predicted", channel, t_inject)
        assert deg["probe"] == probe and "Kalman-predicted" in deg["cause"], deg
        # entered while the channel was still out; the fast path (the control thread's snapshot
        # that found the channel gone) reported it — it usually enters the mode itself, unless a
        # probe period fell in the few ms between the loss and the watch's hand-over
        assert _log_time(deg) < t_inject + duration_s, (deg, t_inject)
        if deg["cause"].startswith(f"{channel} went stale"):
            assert isinstance(deg["figures"]["at"], float), deg
        assert _probe(d, probe).get("fast_fails", 0) >= 1, _probe(d, probe)
        rec = _first(d, "recovered", "sensor_predicted", channel, t_inject)
        assert _log_time(rec) >= t_inject + duration_s  # not before the channel was back
        p = _probe(d, probe)
        assert p["fast_fails"] >= 1 and p["level"] == "ok" and p["strikes"] == 0, p
        wait_until(lambda: "sensor_predicted" not in _status(d)["degraded"], 30, "left")
        st = _status(d)
        assert not [e for e in d.events("event") if e.get("type") == "sensor_lost"]
        assert st.get("stop") is None, st.get("stop")
    finally:
        d.stop()


def test_a_stuck_encoder_is_a_lost_channel_sensor_predicted_then_the_sensor_bound_stop(
        tmp_path: Path, broker: Mosquitto) -> None:
    """The encoders report the same q bit for bit (the rig's `stuck`): the hub refuses the
    repeats from the description's `stuck_samples`-th on, so the channel is lost as in a
    dropout — `sensor_predicted/joint_encoders` by the stale fast path, then past its 10 ms
    bound the latched `sensor_bound` stop — and the quality probe names the cause. Cleared:
    `recovered`, the quality probe ok; the stop stays latched until a reset."""
    d = _sensor_daemon(tmp_path, broker, period_s=QUALITY_PERIOD_S)
    try:
        t_inject = time.time()
        _inject(d, target="sensor:joint_encoders", mode="stuck")
        _first(d, "degraded", "sensor_predicted", "joint_encoders", t_inject)
        wait_until(lambda: "sensor_bound" in ((_status(d).get("stop") or {}).get("causes")
                                              or ()), 30, "the sensor_bound stop")
        probe = "sensor:joint_encoders:quality"
        wait_until(lambda: _probe(d, probe).get("level") == "error", 30, f"{probe} in error")
        bad = _probe(d, probe)
        assert "stuck" in bad["message"] and bad["figures"]["stuck"] > 0, bad
        assert _probe(d, "sensor:joint_encoders")["level"] == "error"
        _cleared_and_ok(d, "joint_encoders", "sensor_predicted", probe, t_inject)
        st = _status(d)
        assert st["mode"] == "protective_stop" and "sensor_bound" in st["stop"]["causes"], st
    finally:
        d.stop()


def test_a_spike_storm_is_sensor_filtered_then_recovered(tmp_path: Path,
                                                          broker: Mosquitto) -> None:
    """Half the wrist-force samples a ±outlier (a rig with spike_probability 0.5; the shipped
    0.05 stays under the description's max_ratio 0.2): the `sensor:wrist_force:spikes` probe
    fails on the spike ratio, `sensor_filtered/wrist_force` is entered (event, published
    `state.degraded`: the hub reports its median meanwhile) and left once the storm is over."""
    storm = storm_rig_config(tmp_path / "rig-spikes.toml", 0.5)
    d = _sensor_daemon(tmp_path, broker, f'sim.rig_config="{storm}"',
                       period_s=QUALITY_PERIOD_S)
    try:
        probe = "sensor:wrist_force:spikes"
        t_inject = time.time()
        _inject(d, target="sensor:wrist_force", mode="spikes")
        deg = _first(d, "degraded", "sensor_filtered", "wrist_force", t_inject)
        assert deg["probe"] == probe and "dropped as spikes" in deg["cause"], deg
        assert deg["figures"]["spike_ratio"] > 0.2, deg
        assert "sensor_filtered" in _status(d)["degraded"]
        _cleared_and_ok(d, "wrist_force", "sensor_filtered", probe, t_inject)
        st = _status(d)
        assert "sensor_filtered" not in st["degraded"] and st.get("stop") is None, st
    finally:
        d.stop()


def test_a_gpu_fault_on_the_simulated_gpu_is_cpu_inference_then_back_on_the_gpu(
        tmp_path: Path, broker: Mosquitto) -> None:
    """`--sim` with `sim.gpu = true` (a simulated GPU at the ONNX session seam,
    inference/sim_gpu.py; everything above it the real code): `failure.inject gpu fail` moves the
    local model to the CPU — the `gpu` probe fails, `cpu_inference` is entered (event,
    `state.degraded`) — and after the fault the probe inferences on a fresh GPU session bring
    it back: `recovered`, the model on the GPU again."""
    trained = REPO / "models" / "pick-place-policy.onnx"
    d = DaemonProc(tmp_path, broker, extra=(
        f"health.period_s={PERIOD_S}", "sim.gpu=true", f"inference.model={trained}",
        'inference.providers=["CUDAExecutionProvider","CPUExecutionProvider"]')).start()
    try:
        d.wait_ready()
        wait_until(lambda: _probe(d, "gpu").get("level") == "ok", 60,
                   "the gpu probe ok on the simulated GPU")
        t_inject = time.time()
        _inject(d, target="gpu", mode="fail", duration_s=2.0)
        deg = _first(d, "degraded", "cpu_inference", "", t_inject)
        assert "cpu_inference" in _status(d)["degraded"]
        assert deg["probe"] == "gpu", deg
        rec = _first(d, "recovered", "cpu_inference", "", t_inject, timeout=60)
        assert _log_time(rec) >= t_inject + 2.0, rec  # not before the fault was over
        p = _probe(d, "gpu")
        assert p["level"] == "ok" and p["figures"]["device"] == "gpu", p
    finally:
        d.stop()
