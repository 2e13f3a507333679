"""The link reader (LinkMirror.on_frame): STATUS into the hub, the e-stop input mirrored."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.executor.latch import StopLatch
from edge_agent.link.codec import FrameDecoder, Status, StatusFlag, encode
from edge_agent.robot import load_robot
from edge_agent.sensors.hub import SensorHub
from edge_agent.sensors.kalman import EstimatorBank
from edge_agent.sensors.readings import Source
from edge_agent.vocab import StopCause

REPO = Path(__file__).resolve().parents[1]
ROBOT = load_robot(REPO / "configs" / "robot" / "edge-arm-4.toml")


def _status(k: int, estop: bool) -> Status:
    flags = StatusFlag.DRIVES_ENABLED | StatusFlag.SESSION_OPEN
    if estop:
        flags |= StatusFlag.ESTOP_INPUT
    return Status(1_000 * k, flags, k, (0.001 * k, 1.2, -1.9, -0.87), (1.0, 0.0, 0.0, 0.0),
                  (0.1, 0.2, 0.3, 0.4), 0.04, 0.5, 3.0)


def test_status_frames_feed_the_hub_and_mirror_the_estop_input() -> None:
    clock_t = [10.0]

    def clock() -> float:
        clock_t[0] += 0.001
        return clock_t[0]

    hub = SensorHub(ROBOT)
    hub.attach_estimators(EstimatorBank.create(ROBOT))
    latch = StopLatch()
    events: list[dict[str, Any]] = []
    mirror = LinkMirror(hub, latch, events.append, clock=clock)
    pressed_at = {300, 301, 302}
    data = b"".join(encode(_status(k, k in pressed_at), k) for k in range(400))
    for frame in FrameDecoder().feed(data):
        mirror.on_frame(frame)
        assert mirror.last_status is frame.msg
    assert mirror.frames == 400 and mirror.last_frame_at == clock_t[0]
    assert events == [{"type": "estop_input", "pressed": True},
                      {"type": "estop_input", "pressed": False}]
    assert StopCause.ESTOP_INPUT in latch.state.causes
    snap = hub.snapshot(clock_t[0])
    assert snap.q_source is Source.MEASURED and snap.estop_input is False
    assert abs(snap.q[0] - 0.399) < 1e-6 and snap.gripper_force == 3.0  # float32 on the wire
    assert hub.counters()["status_frames"] == 400
    predicted = hub.snapshot(clock_t[0] + 0.005)  # stale encoders, within their bound
    assert predicted.q_source is Source.PREDICTED
    assert abs(predicted.q[0] - (0.399 + 0.005)) < 1e-4  # the filter learned 1 rad/s


def test_bench_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "hil.bench_link_reader", "--n", "300",
                          "--repeat", "1"], cwd=REPO, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "estimators attached" in out and "% core" in out


def test_the_deadman_summary_is_strict_json_before_any_moving_command() -> None:
    """status.link.watch: `moved_at` is null until a moving command, then its time; never
    -Infinity (Python's json writes it, strict parsers such as JavaScript's JSON.parse refuse
    the whole status message)."""
    import json

    from edge_agent.daemon.deadman import GuardianWatch

    latch = StopLatch()
    mirror = LinkMirror(SensorHub(ROBOT), latch, lambda _e: None)
    watch = GuardianWatch(mirror, latch, 0.05, lambda: True)
    first = watch.summary()
    assert first["moved_at"] is None
    json.dumps(first, allow_nan=False)  # raises on a non-finite number
    watch.commanded(True, 12.5)
    assert watch.summary()["moved_at"] == 12.5
