"""The daemon's episodes: the decision journal, each task's episode record, and `journal.label`.

`Episodes` owns the `DecisionJournal` (None when `journal.enabled` is false) and its
`EpisodeMark` (store/episodes.py), which the control path keeps on the running task so that every
journaled decision carries its task id and step. It listens to every published event (any
thread; it only folds them under its lock): a task's attempts, retries, stops and L3 verdict,
and the degradation modes entered while it ran. At `task_done` — on the main thread that
publishes the executor's events, never the control thread — it writes the task's episode record
with the model that decided (name, version, sha256) and the decisions per backend.

`journal.label` runs on the command API's worker (the inbox worker for MQTT): it checks the task
id against the episodes ended in this boot and those on disk (newest segment first, each read
once), then appends the label (store/labels.py: small, fsynced, under a file lock).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from edge_agent.commands import CommandAPI, CommandContext, CommandRefused, ErrorCode
from edge_agent.errors import StoreError
from edge_agent.log import get_logger
from edge_agent.store.decisions import DecisionJournal, journal_dir
from edge_agent.store.episodes import EpisodeLookup, EpisodeMark
from edge_agent.store.labels import LabelError, LabelFile
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.events import Event
    from edge_agent.daemon.comms_hub import CommsHub
    from edge_agent.daemon.control import ControlPath

_log = get_logger(__name__)
ModelStatus = Callable[[], Mapping[str, Any] | None]


class Episodes:
    """See the module doc. `attach()` once the control path and the policy loader exist."""

    def __init__(self, cfg: Config, comms: CommsHub, boot_id: str) -> None:
        self.dir = journal_dir(cfg.state_dir)
        # Every policy decision (observation, action, backend, latency, outcome) is journaled:
        # own writer thread, bounded segments; a full disk turns the journal off with an event
        # (it never stops the robot — a failed *snapshot* write does).
        self.decisions = (DecisionJournal(
            self.dir, segment_bytes=cfg.journal.segment_bytes,
            max_segments=cfg.journal.max_segments, on_event=comms.event)
            if cfg.journal.enabled else None)
        self.mark = EpisodeMark()
        if self.decisions is not None:
            self.decisions.episode = self.mark
        self.labels = LabelFile(self.dir)
        self._boot_id = boot_id
        self._model: ModelStatus = lambda: None
        self._lock = threading.Lock()
        self._active: set[str] = set()  # degradation modes in force now
        self._open: dict[str, Any] | None = None  # the running task's episode so far
        self._lookup = EpisodeLookup(self.dir)  # earlier boots' episodes on disk
        self._ended: dict[str, int] = {}  # episodes ended in this boot: task id → decisions
        self.written = 0
        comms.add_listener(self.on_event)

    def attach(self, control: ControlPath, model_status: ModelStatus, api: CommandAPI) -> None:
        """The control path keeps the mark; the model in use; the `journal.label` handler."""
        control.episode = self.mark
        self._model = model_status
        api.register("journal.label", self.label)

    # -- folding events (any thread) -----------------------------------------------------
    def on_event(self, ev: Event) -> None:
        kind = ev.get("type")
        with self._lock:
            if kind in (EventType.DEGRADED, EventType.RECOVERED):
                mode = str(ev.get("mode"))
                if kind == EventType.DEGRADED:
                    self._active.add(mode)
                    if self._open is not None:
                        self._open["degraded"].add(mode)
                else:
                    self._active.discard(mode)
                return
            ep = self._open
            if kind == EventType.TASK_STARTED or (
                    kind == EventType.TASK_RESUMED and (ep is None
                                                        or ep["task_id"] != ev.get("task_id"))):
                self._open = ep = self._begin(ev)
                return
            if ep is None and kind == EventType.TASK_DONE:  # a task saved before a restart,
                ep = self._begin(ev)                       # ended without resuming it
            if ep is None or ev.get("task_id", ep["task_id"]) != ep["task_id"]:
                return
            if kind == EventType.ATTEMPT_FAILED:
                ep["l1"] += 1
                ep["l2"] += ev.get("verdict") == "retry"
                ep["l3"] = ep["l3"] or ev.get("verdict") == "diagnostic"
                ep["l3_count"] = ev.get("l3_count", ep["l3_count"])
            elif kind == EventType.TASK_FROZEN:
                if len(ep["stops"]) < 32:
                    ep["stops"].append({"stop": ev.get("stop"), "cause": ev.get("cause"),
                                        "state": ev.get("state")})
            elif kind == EventType.TASK_DONE:
                self._open = None
            else:
                return
        if kind == EventType.TASK_DONE:
            self._finish(ep, ev)  # outside the lock: it asks the policy loader for the model

    def _begin(self, ev: Mapping[str, Any]) -> dict[str, Any]:
        return {"task_id": str(ev.get("task_id")), "task": ev.get("task"),
                "started_wall": round(float(ev.get("ts", time.time())), 3),
                "resumed": ev.get("type") == EventType.TASK_RESUMED,
                "l1": 0, "l2": 0, "l3": False, "l3_count": 0, "stops": [],
                "degraded": set(self._active)}

    def _finish(self, ep: dict[str, Any], ev: Mapping[str, Any]) -> None:
        decisions, backends = self.mark.counts(ep["task_id"])
        try:
            st = self._model()
            model = st.get("model") if st else None
            policy = st.get("backend_in_use") if st else None
        except Exception:  # an episode without its model beats no episode
            _log.exception("episode_model_status_failed")
            model, policy = None, None
        stops = ep["stops"]
        rec = {**ep, "outcome": ev.get("outcome"), "message": ev.get("message"),
               "stop_cause": stops[-1]["cause"] if stops else None,
               "attempts": ev.get("attempts"), "degraded": sorted(ep["degraded"]),
               "decisions": decisions, "backends": backends,
               "model": dict(model) if isinstance(model, Mapping) else None,
               "policy": policy or "rule", "boot_id": self._boot_id,
               "ended_wall": round(float(ev.get("ts", time.time())), 3),
               "duration_s": ev.get("duration_s")}
        with self._lock:
            self._ended[rec["task_id"]] = decisions
            if len(self._ended) > 20_000:  # bounded: the oldest goes first
                self._ended.pop(next(iter(self._ended)))
        if self.decisions is not None and self.decisions.record_episode(rec):
            self.written += 1

    # -- labels (the command worker) -----------------------------------------------------
    def known(self, task_id: str) -> int | None:
        """Decisions of the episode `task_id` (None: no such episode): this boot's from memory,
        earlier ones from the episode journal, newest segment first, each segment read once
        (store/episodes.py `EpisodeLookup`: a recent task costs one 256 KiB segment)."""
        with self._lock:
            if task_id in self._ended:
                return self._ended[task_id]
        return self._lookup.steps(task_id)  # the command worker's only: one at a time

    def label(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        """`journal.label {"task_id", "verdict", "note"?, "step"?}`: append one label."""
        if self.decisions is None:
            raise CommandRefused(ErrorCode.DISABLED, "journal.label: journal.enabled is false")
        try:
            rec = self.labels.append({**args, "by": ctx.source}, known=self.known)
        except LabelError as exc:
            raise CommandRefused(ErrorCode.BAD_ARGS, f"journal.label: {exc}") from exc
        except (StoreError, OSError) as exc:
            raise CommandRefused(ErrorCode.REFUSED,
                                 f"journal.label: the label file failed: {exc}") from exc
        return {"label": rec}
