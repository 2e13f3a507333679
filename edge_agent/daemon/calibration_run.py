"""Runs the rest calibration in the daemon (background, after READY) and applies what it may.

    calibrate(mirror, send, hub, robot, results=background, publish=..., should_stop=...)

For `window_s` it samples the raw STATUS stream (the link mirror's last frame, polled every
2 ms) and the camera's object pose, and interleaves PING frames through the link guardian,
timing each PONG by the link reader's arrival stamp; then `rest_calibration.RestCalibrator` does the
estimation. The wrist-force offset is applied at once (`SensorHub.set_calibration`); the object
pose offset too when a reference pose was given; joint encoder offsets are published only (see
rest_calibration.py). Its summary lands in `results["calibration"]` (`status.background`),
then the result goes out in a `calibration_ready` event (`calibration_failed` when the link never
came up).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from edge_agent.daemon.rest_calibration import CalibrationLimits, CalibrationResult, RestCalibrator
from edge_agent.errors import LinkError
from edge_agent.link.codec import Message, Ping
from edge_agent.log import get_logger
from edge_agent.robot import RobotDescription
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.contract.events import CalibrationReadyEvent, Event
    from edge_agent.contract.status_parts import BackgroundStatus
    from edge_agent.daemon.linkmirror import LinkMirror
    from edge_agent.sensors.hub import SensorHub

_log = get_logger(__name__)
DEFAULT_APPLY = ("wrist_force",)
POLL_S = 0.002


def run_calibration(mirror: LinkMirror, send: Callable[[Message], None], hub: SensorHub,
                    robot: RobotDescription, *, window_s: float = 2.0, exchanges: int = 20,
                    link_timeout_s: float = 30.0,
                    object_reference: Sequence[float] | None = None,
                    should_stop: Callable[[], bool] = lambda: False,
                    limits: CalibrationLimits | None = None) -> CalibrationResult | None:
    """Collect one window and estimate; None when no STATUS came within `link_timeout_s` or
    `should_stop()` turned true."""
    mono, sleep = time.monotonic, time.sleep
    give_up = mono() + link_timeout_s
    while mirror.last_status is None:
        if should_stop() or mono() > give_up:
            return None
        sleep(0.05)
    cal = RestCalibrator(robot, limits)
    start = mono()
    end = start + window_s
    every = window_s / (exchanges + 1)
    next_ping, sent, loops = start + every / 2, 0, 0
    waiting: set[int] = set()
    while True:
        now = mono()
        if should_stop():
            return None
        st = mirror.last_status
        if st is not None:
            cal.add_status(st)
        if loops % 5 == 0:  # the camera is 30 Hz: every 10 ms is plenty
            pose = hub.snapshot(now, tell=False).object_pose
            if pose is not None:
                cal.add_object_pose(pose.value, pose.t_fw)
        loops += 1
        if now >= next_ping and sent < exchanges:
            sent += 1
            next_ping += every
            t_send = int(mono() * 1e6)
            while t_send in waiting:
                t_send += 1
            try:
                send(Ping(t_send))
                waiting.add(t_send)
            except LinkError:
                pass
        for t_send in list(waiting):
            got = mirror.wait_pong(t_send, 0.0)
            if got is not None:
                pong, t_recv = got
                cal.add_exchange(t_send, pong.fw_time_us, int(t_recv * 1e6))
                waiting.discard(t_send)
        if now >= end and (not waiting or now >= end + 0.5):
            break
        sleep(POLL_S)
    return cal.result(object_reference=object_reference)


def calibrate(mirror: LinkMirror, send: Callable[[Message], None], hub: SensorHub,
              robot: RobotDescription, *, results: BackgroundStatus,
              publish: Callable[[Event], None],
              should_stop: Callable[[], bool],
              object_reference: Sequence[float] | None = None,
              apply: Sequence[str] | None = None, window_s: float = 2.0) -> dict[str, Any]:
    """Calibrate the running daemon, apply, keep the summary in `results`, publish the event.
    Never raises; the summary again."""
    t0 = time.monotonic()
    try:
        res = run_calibration(mirror, send, hub, robot, window_s=window_s,
                              object_reference=object_reference, should_stop=should_stop)
    except Exception as exc:
        _log.exception("calibration_failed")
        res, why = None, f"error: {exc}"
    else:
        why = ("the daemon is stopping" if should_stop()
               else "no STATUS from the robot (link down)")
    ms = round((time.monotonic() - t0) * 1e3, 1)
    if res is None:
        results["calibration"] = failed = {"ok": False, "reason": why, "ms": ms}
        publish({"type": EventType.CALIBRATION_FAILED, "reason": why})
        return failed
    channels = tuple(apply) if apply is not None else (
        DEFAULT_APPLY + (("object_pose",) if object_reference is not None else ()))
    offsets = res.offsets(channels)
    try:
        if offsets:
            hub.set_calibration(offsets)
    except ValueError as exc:  # a channel the robot description lacks
        _log.error("calibration_not_applied", error=str(exc))
        offsets = {}
    summary = {"ok": True, "ms": ms, "applied": sorted(offsets), **res.as_dict()}
    results["calibration"] = summary
    publish(_event(res, sorted(offsets), ms))
    return summary


def _event(res: CalibrationResult, applied: list[str], ms: float) -> CalibrationReadyEvent:
    c = res.clock
    return {"type": EventType.CALIBRATION_READY, "ms": ms, "applied": applied,
            "at_rest": res.at_rest,
            "wrist_force_offset_n": res.wrist_force.value[0] if res.wrist_force.value else None,
            "joint_encoder_offsets_rad": (None if res.joint_encoders.value is None else
                                          [round(v, 6) for v in res.joint_encoders.value]),
            "clock_offset_us": None if c is None else round(c.offset_us, 1),
            "clock_bound_us": None if c is None else round(c.bound_us, 1),
            "rtt_min_ms": None if c is None else round(c.rtt_min_us / 1e3, 4),
            "rtt_median_ms": None if c is None else round(c.rtt_median_us / 1e3, 4)}
