"""Two report sinks: the reports directory on disk, and the MQTT `report` topic.

`DiskSink` writes `<dir>/<id>.md`, `.png` (when drawn) and `.json` (the report, for `edge-agent
reports show`), atomically, and keeps the newest `max_files` reports. `MqttSink` builds the
`report` payload (≤ 64 KiB: the Markdown is cut at a line with a pointer when longer; the PNG
goes by reference) and hands it to a publish callable the daemon gives it — this module does not
import paho. A report counts as delivered on MQTT when the broker acknowledged it (QoS 1
PUBACK), not when paho took it: the sink polls the message's handle from the outbox thread
(never blocking paho's), and sends again when no PUBACK came within `ack_timeout_s`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edge_agent.reports.markdown import cut_markdown
from edge_agent.reports.outbox import Entry, Result
from edge_agent.reports.record import is_report_id
from edge_agent.store.atomic import fsync_dir, remove_durably, write_atomic

if TYPE_CHECKING:
    from edge_agent.contract.payloads import PlotRef, ReportPayload

MQTT_MAX_BYTES = 64 * 1024
EXTENSIONS = (".md", ".png", ".json")


class DiskSink:
    """`<dir>/<id>.{md,png,json}`, pruned to the newest `max_files` reports."""

    name = "disk"

    def __init__(self, directory: Path, max_files: int) -> None:
        self.dir = directory
        self.max_files = max_files

    def wait_s(self, now: float) -> float:
        return 0.0

    def group(self, entry: Entry, pending: Sequence[Entry]) -> list[Entry]:
        return []  # every report is its own file

    def deliver(self, entry: Entry, merged: Sequence[Entry], plot: Path | None,
                state: dict[str, Any]) -> Result:
        try:
            self.dir.mkdir(parents=True, exist_ok=True, mode=0o750)
            if plot is not None:
                tmp = self.dir / f".{entry.id}.png.tmp"
                shutil.copyfile(plot, tmp)
                with open(tmp, "rb+") as f:
                    os.fsync(f.fileno())
                tmp.replace(self.dir / f"{entry.id}.png")
            # the report as the outbox encoded it, and where its plot is
            body = (entry.report_json()[:-1]
                    + f',"plot":{json.dumps(f"{entry.id}.png" if plot else None)}}}')
            # the Markdown first: the .json is what readers list, so once it is there its .md
            # (and plot) are too
            write_atomic(self.dir / f"{entry.id}.md", entry.markdown.encode(), mode=0o640,
                         sync_dir=False)
            write_atomic(self.dir / f"{entry.id}.json", body.encode(), mode=0o640,
                         sync_dir=False)
            fsync_dir(self.dir)
            self.prune()
        except OSError as exc:
            return Result(False, f"disk: {exc.__class__.__name__}: {exc.strerror}")
        return Result(True)

    def prune(self) -> int:
        """Delete the oldest reports beyond max_files; how many were deleted."""
        ids = sorted({p.stem for p in self.dir.iterdir()
                      if p.suffix in EXTENSIONS and is_report_id(p.stem)})
        old = ids[:max(0, len(ids) - self.max_files)]
        remove_durably([self.dir / f"{i}{ext}" for i in old for ext in EXTENSIONS])
        return len(old)


def mqtt_payload(entry: Entry, device: str, plot: Path | None,
                 max_bytes: int = MQTT_MAX_BYTES) -> ReportPayload:
    """The `report` message (docs/asyncapi.yaml ReportPayload), at most `max_bytes` as JSON."""
    r = entry.report
    ref: PlotRef | None = None
    if plot is not None:
        data = plot.read_bytes()
        ref = {"file": f"{r.id}.png", "bytes": len(data),
               "sha256": hashlib.sha256(data).hexdigest()}
    payload: ReportPayload = {"v": 1, "id": r.id, "ts": r.wall, "kind": r.kind.value,
                               "title": r.title, "fault": r.fault, "markdown": entry.markdown,
                               "plot": ref, "recording": r.recording}
    size = len(json.dumps(payload, separators=(",", ":")).encode())
    if size > max_bytes:
        pointer = (f"*(cut to fit the MQTT payload limit: the full report is "
                   f"`edge-agent reports show {r.id}` on {device})*")
        budget = max_bytes - (size - len(json.dumps(entry.markdown).encode())) - 64
        md = cut_markdown(entry.markdown, budget, pointer)
        while len(json.dumps(md).encode()) > budget + 60:  # escapes made it longer
            budget -= 512
            md = cut_markdown(entry.markdown, budget, pointer)
        payload["markdown"] = md
        payload["cut"] = True
    return payload


class Published(Protocol):
    """A handed-over message (paho's `MQTTMessageInfo`): `is_published()` is true once the
    broker acknowledged it; it raises ValueError/RuntimeError when the message was not sent."""

    def is_published(self) -> bool: ...


class MqttSink:
    """QoS 1 on `<prefix>/report` through `publish(payload) -> Published | None` (None: not
    handed over, e.g. not connected — the bridge then leaves it out of paho's queue, which
    would send a second copy: this outbox is the durable queue). Delivered = the broker's
    PUBACK for it."""

    name = "mqtt"

    def __init__(self, publish: Callable[[ReportPayload], Published | None], device: str, *,
                 ack_timeout_s: float = 30.0, poll_s: float = 0.05,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.publish = publish
        self.device = device
        self.ack_timeout_s = ack_timeout_s
        self.poll_s = poll_s
        self.clock = clock
        self._in_flight: dict[str, tuple[Published, float]] = {}  # report id -> (handle, sent)

    def wait_s(self, now: float) -> float:
        return 0.0

    def group(self, entry: Entry, pending: Sequence[Entry]) -> list[Entry]:
        return []

    def deliver(self, entry: Entry, merged: Sequence[Entry], plot: Path | None,
                state: dict[str, Any]) -> Result:
        now = self.clock()
        sent = self._in_flight.get(entry.id)
        if sent is None:
            handle = self.publish(mqtt_payload(entry, self.device, plot))
            if handle is None:
                return Result(False, "mqtt: not connected")
            sent = self._in_flight[entry.id] = (handle, now)
        handle, at = sent
        try:
            acked = handle.is_published()
        except (ValueError, RuntimeError) as exc:  # not queued, or the connection was lost
            del self._in_flight[entry.id]
            return Result(False, f"mqtt: not sent: {exc}")
        if acked:
            del self._in_flight[entry.id]
            return Result(True)
        if now - at >= self.ack_timeout_s:  # send again (paho itself resends only on a reconnect)
            del self._in_flight[entry.id]
            return Result(False, f"mqtt: no PUBACK within {self.ack_timeout_s:g} s")
        return Result(False, "mqtt: waiting for PUBACK", retry_after_s=self.poll_s, waiting=True)
