"""The record of frames the simulated firmware received: in memory, optionally as JSON lines.

Tests assert on what the host actually sent ("a STOP arrived", "no POSITION command after T").
Each entry: `t` (the runner's clock: time.monotonic() on the pty rig, virtual seconds in lock-step),
`fw_us` (firmware time at reception), `type` (FrameType name), `seq`, and the payload's fields
(enums by name, floats as sent).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections import deque
from collections.abc import Iterable
from enum import Enum
from typing import Any, TextIO

from edge_agent.link.codec import Frame, FrameType

_NAMES = {t.value: t.name for t in FrameType}


@dataclasses.dataclass(frozen=True, slots=True)
class Received:
    """One frame as the firmware received it."""

    t: float
    fw_us: int
    type: str
    seq: int
    msg: Any

    @property
    def fields(self) -> dict[str, Any]:
        """The payload (computed when asked: recording stays cheap in the lock-step runner)."""
        return summarize(self.msg)

    def as_dict(self) -> dict[str, Any]:
        return {"t": self.t, "fw_us": self.fw_us, "type": self.type, "seq": self.seq,
                **self.fields}


def summarize(msg: Any) -> dict[str, Any]:
    """The payload of a message as JSON-friendly fields."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(msg):
        v = getattr(msg, f.name)
        if isinstance(v, Enum):
            v = v.name
        elif isinstance(v, tuple):
            v = list(v)
        out[f.name] = v
    return out


class FrameRecord:
    """Bounded in-memory record of received frames, mirrored to a JSON-lines sink when given."""

    def __init__(self, maxlen: int = 200_000, sink: TextIO | None = None,
                 robot: int | None = None) -> None:
        self.entries: deque[Received] = deque(maxlen=maxlen)
        self.sink = sink
        self.robot = robot
        self.total = 0

    def add(self, t: float, fw_us: int, frame: Frame) -> Received:
        entry = Received(t, fw_us, _NAMES[frame.msg.TYPE], frame.seq, frame.msg)
        self.entries.append(entry)
        self.total += 1
        if self.sink is not None:
            d = entry.as_dict()
            if self.robot is not None:
                d = {"robot": self.robot, **d}
            self.sink.write(json.dumps(d, separators=(",", ":")) + "\n")
        return entry

    def query(self, type: str | None = None, since: float | None = None,
              since_fw_us: int | None = None, limit: int | None = None,
              where: dict[str, Any] | None = None,
              entries: Iterable[Received] | None = None) -> list[Received]:
        """Entries in order of reception (or of `entries`, a copy), filtered; `limit` keeps the
        most recent ones."""
        out = [e for e in (self.entries if entries is None else entries)
               if (type is None or e.type == type)
               and (since is None or e.t >= since)
               and (since_fw_us is None or e.fw_us >= since_fw_us)]
        if where:
            out = [e for e in out if all(e.fields.get(k) == v for k, v in where.items())]
        if limit is not None:
            out = out[-limit:] if limit > 0 else []
        return out

    def last(self, type: str | None = None) -> Received | None:
        for e in reversed(self.entries):
            if type is None or e.type == type:
                return e
        return None

    def flush(self) -> None:
        if self.sink is not None:
            with contextlib.suppress(OSError, ValueError):
                self.sink.flush()

    def clear(self) -> None:
        self.entries.clear()
