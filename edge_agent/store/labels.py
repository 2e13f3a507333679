"""Labels: a person's verdict on a decision or a whole episode, appended beside the journal.

    labels = LabelFile(journal_dir(state_dir))
    labels.append({"task_id": "t-17", "verdict": "wrong", "note": "let go too early",
                   "step": 4, "by": "mqtt"}, known=episode_index)   # raises LabelError
    latest_labels(journal_dir(state_dir))    # {(task_id, step | None): label}: the last wins

A label never rewrites the decision journal: it is one JSON record in its own journal
(`<state_dir>/journal/labels.*.jnl`: CRC-framed, its torn tail cut on open like the decisions'),
fsynced before `append` returns. The daemon (the `journal.label` command, on the inbox worker)
and `edge-agent journal label` (its own process) may both append: each append takes an exclusive
`flock` on `labels.lock`, opens the journal (repairing a tail torn by a crash), appends and
closes, so neither ever writes over the other. A record is small (the note is bounded) and the
open scans at most one segment (`SEGMENT_BYTES`), so an append is bounded too. The file is
bounded like every journal (`MAX_SEGMENTS`; the oldest segment goes first).

Record: `{"v": 1, "task_id", "step": int|null, "verdict", "note": str|null, "wall", "by"}`;
`step` null labels the whole episode.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from edge_agent.errors import EdgeAgentError
from edge_agent.store.journal import Journal

LABELS_NAME = "labels"
LOCK_NAME = "labels.lock"
VERDICTS = ("correct", "wrong", "needs_work")
MAX_NOTE = 280  # characters
MAX_TASK_ID = 128
LABEL_FORMAT = 1
SEGMENT_BYTES = 256 << 10
MAX_SEGMENTS = 32
# task id → the decisions its episode holds; None: no such episode
Known = Callable[[str], int | None]


class LabelError(EdgeAgentError):
    """A label was refused (bad verdict, note too long, unknown task or step)."""


def check_label(task_id: Any, verdict: Any, note: Any = None, step: Any = None,
                known: Known | None = None) -> None:
    """Raise LabelError naming what is wrong; `known` checks the task id and the step."""
    if not isinstance(task_id, str) or not 1 <= len(task_id) <= MAX_TASK_ID:
        raise LabelError(f"task_id: expected 1..{MAX_TASK_ID} characters")
    if verdict not in VERDICTS:
        raise LabelError(f"verdict: expected one of {', '.join(VERDICTS)}, got {verdict!r}")
    if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
        raise LabelError(f"note: expected at most {MAX_NOTE} characters")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
        raise LabelError(f"step: expected an integer >= 0, got {step!r}")
    if known is None:
        return
    steps = known(task_id)
    if steps is None:
        raise LabelError(f"unknown task_id {task_id!r}: no episode of that task is in the journal")
    if step is not None and step >= steps:
        raise LabelError(f"step {step} out of range: episode {task_id!r} has {steps} decisions "
                         f"(steps 0..{steps - 1})")


class LabelFile:
    """Appends labels under an exclusive lock (see the module doc); any thread or process."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)

    def append(self, label: Mapping[str, Any], known: Known | None = None) -> dict[str, Any]:
        """Check, append and fsync one label; the record written. Raises LabelError (refused)
        or StoreError / OSError (the disk)."""
        task_id, step = label.get("task_id"), label.get("step")
        note = label.get("note")
        check_label(task_id, label.get("verdict"), note, step, known)
        rec = {"v": LABEL_FORMAT, "task_id": task_id, "step": step,
               "verdict": label["verdict"], "note": note or None,
               "wall": round(time.time(), 3), "by": str(label.get("by") or "")[:64] or None}
        payload = json.dumps(rec, separators=(",", ":")).encode()
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.directory / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            j = Journal(self.directory, LABELS_NAME, segment_bytes=SEGMENT_BYTES,
                        max_segments=MAX_SEGMENTS, fsync_each=True)
            j.open()
            try:
                j.append(payload)
            finally:
                j.close()
        finally:
            os.close(fd)  # releases the lock
        return rec


def read_labels(directory: str | Path) -> Iterator[dict[str, Any]]:
    """Every decodable label, oldest first (read-only: safe while another process appends)."""
    for payload in Journal(directory, LABELS_NAME).iter_records():
        try:
            rec = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(rec, dict) and rec.get("v") == LABEL_FORMAT \
                and isinstance(rec.get("task_id"), str) and rec.get("verdict") in VERDICTS:
            yield rec


def latest_labels(directory: str | Path) -> dict[tuple[str, int | None], dict[str, Any]]:
    """(task id, step or None for the episode) → its last label: the last one wins."""
    return {(rec["task_id"], rec.get("step")): rec for rec in read_labels(directory)}
