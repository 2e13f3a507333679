"""`edge-agent fleet estop`: one message on the fleet e-stop topic, and who confirmed it.

**What counts as an acknowledgement**: after the publish, a robot's `stop` event (published
on every latch trip, a repeated e-stop included) with `kind` `estop` and `cause` `estop_fleet`,
or its retained `state` with `stop.kind` `estop` and `estop_fleet` among `stop.causes` (or as
`stop.cause`) that arrives after the publish — unless its state said so before the publish
already. A robot still latched by an earlier fleet e-stop publishes nothing new (its latch
does not trip again: the daemon sends the firmware STOP again and stays latched), so its
retained state, online and showing that latch, is its confirmation (`by: already_latched`).
Either is the daemon saying its latch holds because of this e-stop; the latch itself commanded
the firmware's STOP first (DESIGN.md "Stop model": the latch trips before anything is
published). Robots whose retained presence says
`offline` cannot answer: they are listed apart and count as unconfirmed, as do online robots
silent until `--deadline-s`. Exit code 1 when any robot did not confirm.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from edge_agent.fleet.bus import FleetBus, Robot

FLEET_CAUSE = "estop_fleet"
ESTOP_KIND = "estop"


def is_ack(kind: str, payload: dict[str, Any]) -> bool:
    """Whether one message (`event` or `state`) confirms the fleet e-stop (see the module doc)."""
    if kind == "event":
        return (payload.get("type") == "stop" and payload.get("kind") == ESTOP_KIND
                and payload.get("cause") == FLEET_CAUSE)
    if kind == "state":
        stop = payload.get("stop")
        if not isinstance(stop, dict) or stop.get("kind") != ESTOP_KIND:
            return False
        return FLEET_CAUSE in (stop.get("causes") or []) or stop.get("cause") == FLEET_CAUSE
    return False


@dataclass
class EstopResult:
    topic: str
    published_wall: float
    deadline_s: float
    acks: dict[str, dict[str, Any]] = field(default_factory=dict)  # device -> how and when
    silent: list[str] = field(default_factory=list)  # online, no confirmation by the deadline
    offline: list[str] = field(default_factory=list)  # retained presence offline

    @property
    def confirmed(self) -> bool:
        return not self.silent and not self.offline

    def as_dict(self) -> dict[str, Any]:
        return {"topic": self.topic, "published_wall": round(self.published_wall, 6),
                "deadline_s": self.deadline_s, "stopped": sorted(self.acks),
                "acks": self.acks, "no_answer": self.silent, "offline": self.offline,
                "confirmed": self.confirmed}


def fleet_estop(bus: FleetBus, topic: str, deadline_s: float, reason: str) -> EstopResult:
    """Publish the fleet e-stop on `topic` and count confirmations until `deadline_s`.

    The robots expected are those the broker's retained messages named before the publish
    (`bus.settle()` first)."""
    robots: list[Robot] = bus.snapshot()
    expected = {r.device for r in robots if r.online}
    # latched by a fleet e-stop already: a later state says nothing new, only a stop event does
    latched = {r.device for r in robots if r.state is not None and is_ack("state", r.state)}
    acks: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()
    t0 = [float("inf")]
    t0_mono = [0.0]

    def on_message(robot: Robot, kind: str, payload: dict[str, Any], at: float) -> None:
        if at < t0[0] or not is_ack(kind, payload):
            return
        if kind == "state" and robot.device in latched:
            return
        with lock:
            if robot.device not in acks:
                acks[robot.device] = {"by": kind, "ms": round(
                    (time.monotonic() - t0_mono[0]) * 1e3, 2)}

    bus.listen(on_message)
    t0_mono[0] = time.monotonic()
    t0[0] = time.time()
    bus.publish(topic, {"reason": reason}, qos=1)
    end = t0_mono[0] + deadline_s
    fresh = expected - latched
    while time.monotonic() < end:
        with lock:
            if fresh <= set(acks):
                break
        time.sleep(0.01)
    with lock:
        got = dict(acks)
    for device in sorted(expected & latched):
        got.setdefault(device, {"by": "already_latched", "ms": None})
    result = EstopResult(topic, t0[0], deadline_s, got)
    result.silent = sorted(expected - set(got))
    result.offline = sorted(r.device for r in robots if not r.online and r.device not in got)
    return result


def lines(result: EstopResult) -> list[str]:
    """The readable answer: one line per robot, then the count."""
    out = [f"fleet e-stop published on {result.topic}"]
    for device, ack in sorted(result.acks.items(), key=lambda kv: kv[1]["ms"] or 0.0):
        took = "       -   " if ack["ms"] is None else f"{ack['ms']:8.1f} ms"
        out.append(f"  {device:<20} stopped    {took}  ({ack['by']})")
    for device in result.silent:
        out.append(f"  {device:<20} NO ANSWER  within {result.deadline_s:g} s")
    for device in result.offline:
        out.append(f"  {device:<20} OFFLINE    (retained presence; cannot answer)")
    n = len(result.acks) + len(result.silent) + len(result.offline)
    out.append(f"{len(result.acks)}/{n} robots confirmed the e-stop"
               + ("" if result.confirmed else
                  f"; {len(result.silent)} did not answer, {len(result.offline)} offline"))
    return out
