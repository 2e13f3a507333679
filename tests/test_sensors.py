"""Sensor layer: spike and median filters, and SensorHub fed with real codec frames."""

from __future__ import annotations

import dataclasses
import math
import random
import threading
from pathlib import Path

import pytest

from edge_agent.errors import ConfigError
from edge_agent.link.codec import (
    EstopEdge,
    FrameDecoder,
    Pong,
    Sensor,
    Status,
    StatusFlag,
    encode,
)
from edge_agent.robot import RobotDescription, SensorChannel, load_robot
from edge_agent.sensors.filters import (
    MedianFilter,
    SpikeFilter,
    is_spike,
    mad,
    median,
    median_filter,
)
from edge_agent.sensors.hub import SensorHub
from edge_agent.sensors.kalman import EstimatorBank
from edge_agent.sensors.readings import Freshness, Source

ROBOT = load_robot(Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml")
# The same robot without the stuck check, for the noise-free synthetic STATUS of `_status`
# (a channel with noise that repeats itself is stuck: tests/test_sensor_probes.py).
STEADY = dataclasses.replace(ROBOT, sensors=tuple(
    dataclasses.replace(c, stuck_samples=0) for c in ROBOT.sensors))
OBJECT = ROBOT.sensor_channel_id("object_pose")

# --------------------------------------------------------------------------- filters


def test_median_and_mad() -> None:
    assert median([3.0, 1.0, 2.0]) == 2.0 and median([4.0, 1.0, 3.0, 2.0]) == 2.5
    assert mad([1.0, 2.0, 3.0, 4.0, 100.0]) == 1.0  # one outlier does not move it
    with pytest.raises(ValueError):
        median([])
    assert is_spike([1.0, 1.1, 0.9, 1.0, 1.05], 3.0, k=5.0)
    assert not is_spike([1.0, 1.1, 0.9, 1.0, 1.05], 1.2, k=5.0)
    assert not is_spike([1.0] * 5, 1.0 + 1e-6, k=5.0, floor=1e-3)  # flat window: the floor rules


def test_spike_filter_drops_isolated_spikes_and_keeps_noise() -> None:
    rng = random.Random(9)
    f = SpikeFilter(2, window=7, k=5.0, floor=5 * 0.01)  # the hub's floor: k * noise_std
    false_rejects = missed = 0
    for i in range(3000):
        sample = [0.5 + 0.01 * rng.gauss(0, 1), -0.2 + 0.01 * rng.gauss(0, 1)]
        spike = i % 50 == 25
        if spike:
            sample[i % 2] += 0.3 * (1 if i % 3 else -1)  # 30 sigma
        ok = f.accept(sample)
        missed += spike and ok
        false_rejects += (not spike) and (not ok)
    assert missed == 0
    assert false_rejects < 0.01 * 3000
    assert f.rejected == 60 + false_rejects


def test_spike_filter_accepts_a_genuine_step_after_half_a_window() -> None:
    f = SpikeFilter(1, window=7, k=5.0, floor=0.01)
    for i in range(20):
        assert f.accept([1.0 + 0.001 * (i % 3)])
    verdicts = [f.accept([2.0]) for _ in range(6)]
    assert verdicts[:2] == [False, False] and all(verdicts[4:])


@pytest.mark.parametrize(("dim", "window", "min_samples", "floor"),
                         [(1, 7, 5, 0.25), (2, 6, 3, 0.0), (3, 4, 4, 0.05), (1, 3, 3, 0.0)])
def test_spike_filter_decides_as_is_spike(dim: int, window: int, min_samples: int,
                                          floor: float) -> None:
    """SpikeFilter.accept (inlined for the hub's 1 kHz path) is is_spike per dimension over the
    raw window: odd and even windows, flat stretches, steps and spikes."""
    rng = random.Random(window * 10 + dim)
    f = SpikeFilter(dim, window=window, k=5.0, floor=floor, min_samples=min_samples)
    past: list[list[float]] = []
    for i in range(2000):
        flat = (i // 100) % 3 == 0
        sample = [(1.0 if flat else 1.0 + 0.05 * rng.gauss(0, 1)) + (i // 300) * 0.5
                  for _ in range(dim)]
        if rng.random() < 0.05:
            sample[rng.randrange(dim)] += rng.choice((-1.0, 1.0)) * rng.uniform(0.01, 2.0)
        win = past[-window:]
        expected = len(win) < min_samples or not any(
            is_spike([s[d] for s in win], sample[d], 5.0, floor) for d in range(dim))
        assert f.accept(sample) == expected, i
        past.append(sample)


def test_median_filter_removes_an_impulse() -> None:
    assert median_filter([1.0, 1.0, 9.0, 1.0, 1.0], 3) == [1.0, 1.0, 1.0, 1.0, 1.0]
    m = MedianFilter(2, window=3)
    outs = [m.update((v, -v)) for v in (1.0, 5.0, 2.0, 3.0)]
    assert outs == [(1.0, -1.0), (3.0, -3.0), (2.0, -2.0), (3.0, -3.0)]
    with pytest.raises(ValueError):
        m.update((1.0,))


# --------------------------------------------------------------------------- hub


def _status(k: int, *, q: tuple[float, ...] | None = None, force: float = 3.0,
            estop: bool = False) -> Status:
    flags = StatusFlag.DRIVES_ENABLED | StatusFlag.SESSION_OPEN
    if estop:
        flags |= StatusFlag.ESTOP_INPUT
    return Status(fw_time_us=1_000 * k, flags=flags, last_cmd_seq=k % 65536,
                  q=q if q is not None else (0.001 * k, 1.2, -1.9, -0.87),
                  dq=(1.0, 0.0, 0.0, 0.0), current=(0.1, 0.2, 0.3, 0.4),
                  gripper_pos=0.04, gripper_current=0.5, gripper_force=force)


def _wire(*msgs: object) -> list[object]:
    """Encode then decode with the real codec, as the link reader sees them."""
    dec = FrameDecoder()
    data = b"".join(encode(m, seq) for seq, m in enumerate(msgs))  # type: ignore[arg-type]
    frames = dec.feed(data)
    assert len(frames) == len(msgs)
    return [f.msg for f in frames]


def test_snapshot_from_real_codec_frames() -> None:
    hub = SensorHub(ROBOT)
    status, sensor = _wire(_status(100), Sensor(99_000, OBJECT, True, (0.3, 0.1, 0.02)))
    hub.update(status, now=10.000)
    hub.update(sensor, now=10.0005)
    snap = hub.snapshot(now=10.001)
    assert snap.q == pytest.approx((0.1, 1.2, -1.9, -0.87), abs=1e-6)  # f32 on the wire
    assert snap.dq == (1.0, 0.0, 0.0, 0.0) and snap.q_source is Source.MEASURED
    assert snap.currents == pytest.approx((0.1, 0.2, 0.3, 0.4))
    assert snap.gripper_pos == pytest.approx(0.04) and snap.gripper_current == 0.5
    assert snap.gripper_force == 3.0 and snap.estop_input is False
    assert snap.fw_time_s == pytest.approx(0.1) and snap.last_cmd_seq == 100
    assert snap.flags == StatusFlag.DRIVES_ENABLED | StatusFlag.SESSION_OPEN
    assert snap.object_pose is not None
    assert snap.object_pose.value == pytest.approx((0.3, 0.1, 0.02))
    assert snap.object_pose.t_fw == pytest.approx(0.099) and snap.object_pose.t_host == 10.0005
    assert snap.object_pose.age(snap.t) == pytest.approx(0.0005)
    assert all(c.freshness is Freshness.OK for c in snap.channels.values())
    assert snap.ok and snap.stale == () and snap.past_bound == ()
    assert hub.counters()["status_frames"] == 1 and hub.counters()["sensor_frames"] == 1


def test_before_any_frame_everything_is_stale() -> None:
    snap = SensorHub(ROBOT).snapshot(now=1.0)
    assert snap.q == () and snap.estop_input is None and snap.object_pose is None
    assert set(snap.stale) == {c.name for c in ROBOT.sensors}
    assert set(snap.past_bound) == {"joint_encoders", "wrist_force", "object_pose"}
    assert snap.channel("estop_input").age_s == math.inf
    assert snap.ok  # no firmware clock yet: nothing can be counted as lost (start-up holds)


def test_channels_go_stale_after_three_periods_and_past_their_bound() -> None:
    hub = SensorHub(ROBOT)
    hub.update(_status(1), now=5.0)
    hub.update(Sensor(1000, OBJECT, True, (0.3, 0.0, 0.1)), now=5.0)
    assert hub.snapshot(5.0029).ok
    snap = hub.snapshot(5.0031)  # status channels: 1 kHz -> stale after 3 ms
    assert snap.channel("joint_currents").freshness is Freshness.STALE
    # ... but no STATUS came since: the host is late, the firmware has lost nothing
    assert snap.lost == () and hub.snapshot(6.2).lost == ()
    assert snap.channel("object_pose").freshness is Freshness.OK  # 30 Hz: 100 ms
    # The estimators run from the first frame: the encoders are predicted, until the bound.
    assert snap.q_source is Source.PREDICTED and snap.past_bound == ()
    assert SensorHub(ROBOT, estimators=False).snapshot(5.0031).q_source is Source.STALE
    assert snap.channel("joint_encoders").usable and not snap.channel("joint_currents").usable
    assert hub.snapshot(5.011).past_bound == ("joint_encoders",)
    assert not hub.snapshot(5.011).channel("joint_encoders").usable
    late = hub.snapshot(6.2)
    assert set(late.past_bound) == {"joint_encoders", "wrist_force", "object_pose"}
    assert late.object_pose is not None and late.object_pose.source is Source.STALE


def _nan_currents(k: int) -> Status:
    return dataclasses.replace(_status(k), current=(math.nan,) * 4, gripper_pos=math.nan)


def test_a_channel_is_lost_past_its_bound_in_firmware_time() -> None:
    """STATUS keeps coming, a channel's values are invalid: `stop` channels are lost after three
    of their periods of firmware time, predicted ones after predict_max_s, and come back with
    the first valid sample."""
    hub = SensorHub(STEADY)
    hub.update(_status(1), now=5.0)
    for k in range(2, 5):  # fw 2..4 ms: 3 ms past the last valid currents, not more
        hub.update(_nan_currents(k), now=5.0 + (k - 1) * 1e-3)
    assert hub.snapshot(5.0035).lost == ()
    hub.update(_nan_currents(5), now=5.004)
    assert set(hub.snapshot(5.0041).lost) == {"joint_currents", "gripper_position"}
    hub.update(_status(6), now=5.005)
    assert hub.snapshot(5.0051).lost == ()
    # the encoders: NaN q for longer than predict_max_s (10 ms) of firmware time
    for k in range(7, 30):
        hub.update(_status(k, q=(math.nan,) * 4), now=5.0 + k * 1e-3)
    snap = hub.snapshot(5.030)
    assert snap.lost == ("joint_encoders",) and snap.channel("joint_encoders").lost


def test_a_channel_never_valid_is_lost_from_the_first_status_on() -> None:
    hub = SensorHub(ROBOT)
    for k in range(100, 110):
        hub.update(_nan_currents(k), now=1.0 + k * 1e-3)
    assert set(hub.snapshot(1.11).lost) == {"joint_currents", "gripper_position"}


def test_invalid_samples_keep_a_channel_stale() -> None:
    hub = SensorHub(ROBOT)
    hub.update(Sensor(0, OBJECT, True, (0.3, 0.0, 0.1)), now=1.0)
    for k in range(1, 20):  # the camera says "no sample" for 0.6 s
        hub.update(Sensor(k * 33_000, OBJECT, False, (0.0, 0.0, 0.0)), now=1.0 + k * 0.033)
    hub.update(Sensor(0, OBJECT, True, (0.3, 0.0)), now=1.63)  # wrong dimension
    hub.update(_status(5, q=(math.nan, 1.2, -1.9, -0.87)), now=1.63)
    snap = hub.snapshot(1.631)
    assert snap.channel("object_pose").freshness is Freshness.STALE
    assert snap.object_pose is not None and snap.object_pose.value == (0.3, 0.0, 0.1)
    assert snap.q == () and snap.channel("joint_currents").freshness is Freshness.OK
    assert hub.counters()["invalid_samples"] == 21


def test_calibration_offsets_are_subtracted() -> None:
    hub = SensorHub(ROBOT)
    hub.set_calibration({"wrist_force": (0.5,), "joint_encoders": (0.0, 0.01, 0.0, 0.0)})
    hub.update(_status(1, force=3.0), now=1.0)
    snap = hub.snapshot(1.0)
    assert snap.gripper_force == pytest.approx(2.5)
    assert snap.q[1] == pytest.approx(1.19)
    hub.set_calibration({})
    hub.update(_status(2, force=3.0), now=1.001)
    assert hub.snapshot(1.001).gripper_force == 3.0
    for bad in ({"estop_input": (1.0,)}, {"nope": (1.0,)}, {"wrist_force": (1.0, 2.0)},
                {"wrist_force": (math.nan,)}):
        with pytest.raises(ValueError):
            hub.set_calibration(bad)


def test_hub_drops_force_spikes() -> None:
    hub = SensorHub(ROBOT)
    rng = random.Random(2)
    for k in range(50):
        hub.update(_status(k, force=5.0 + rng.gauss(0, 0.05)), now=k * 0.001)
    hub.update(_status(50, force=35.0), now=0.050)
    assert hub.snapshot(0.050).gripper_force == pytest.approx(5.0, abs=0.3)
    assert hub.counters()["spikes_rejected"] == 1
    unfiltered = SensorHub(ROBOT, spike_filtered=())
    unfiltered.update(_status(50, force=35.0), now=0.050)
    assert unfiltered.snapshot(0.050).gripper_force == 35.0


def test_estop_edge_and_status_flag_drive_the_estop_channel() -> None:
    hub = SensorHub(ROBOT)
    hub.update(_status(1), now=1.0)
    (edge,) = _wire(EstopEdge(1500, True))
    hub.update(edge, now=1.0005)
    assert hub.snapshot(1.0006).estop_input is True
    hub.update(_status(2, estop=True), now=1.001)
    snap = hub.snapshot(1.001)
    assert snap.estop_input is True and snap.flags & StatusFlag.ESTOP_INPUT


def test_estimators_predict_a_lost_object_then_give_up() -> None:
    hub = SensorHub(ROBOT)
    hub.attach_estimators(EstimatorBank.create(ROBOT))
    rng = random.Random(4)
    t = 0.0
    for k in range(90):  # 3 s of an object moving at 10 cm/s in x, 30 Hz, 2 mm noise
        t = 2.0 + k / 30.0
        x = 0.15 + 0.1 * (k / 30.0)
        hub.update(_status(k), now=t)
        hub.update(Sensor(k, OBJECT, True, (x + rng.gauss(0, 0.002), 0.0, 0.1)), now=t)
    snap = hub.snapshot(t + 0.4)
    pose = snap.object_pose
    assert pose is not None and pose.source is Source.PREDICTED
    assert pose.age(snap.t) == pytest.approx(0.4)
    # Each sample describes the object latency_s (50 ms) before it arrived.
    truth_x = 0.15 + 0.1 * (89 / 30.0 + 0.4 + ROBOT.sensor("object_pose").latency_s)
    assert abs(pose.value[0] - truth_x) < 0.015  # the held value is 4.5 cm behind
    assert pose.value[1:] == pytest.approx((0.0, 0.1), abs=0.005)
    assert snap.q_source is Source.STALE and "joint_encoders" in snap.past_bound
    gone = hub.snapshot(t + 1.01)
    assert gone.object_pose is not None and gone.object_pose.source is Source.STALE
    assert "object_pose" in gone.past_bound


def test_every_predicted_channel_is_predicted_from_the_first_frame() -> None:
    """No estimator to wait for: one STATUS and one camera frame (real codec frames), then
    silence, and every `on_loss = "predict"` channel is predicted inside its bound."""
    hub = SensorHub(ROBOT)
    status, sensor = _wire(_status(1), Sensor(1000, OBJECT, True, (0.3, 0.1, 0.02)))
    hub.update(status, now=7.0)
    hub.update(sensor, now=7.0)
    predicted = [c.name for c in ROBOT.sensors if c.on_loss == "predict"]
    snap = hub.snapshot(7.005)  # 5 ms: past every 1 kHz channel's 3 ms staleness
    for name in ("joint_encoders", "wrist_force"):
        ch = snap.channel(name)
        assert ch.freshness is Freshness.STALE and ch.reading is not None, name
        assert ch.reading.source is Source.PREDICTED and ch.usable, name
    assert snap.q == pytest.approx((0.001, 1.2, -1.9, -0.87), abs=1e-6)
    assert snap.gripper_force == pytest.approx(3.0)
    later = hub.snapshot(7.2)  # the camera (30 Hz) is stale after 100 ms
    pose = later.object_pose
    assert pose is not None and pose.source is Source.PREDICTED
    assert pose.value == pytest.approx((0.3, 0.1, 0.02), abs=1e-6)  # one sample: no velocity
    assert set(predicted) == {"joint_encoders", "wrist_force", "object_pose"}


def test_encoders_are_predicted_for_a_few_ticks_only() -> None:
    hub = SensorHub(ROBOT)
    hub.attach_estimators(EstimatorBank.create(ROBOT))
    for k in range(300):  # joint 1 turning at 1 rad/s
        hub.update(_status(k, q=(0.001 * k, 1.2, -1.9, -0.87)), now=k * 0.001)
    snap = hub.snapshot(0.299 + 0.006)
    assert snap.q_source is Source.PREDICTED and "joint_encoders" not in snap.past_bound
    assert snap.q[0] == pytest.approx(0.305, abs=0.002)
    assert snap.dq[0] == pytest.approx(1.0, abs=0.1)
    assert snap.channel("joint_encoders").usable
    late = hub.snapshot(0.299 + 0.011)
    assert late.q_source is Source.STALE and "joint_encoders" in late.past_bound
    assert not late.channel("joint_encoders").usable


def test_unknown_channels_and_frames_are_counted() -> None:
    hub = SensorHub(ROBOT)
    hub.update(Sensor(0, 7, True, (1.0,)), now=1.0)
    hub.update(Pong(1, 2), now=1.0)
    assert hub.counters()["unknown_channel"] == 1 and hub.counters()["ignored_frames"] == 1


def test_a_status_channel_the_protocol_does_not_carry_is_refused() -> None:
    extra = SensorChannel("wrist_torque", "status", 1, "Nm", 1000.0, 0.01, "stop")
    robot: RobotDescription = dataclasses.replace(ROBOT, sensors=(*ROBOT.sensors, extra))
    with pytest.raises(ConfigError):
        SensorHub(robot)


def test_snapshots_are_consistent_while_the_reader_thread_writes() -> None:
    """Every snapshot shows one frame's values together, never a mix of two frames."""
    hub = SensorHub(ROBOT, spike_filtered=())
    n = 3000
    done = threading.Event()

    def writer() -> None:
        for k in range(1, n + 1):
            hub.update(_status(k, q=(k * 1e-3, k * 1e-3, -k * 1e-3, 0.0), force=float(k)),
                       now=k * 0.001)
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = 0
    while not done.is_set() or seen == 0:
        snap = hub.snapshot(now=0.0)
        if snap.fw_time_s is None:
            continue
        k = round(snap.fw_time_s * 1000)
        assert snap.q == pytest.approx((k * 1e-3, k * 1e-3, -k * 1e-3, 0.0))
        assert snap.gripper_force == float(k) and snap.last_cmd_seq == k
        seen += 1
    thread.join(timeout=30)
    assert hub.snapshot(n * 0.001).last_cmd_seq == n


def test_a_predicted_channel_past_its_std_bound_is_lost_in_firmware_time_only() -> None:
    """predict_max_std: the wrist force (a random walk) with a 1 N std bound is lost once the
    firmware kept reporting without it for long enough to grow that uncertain — well before its
    0.5 s time bound — while a host that is merely late (no new STATUS) loses nothing."""
    force = dataclasses.replace(STEADY.sensor("wrist_force"), predict_max_std=1.0)
    robot = dataclasses.replace(STEADY, sensors=tuple(
        force if c.name == "wrist_force" else c for c in STEADY.sensors))
    hub = SensorHub(robot)
    hub.attach_estimators(EstimatorBank.create(robot))
    for k in range(200):
        hub.update(_status(k), now=k * 0.001)
    assert hub.snapshot(0.199 + 0.3).lost == ()  # late host, same firmware time
    k = 200
    while hub.snapshot(k * 0.001).lost == ():
        hub.update(_status(k, force=math.nan), now=k * 0.001)
        k += 1
        assert k < 700, "never lost"
    snap = hub.snapshot(k * 0.001)
    assert snap.lost == ("wrist_force",) and (k - 200) * 0.001 < force.predict_max_s


def test_predict_max_std_and_the_soft_limit_margin_are_validated(tmp_path: Path) -> None:
    src = (Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml")
    text = src.read_text()
    bad_std = text.replace('on_loss = "stop"\n', 'on_loss = "stop"\npredict_max_std = 1.0\n', 1)
    (tmp_path / "a.toml").write_text(bad_std)
    with pytest.raises(ConfigError, match="predict_max_std"):
        load_robot(tmp_path / "a.toml")
    bad_margin = text.replace("soft_limit_margin_rad = 0.05", "soft_limit_margin_rad = 2.0")
    (tmp_path / "b.toml").write_text(bad_margin)
    with pytest.raises(ConfigError, match="soft_limit_margin_rad"):
        load_robot(tmp_path / "b.toml")
