"""Sensor health probes on the real SensorHub fed with real codec frames (encoded, decoded)."""

from __future__ import annotations

import dataclasses
import math
import random
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from edge_agent.health.probe import Level, Probe
from edge_agent.health.sensor_probes import make_sensor_probes, watch_stale
from edge_agent.link.codec import FrameDecoder, Sensor, Status, StatusFlag, encode
from edge_agent.robot import load_robot
from edge_agent.sensors.hub import SensorHub
from edge_agent.vocab import DegradationMode, EventType

ROBOT = load_robot(Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml")
OBJECT = ROBOT.sensor_channel_id("object_pose")
CONTROL_PERIOD_S = 1 / 200  # control.rate_hz default


class Rig:
    """A hub, its probes, and a robot streaming STATUS at 1 kHz and the camera at 30 Hz, with
    noise (a live sensor never repeats itself), through the real codec."""

    def __init__(self) -> None:
        self.hub = SensorHub(ROBOT)
        # the stale listener's calls, as the control thread makes them (the watch's thread
        # hands them to the monitor; test_watch_stale_hands_channels_to_fail_now covers it)
        self.failures: list[tuple[str, str, Mapping[str, Any]]] = []
        self.hub.add_stale_listener(lambda names, now: self.failures.extend(
            (f"sensor:{n}", "stale", {"channel": n}) for n in names))
        self.probes = {p.name: p for p in make_sensor_probes(self.hub, ROBOT, None)}
        self.rng = random.Random(3)
        self.k = 0
        self.t = 10.0
        self.dec = FrameDecoder()
        self.seq = 0

    def status(self, **change: Any) -> Status:
        g = self.rng.gauss
        s = Status(fw_time_us=1_000 * self.k,
                   flags=StatusFlag.DRIVES_ENABLED | StatusFlag.SESSION_OPEN,
                   last_cmd_seq=self.k % 65536,
                   q=tuple(v + g(0, 1e-4) for v in (0.1, 1.2, -1.9, -0.87)),
                   dq=(0.0, 0.0, 0.0, 0.0),
                   current=tuple(v + g(0, 0.02) for v in (0.1, 0.2, 0.3, 0.4)),
                   gripper_pos=0.04 + g(0, 1e-4), gripper_current=0.5,
                   gripper_force=3.0 + g(0, 0.05))
        return dataclasses.replace(s, **change)

    def feed(self, msg: object) -> None:
        frames = self.dec.feed(encode(msg, self.seq % 65536))  # type: ignore[arg-type]
        self.seq += 1
        for f in frames:
            self.hub.update(f.msg, self.t)

    def run(self, seconds: float, camera: bool = True, pose: tuple[float, ...] = (0.3, 0.1, 0.02),
            **change: Any) -> None:
        """Stream for `seconds` (1 ms steps); `change` overrides STATUS fields."""
        for _ in range(round(seconds * 1000)):
            self.k += 1
            self.t += 0.001
            self.feed(self.status(**change))
            if camera and self.k % 33 == 0:
                self.feed(Sensor(1_000 * self.k, OBJECT, True,
                                 tuple(v + self.rng.gauss(0, 0.002) for v in pose)))

    def check(self, name: str) -> Any:
        return self.probes[name].check(self.t)


def test_two_probes_per_channel_with_the_right_modes() -> None:
    probes = make_sensor_probes(SensorHub(ROBOT), ROBOT)
    filtered = [c for c in ROBOT.sensors if c.spike_window]
    assert [c.name for c in filtered] == ["wrist_force", "object_pose"]
    assert len(probes) == 2 * len(ROBOT.sensors) + len(filtered)
    by = {p.name: p for p in probes}
    for ch in ROBOT.sensors:
        fresh: Probe = by[f"sensor:{ch.name}"]
        quality: Probe = by[f"sensor:{ch.name}:quality"]
        if ch.on_loss == "predict":
            assert fresh.mode is DegradationMode.SENSOR_PREDICTED and fresh.subject == ch.name
        else:
            assert fresh.mode is None and fresh.subject == ""
        assert quality.mode is None and fresh.period_s is None and quality.period_s is None
        spikes = by.get(f"sensor:{ch.name}:spikes")
        assert (spikes is not None) == bool(ch.spike_window)
        if spikes is not None:
            assert spikes.mode is DegradationMode.SENSOR_FILTERED and spikes.subject == ch.name


def test_a_healthy_stream_is_ok_everywhere() -> None:
    rig = Rig()
    rig.run(0.5)
    for p in rig.probes.values():
        p.check(rig.t)  # the first quality check only sets its baseline
    rig.run(0.5)
    results = {n: p.check(rig.t) for n, p in rig.probes.items()}
    assert all(r.level is Level.OK for r in results.values()), {
        n: r for n, r in results.items() if r.level is not Level.OK}
    assert rig.failures == []
    assert results["sensor:wrist_force:spikes"].figures["spike_ratio"] == 0.0


def test_camera_dropout_is_predicted_within_its_bound_then_past_it() -> None:
    rig = Rig()
    rig.run(0.5)
    rig.run(0.3, camera=False)  # STATUS goes on, the camera is gone (past 233 ms: loss_s)
    r = rig.check("sensor:object_pose")
    assert rig.failures == []  # the monitor's own snapshot tells no listener
    rig.hub.snapshot(rig.t)  # the control thread's does
    assert r.failed and "Kalman-predicted" in r.message and r.figures["source"] == "predicted"
    assert [f[0] for f in rig.failures] == ["sensor:object_pose"]  # the fast path, once
    rig.run(1.0, camera=False)
    r = rig.check("sensor:object_pose")
    assert r.failed and "past its prediction bound (1 s" in r.message
    rig.run(0.1)
    assert rig.check("sensor:object_pose").level is Level.OK


def test_sensor_loss_is_seen_within_three_control_ticks() -> None:
    """Wrist force goes NaN (the rig's dropout of a STATUS channel); the control thread's
    snapshot each tick is what tells the fast path."""
    rig = Rig()
    rig.run(0.3)
    assert rig.hub.snapshot(rig.t).ok and rig.failures == []
    lost_at = rig.t
    ticks = 0
    while not rig.failures:
        rig.run(CONTROL_PERIOD_S, gripper_force=math.nan)
        rig.hub.snapshot(rig.t)  # one control tick
        ticks += 1
        assert ticks <= 3, "not seen within 3 control ticks"
    name, _, figs = rig.failures[0]
    assert name == "sensor:wrist_force" and figs["channel"] == "wrist_force"
    assert rig.t - lost_at <= 3 * CONTROL_PERIOD_S + 1e-9
    r = rig.check("sensor:wrist_force")
    assert r.failed and "Kalman-predicted" in r.message  # inside its 0.5 s bound
    q = rig.check("sensor:wrist_force:quality")
    assert q.failed and "NaN/inf samples" in q.message


def test_a_stalled_host_is_not_a_sensor_loss_for_the_fast_path() -> None:
    """No frame read for 100 ms (a VM stall, or the link went silent): every channel is stale
    in host time, none in the firmware's; the fast path stays quiet."""
    rig = Rig()
    rig.run(0.3)
    rig.t += 0.1
    snap = rig.hub.snapshot(rig.t)
    assert set(snap.stale) >= {"joint_encoders", "wrist_force"} and rig.failures == []
    r = rig.check("sensor:wrist_force")
    assert r.level is Level.WARN and "the host or the link is late" in r.message
    rig.run(0.01)  # frames again (the camera's next one may be up to 33 ms away)
    assert "joint_encoders" not in rig.hub.snapshot(rig.t).stale and rig.failures == []


def test_a_lost_stop_channel_reports_without_a_mode() -> None:
    rig = Rig()
    rig.run(0.2)
    rig.run(0.05, current=(math.nan,) * 4)
    r = rig.check("sensor:joint_currents")
    assert r.failed and "sensor_bound stop" in r.message
    assert rig.probes["sensor:joint_currents"].mode is None


def test_a_stuck_encoder_is_refused_lost_and_reported_and_back_once_it_moves() -> None:
    """The same q bit for bit is refused from the description's `stuck_samples`-th sample: the
    channel goes stale as in a dropout (the stale fast path, the freshness probe past its 10 ms
    bound: the sensor_bound stop), the quality probe names it, and a moving value is taken again."""
    rig = Rig()
    rig.run(0.2)
    rig.check("sensor:joint_encoders:quality")
    enc = ROBOT.sensor("joint_encoders")
    assert enc.stuck_samples == 5  # configs/robot/edge-arm-4.toml
    frozen = (0.1, 1.2, -1.9, -0.87)
    rig.run(0.3, q=frozen, dq=(0.0,) * 4)  # the rig's `stuck`: q held, dq zero
    counts = rig.hub.channel_counts("joint_encoders")
    assert counts.stuck == 300 - (enc.stuck_samples - 1)  # the first 4 repeats still taken
    assert rig.hub.snapshot(rig.t).channel("joint_encoders").lost  # (the control thread's)
    assert ("sensor:joint_encoders", "stale", {"channel": "joint_encoders"}) in rig.failures
    fresh = rig.check("sensor:joint_encoders")
    assert fresh.failed and "past its prediction bound" in fresh.message, fresh
    q = rig.check("sensor:joint_encoders:quality")
    assert q.failed and "stuck: 296 samples refused" in q.message and q.figures["stuck"] == 296
    rig.run(0.3)
    assert rig.check("sensor:joint_encoders:quality").level is Level.OK
    assert rig.check("sensor:joint_encoders").level is Level.OK
    assert rig.hub.channel_counts("joint_encoders").stuck == counts.stuck


def test_a_repeated_frame_and_a_noise_free_channel_are_not_stuck() -> None:
    rig = Rig()
    st = rig.status()
    for _ in range(20):  # one STATUS decoded again and again (same firmware time): one sample
        rig.feed(st)
    assert rig.hub.channel_counts("joint_encoders").stuck == 0
    rig.run(0.3, q=(0.1, 1.2, -1.9, -0.87))  # (a frozen q; the e-stop input is flat too)
    assert rig.hub.channel_counts("joint_encoders").stuck > 0
    assert ROBOT.sensor("estop_input").stuck_samples == 0
    assert rig.hub.channel_counts("estop_input").stuck == 0


def _storm(rig: Rig, n: int, every: int = 0, p: float = 0.0) -> list[float]:
    """n samples of wrist force (3 N and its noise), every `every`-th one a +40 N outlier or,
    with `p`, each one with that chance -40 or +40 N (the rig's `spikes`); returns the force
    the hub reported after each."""
    seen = []
    rng = rig.rng
    for i in range(n):
        spike = (40.0 if every and i % every == 0 else
                 rng.choice((-40.0, 40.0)) if p and rng.random() < p else 0.0)
        rig.run(0.001, gripper_force=3.0 + rng.gauss(0, 0.05) + spike)
        r = rig.hub.snapshot(rig.t, tell=False).channel("wrist_force").reading
        assert r is not None
        seen.append(r.value[0])
    return seen


def test_a_spike_storm_fails_the_spikes_probe_from_the_spike_ratio() -> None:
    rig = Rig()
    rig.run(0.3)
    rig.check("sensor:wrist_force:spikes")
    _storm(rig, 300, 4)  # every fourth sample an outlier: 25 % > max_ratio 20 %
    r = rig.check("sensor:wrist_force:spikes")
    assert r.failed and "25% of 300 samples dropped as spikes" in r.message, r
    assert r.figures["spike_ratio"] == 0.25 and r.figures["received"] == 300
    assert rig.check("sensor:wrist_force").level is Level.OK  # still measured: not lost
    assert rig.check("sensor:wrist_force:quality").level is Level.OK
    _storm(rig, 300, 1000)  # one outlier in 300
    assert rig.check("sensor:wrist_force:spikes").level is Level.OK


def test_in_sensor_filtered_the_median_stands_in_where_the_hampel_test_lets_a_storm_through(
        ) -> None:
    """40 % of the samples ±40 N outliers: the Hampel window's MAD grows with them and lets
    some through; the median of three windows (sensor_filtered) reports far fewer."""
    rig = Rig()
    rig.run(0.3)
    hampel = _storm(rig, 2000, p=0.4)
    wrong_hampel = sum(abs(v - 3.0) > 1.0 for v in hampel)
    assert wrong_hampel > 100, "the Hampel test held this storm back by itself"
    assert rig.hub.set_median("wrist_force", True)
    before = rig.hub.channel_counts("wrist_force").spikes_rejected
    median = _storm(rig, 2000, p=0.4)
    wrong_median = sum(abs(v - 3.0) > 1.0 for v in median)
    assert wrong_median * 10 < wrong_hampel, (wrong_median, wrong_hampel)
    assert rig.hub.channel_counts("wrist_force").spikes_rejected > before  # still counted
    assert rig.hub.set_median("wrist_force", False)
    assert not rig.hub.set_median("joint_currents", True)  # no spike filter: nothing to switch
    assert rig.hub.set_median("nonexistent", True) is False


def test_a_value_out_of_range_is_reported() -> None:
    rig = Rig()
    rig.run(0.3, pose=(1.5, 0.0, 0.02))  # 1.5 m from the base: out of the arm's reach
    r = rig.check("sensor:object_pose:quality")
    assert r.failed and "outside its range [-1, 1]" in r.message


@pytest.mark.parametrize("channel", [c.name for c in ROBOT.sensors])
def test_probes_never_raise_before_any_frame(channel: str) -> None:
    probes = {p.name: p for p in make_sensor_probes(SensorHub(ROBOT), ROBOT)}
    assert probes[f"sensor:{channel}"].check(1.0).level is Level.WARN  # no STATUS yet
    assert probes[f"sensor:{channel}:quality"].check(1.0).level is Level.OK


def test_watch_stale_hands_channels_to_fail_now_off_the_control_thread() -> None:
    rig = Rig()
    got: list[tuple[str, str, dict[str, Any], str]] = []
    done = threading.Event()

    def fail_now(probe: str, message: str, **figures: Any) -> None:
        got.append((probe, message, figures, threading.current_thread().name))
        done.set()

    watch = watch_stale(rig.hub, fail_now)
    rig.run(0.3)
    rig.run(0.01, gripper_force=math.nan)  # past loss_s: 3 ms stale + 4 ms of filter delay
    rig.hub.snapshot(rig.t)  # the control tick that sees it
    assert done.wait(10.0)
    watch.stop()
    probe, message, figures, thread = got[0]
    assert probe == "sensor:wrist_force" and figures["channel"] == "wrist_force"
    assert "went stale" in message and thread == "sensor-stale-watch"


def test_sensor_lost_event_fails_the_channel_probe_at_once() -> None:
    probes: dict[str, Any] = {p.name: p for p in make_sensor_probes(SensorHub(ROBOT), ROBOT)}
    ev = {"type": EventType.SENSOR_LOST, "channels": ["object_pose"], "age_s": {}}
    assert "lost past its bound" in probes["sensor:object_pose"].fails_on(ev)
    assert probes["sensor:wrist_force"].fails_on(ev) is None
    assert probes["sensor:object_pose"].fails_on({"type": EventType.SENSOR_BACK}) is None


def test_a_cube_that_starts_moving_is_not_a_lost_camera() -> None:
    """The camera's spike filter holds back a genuine step for about half its window (filters.py):
    with the cube carried off at 0.5 m/s, samples are dropped for ~100 ms — the channel is stale
    for the control view (predicted), but not gone: the fast path stays quiet. A dropout of the
    same camera is still seen."""
    rig = Rig()
    rig.run(0.5)
    x0 = 0.3
    for _ in range(120):  # 0.6 s of control ticks while the cube moves along x
        x = x0 + 0.5 * (rig.t - 10.5)
        rig.run(CONTROL_PERIOD_S, pose=(x, 0.1, 0.02))
        rig.hub.snapshot(rig.t)
    assert rig.hub.channel_counts("object_pose").spikes_rejected > 0, "the filter held nothing back"
    assert rig.failures == []
    assert rig.hub.loss_s[ROBOT.sensors.index(ROBOT.sensor("object_pose"))] > 0.2
    for _ in range(60):  # the camera drops out: 0.3 s
        rig.run(CONTROL_PERIOD_S, camera=False)
        rig.hub.snapshot(rig.t)
    assert [n for n, _, _ in rig.failures] == ["sensor:object_pose"]
