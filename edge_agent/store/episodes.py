"""Episodes: which task a decision belongs to, and the record each task leaves when it ends.

One task is one episode. `EpisodeMark` is the running task and the step its next decision gets:
the control path sets it from the executor's task events on the control thread (between two
ticks, under the executor lock) and the decision journal reads it for every record — one
attribute read, one add and one dict update, so a decision costs what it did before.

When a task ends the daemon (daemon/episodes.py, off the control thread) writes an episode record
to its own journal beside the decisions (`<state_dir>/journal/episodes.*.jnl`, the same
CRC-framed, tail-repaired format, bounded), one JSON object per task::

    {"v": 1, "task_id", "task", "outcome": "success"|"failed"|"aborted", "message",
     "l3": bool, "stop_cause": str|null, "attempts", "l1", "l2", "l3_count",
     "stops": [{"stop", "cause", "state"}], "degraded": [mode, ...], "decisions",
     "backends": {backend: decisions}, "model": {"name", "version", "sha256"}|null,
     "policy", "resumed", "boot_id", "started_wall", "ended_wall", "duration_s"}

`decisions` and `backends` count this boot's decisions of the task: one resumed after a restart
(`resumed`: its episode began with a resume) numbers its steps from 0 again, and its steps of the
earlier boot have no episode record (the task never ended there). `policy`: the backend that
made the last decision of the daemon when the task ended (`rule` without a model).

`l1`: failed attempts (each one an L1 detection: a missed sub-goal, a lost part, a policy
`retry_alternative`); `l2`: the retries with an alternative that followed; `l3`: the task ended in
`diagnostic` (the L3 threshold); `l3_count`: failed attempts in a row when it ended.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.store.journal import Journal
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.contract.events import Event

EPISODES_NAME = "episodes"
EPISODE_FORMAT = 1
EPISODE_SEGMENT_BYTES = 256 << 10  # ~500 episodes: what a label's check reads first
EPISODE_MAX_SEGMENTS = 16  # ~8,000 episodes
NO_BACKEND = "none"  # a decision journaled without a backend (no decision was made)


class EpisodeMark:
    """The running task (None: no episode) and its next decision's step (see module doc).

    Written by one thread at a time: the control path between ticks, and the decision journal
    for the one decision in flight; `finished` hands each ended episode's decision count and
    backends to the thread that writes its record."""

    __slots__ = ("backends", "finished", "step", "task_id")

    def __init__(self) -> None:
        self.task_id: str | None = None
        self.step = 0
        self.backends: dict[str | None, int] = {}
        self.finished: deque[tuple[str, int, dict[str | None, int]]] = deque(maxlen=64)

    def take(self, backend: str | None) -> tuple[str | None, int]:
        """The running task and the step of the decision being journaled (then one more)."""
        step = self.step
        self.step = step + 1
        b = self.backends  # keyed as given (None: no backend), named in `counts`
        b[backend] = b.get(backend, 0) + 1
        return self.task_id, step

    def follow(self, event: Event) -> None:
        """An executor event: a task starts, resumes (the same episode goes on) or ends."""
        kind = event.get("type")
        if kind == EventType.TASK_STARTED or (kind == EventType.TASK_RESUMED
                                              and event.get("task_id") != self.task_id):
            self.task_id = str(event.get("task_id"))
            self.step = 0
            self.backends = {}
        elif kind == EventType.TASK_DONE and self.task_id is not None:
            self.finished.append((self.task_id, self.step, self.backends))
            self.task_id = None
            self.step = 0
            self.backends = {}

    def counts(self, task_id: str) -> tuple[int, dict[str, int]]:
        """An ended episode's decisions and backends (0, {} when not found): the writer's."""
        for tid, steps, backends in reversed(list(self.finished)):  # a copy: it may grow
            if tid == task_id:
                return steps, {k or NO_BACKEND: v for k, v in backends.items()}
        return 0, {}


def encode_episode(record: Mapping[str, Any]) -> bytes:
    """One episode record as its journal payload (compact JSON, UTF-8)."""
    return json.dumps({"v": EPISODE_FORMAT, **record}, separators=(",", ":"),
                      allow_nan=False).encode()


def decode_episode(payload: bytes) -> dict[str, Any] | None:
    """The record, or None for a malformed one or another format (never raises)."""
    try:
        rec = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(rec, dict) or rec.get("v") != EPISODE_FORMAT \
            or not isinstance(rec.get("task_id"), str):
        return None
    return rec


def episodes_journal(directory: str | Path) -> Journal:
    """The episode journal of a journal directory (appended with an fsync per group)."""
    return Journal(directory, EPISODES_NAME, segment_bytes=EPISODE_SEGMENT_BYTES,
                   max_segments=EPISODE_MAX_SEGMENTS, fsync_each=False)


def read_episodes(directory: str | Path) -> Iterator[dict[str, Any]]:
    """Every decodable episode record, oldest first, read-only (safe while the daemon writes)."""
    for payload in Journal(directory, EPISODES_NAME).iter_records():
        rec = decode_episode(payload)
        if rec is not None:
            yield rec


def episode_index(directory: str | Path) -> dict[str, int]:
    """task id → decisions of every episode on disk (a label's check: does the task exist)."""
    return {rec["task_id"]: int(rec.get("decisions") or 0) for rec in read_episodes(directory)}


class EpisodeLookup:
    """A label's check in the daemon, reading as little as it can: the episode journal's
    segments newest first, each read once (CRC-checked in Python: ~0.1 s per MiB), until the
    task is found. A recent task costs one small segment; an unknown one reads them all, once
    per lookup object (they are cached; episodes that end later are the caller's to know)."""

    def __init__(self, directory: str | Path) -> None:
        self._journal = Journal(directory, EPISODES_NAME)
        self._read: dict[str, dict[str, int]] = {}  # segment name → its task ids

    def steps(self, task_id: str) -> int | None:
        """The decisions of the episode `task_id`, None when none is on disk."""
        for seg in reversed(self._journal.segments()):
            ids = self._read.get(seg.name)
            if ids is None:
                ids = self._read[seg.name] = {}
                for payload in self._journal.iter_segment(seg):
                    rec = decode_episode(payload)
                    if rec is not None:
                        ids[rec["task_id"]] = int(rec.get("decisions") or 0)
            if task_id in ids:
                return ids[task_id]
        return None
