"""The daemon's flight recorder: `[observe]` → observe/recorder.py, the report link, commands.

`DaemonRecording(cfg, api)` registers `record.start` / `record.stop` (the command API's worker)
and builds the recorder (nothing imported yet); `start()` runs after READY (it imports `mcap`
and subscribes to the tap). `link(report)` is the report outbox's hook (reports/outbox.py, on
its thread): every report kind gets a capture from `record_pre_s` before the report's time to
`record_post_s` after it, and the report names the file (`Report.recording`: the Markdown, the
MQTT `report` payload, the chat line). With `observe.record = false` nothing is recorded and
the commands answer `disabled`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.commands.codes import CommandRefused
from edge_agent.log import get_logger
from edge_agent.observe.recorder import Recorder, RecorderSettings
from edge_agent.vocab import ErrorCode

if TYPE_CHECKING:
    from edge_agent.commands.api import CommandAPI, CommandContext
    from edge_agent.config import Config
    from edge_agent.contract.status_observe import RecorderStatus
    from edge_agent.reports.record import Report

_log = get_logger(__name__)
RECORDINGS_DIR = "recordings"


def recordings_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / RECORDINGS_DIR


def settings_from(cfg: Config) -> RecorderSettings:
    o = cfg.observe
    return RecorderSettings(pre_s=o.record_pre_s, post_s=o.record_post_s,
                            ring_bytes=o.record_ring_bytes, max_files=o.record_max_files,
                            max_bytes=o.record_max_bytes, max_capture_s=o.record_max_s)


class DaemonRecording:
    """See the module doc."""

    def __init__(self, cfg: Config, api: CommandAPI) -> None:
        self.recorder = (Recorder(recordings_dir(cfg.state_dir), settings_from(cfg))
                         if cfg.observe.record else None)
        api.register("record.start", self.record_start)
        api.register("record.stop", self.record_stop)

    def start(self) -> None:
        if self.recorder is None:
            return
        try:
            self.recorder.start()
        except ImportError as exc:  # mcap is missing (a --no-deps install): run without
            _log.warning("recorder_unavailable", why=str(exc),
                         hint="pip install 'mcap>=1.2' 'lz4>=4'")
            self.recorder = None

    def stop(self) -> None:
        if self.recorder is not None:
            self.recorder.stop()

    def status(self) -> RecorderStatus | None:
        """The recorder's figures (record.stop's reply carries them too), None when off."""
        return self.recorder.status() if self.recorder is not None else None

    def link(self, report: Report) -> Report:
        """The outbox's hook: a capture around the report's time, named in the report."""
        if self.recorder is None:
            return report
        path = self.recorder.trigger(report.kind.value, report.wall, report_id=report.id,
                                     kind=report.kind.value)
        return dataclasses.replace(report, recording=str(path))

    def _on(self, command: str) -> Recorder:
        if self.recorder is None:
            raise CommandRefused(ErrorCode.DISABLED, f"{command}: observe.record is false")
        return self.recorder

    def record_start(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """`record.start {"name"?}`: an on-demand capture (from record_pre_s ago)."""
        rec = self._on("record.start")
        path = rec.start_capture(args.get("name") or "manual")
        if path is None:
            raise CommandRefused(ErrorCode.BUSY,
                                 f"record.start: already recording to {rec.recording()}")
        return {"path": str(path), "pre_s": rec.s.pre_s, "max_s": rec.s.max_capture_s,
                "recorder": rec.status()}

    def record_stop(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """`record.stop`: the on-demand capture ends; the file is finished within ~0.1 s."""
        path = self._on("record.stop").stop_capture()
        if path is None:
            raise CommandRefused(ErrorCode.REFUSED, "record.stop: nothing is recording")
        return {"path": str(path), "recorder": self._on("record.stop").status()}
