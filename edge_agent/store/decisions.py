"""The decision journal: every policy decision as one compact binary record in a bounded Journal.

    dj = DecisionJournal(state_dir / "journal", segment_bytes=4 << 20, max_segments=16,
                         on_event=publisher.event)
    dj.open()                 # at start-up or in the background; a failure turns it off
    dj.record({"t": now, "observation": obs, "action": "advance", "backend": "onnx-cpu",
               "latency_ms": 0.4, "outcome": "ok"})          # the control thread: never blocks
    dj.stop()                 # drains, fsyncs, closes; idempotent

`record()` (also `dj(decision)`, so it is a decision sink) takes a mapping or an inference
`DecisionRecord` (anything with `as_dict()`), packs it with `struct` (a few µs, no I/O) and hands
the bytes to its own StoreWriter thread, which appends them with one fsync per group. The queue
is bounded (`max_pending`; past it a record is dropped and counted) and so is the disk
(`segment_bytes * max_segments`, oldest segments deleted). Its own writer keeps journal failures
away from the daemon's snapshot writer, whose errors are protective stops: a full disk or an I/O
error only turns the journal off, once, with a `journal_disabled` event — the robot keeps working.

Record formats (little-endian; `observation` as f32 — training data, not control state)::

    1: ver:u8=1 flags:u8 n:u16 t:f64 wall:f64 latency_ms:f32 obs[n]:f32 state action backend
       outcome
    2: ver:u8=2 flags:u8 n:u16 t:f64 wall:f64 latency_ms:f32 step:u32 obs[n]:f32 state action
       backend outcome task_id
    flags: bit0 `accepted` is known, bit1 its value; strings: len:u8 + UTF-8 ("" = none)

A decision made while a task runs is written in format 2: its episode (the task id) and its step
(0, 1, ... within the task), stamped by the journal's `episode` mark (store/episodes.py, kept by
the control path from the executor's task events). Outside a task — and in journals written
before episodes existed — it is format 1, and reads back with `task_id` and `step` None. Each
task's end adds one episode record to its own journal beside this one (store/episodes.py).

A shadow candidate's decisions (`model.shadow`, inference/shadow.py) go to their own journal
beside this one (`shadow.*.jnl`, same formats, `backend` = `shadow:<sha256[:12]>`, `outcome` =
`agree`|`differ`, the acting decision's task id and step), written by the same writer thread:
what reads `decisions` (the dataset export, drift, episodes, labels) never sees them;
`read_decisions(dir, SHADOW_NAME)` does.
"""

from __future__ import annotations

import math
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from edge_agent.log import get_logger
from edge_agent.store.drift_tally import DriftTally
from edge_agent.store.episodes import EpisodeMark, encode_episode, episodes_journal
from edge_agent.store.journal import Journal, JournalFull, RepairReport
from edge_agent.store.writer import StoreWriter
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.contract.events import Event
    from edge_agent.contract.status_parts import JournalStats

log = get_logger(__name__)

FORMAT = 1  # a decision outside any episode (and every record written before episodes)
FORMAT_EPISODE = 2  # a decision with its task id and step
JOURNAL_DIR = "journal"  # under the state dir
JOURNAL_NAME = "decisions"
SHADOW_NAME = "shadow"  # a shadow candidate's decisions (never acted on)
SHADOW_SEGMENT_BYTES = 1 << 20
SHADOW_MAX_SEGMENTS = 8
MAX_OBS = 1024
_HEAD = struct.Struct("<BBHddf")
_HEAD2 = struct.Struct("<BBHddfI")
_OBS: dict[int, struct.Struct] = {}
EventSink = Callable[["Event"], None]


class Decision(NamedTuple):
    """One decoded decision record."""

    t: float  # the decision's time as given (host monotonic of that boot)
    wall: float  # wall-clock time when it was journaled
    observation: tuple[float, ...]
    action: str | None  # None: no decision (inference failure)
    backend: str | None
    latency_ms: float  # NaN when not given
    outcome: str | None
    state: str | None
    accepted: bool | None  # None when not given
    task_id: str | None = None  # the episode; None outside a task and in format-1 records
    step: int | None = None  # the decision's index within its episode


def journal_dir(state_dir: str | Path) -> Path:
    return Path(state_dir) / JOURNAL_DIR


def _obs_struct(n: int) -> struct.Struct:
    s = _OBS.get(n)
    if s is None:
        s = _OBS[n] = struct.Struct(f"<{n}f")
    return s


def _text(v: Any) -> bytes:
    if v is None:
        return b"\x00"
    b = str(v).encode("utf-8", "replace")[:255]
    return bytes((len(b),)) + b


def encode_decision(d: Mapping[str, Any], wall: float | None = None,
                    task_id: str | None = None, step: int = 0) -> bytes:
    """Pack one decision (keys: t|mono, observation, action, backend, latency_ms|latency_s,
    outcome, state?, accepted?); format 2 with `task_id` and `step` when a task id is given.
    Raises ValueError/TypeError on a malformed one."""
    t = float(d.get("t", d.get("mono", math.nan)))
    lat = d.get("latency_ms")
    if lat is None and d.get("latency_s") is not None:
        lat = float(d["latency_s"]) * 1e3
    obs = [float(x) for x in (d.get("observation") or ())]
    n = len(obs)
    if n > MAX_OBS:
        raise ValueError(f"observation of {n} values > {MAX_OBS}")
    acc = d.get("accepted")
    flags = 0 if acc is None else (1 | (2 if acc else 0))
    wall = time.time() if wall is None else wall
    lat_ms = math.nan if lat is None else float(lat)
    if task_id is None:
        return b"".join((_HEAD.pack(FORMAT, flags, n, t, wall, lat_ms),
                         _obs_struct(n).pack(*obs), _text(d.get("state")),
                         _text(d.get("action")), _text(d.get("backend")),
                         _text(d.get("outcome"))))
    return b"".join((_HEAD2.pack(FORMAT_EPISODE, flags, n, t, wall, lat_ms, step),
                     _obs_struct(n).pack(*obs), _text(d.get("state")), _text(d.get("action")),
                     _text(d.get("backend")), _text(d.get("outcome")), _text(task_id)))


def decode_decision(payload: bytes) -> Decision | None:
    """Unpack one record; None for another format or a malformed payload (never raises)."""
    try:
        ver = payload[0]
        step: int | None = None
        if ver == FORMAT:
            _, flags, n, t, wall, lat = _HEAD.unpack_from(payload, 0)
            pos, fields = _HEAD.size, 4
        elif ver == FORMAT_EPISODE:
            _, flags, n, t, wall, lat, step = _HEAD2.unpack_from(payload, 0)
            pos, fields = _HEAD2.size, 5
        else:
            return None
        obs = _obs_struct(n).unpack_from(payload, pos)
        pos += 4 * n
        texts: list[str | None] = []
        for _ in range(fields):
            k = payload[pos]
            s = payload[pos + 1 : pos + 1 + k]
            if len(s) != k:
                return None
            texts.append(s.decode("utf-8", "replace") if k else None)
            pos += 1 + k
        if pos != len(payload):
            return None
    except (struct.error, IndexError):
        return None
    state, action, backend, outcome = texts[:4]
    task_id = texts[4] if len(texts) > 4 else None
    accepted = bool(flags & 2) if flags & 1 else None
    return Decision(t, wall, tuple(obs), action, backend, lat, outcome, state, accepted,
                    task_id, step)


def read_decisions(directory: str | Path, name: str = JOURNAL_NAME,
                   skipped: list[int] | None = None) -> Iterator[Decision]:
    """Every decodable decision, oldest first, read-only (safe while the daemon appends: a torn
    last record is skipped, not repaired). `skipped` (a one-item list) counts undecodable ones."""
    for payload in Journal(directory, name).iter_records():
        dec = decode_decision(payload)
        if dec is None:
            if skipped is not None:
                skipped[0] += 1
            continue
        yield dec


class DecisionJournal:
    """A decision sink that persists to a bounded journal and turns itself off on disk errors."""

    def __init__(self, directory: str | Path, *, segment_bytes: int = 4 << 20,
                 max_segments: int = 16, max_pending: int = 1024,
                 on_event: EventSink | None = None, name: str = JOURNAL_NAME) -> None:
        self.journal = Journal(directory, name, segment_bytes=segment_bytes,
                               max_segments=max_segments, fsync_each=False)
        self.episodes = episodes_journal(directory)  # one record per ended task, same writer
        self.shadow = Journal(directory, SHADOW_NAME, segment_bytes=SHADOW_SEGMENT_BYTES,
                              max_segments=SHADOW_MAX_SEGMENTS, fsync_each=False)
        self._writer = StoreWriter(on_error=self._on_store_error, max_records=max_pending,
                                   thread_name="journal")
        self._on_event = on_event
        self._lock = threading.Lock()
        self._open = False
        self._stopped = False
        self.disabled: str | None = None  # why the journal was turned off
        self.submitted = 0
        self.rejected = 0  # malformed records, queue full, or after it was turned off
        # storage_low (health/wiring.py): a decision can wait, the disk's last space cannot
        self.shedding = False
        self.shed = 0  # records not journaled while shedding
        # the newest journaled records as written (a repair report's "last decisions"): an
        # append of bytes already packed, so reading them never scans the journal on disk
        self._recent: deque[bytes] = deque(maxlen=64)
        # the running task and its next step (set by the control path; None: no episodes)
        self.episode: EpisodeMark | None = None
        # per (state, action) counts for the periodic drift report (None: not counted)
        self.tally: DriftTally | None = None

    @property
    def enabled(self) -> bool:
        return self._open and self.disabled is None and not self._stopped

    def open(self) -> RepairReport | None:
        """Open (repair the tail) and start the writer; None when the journal is turned off."""
        with self._lock:
            if self._open or self._stopped:
                return None
            try:
                report = self.journal.open()
                self.episodes.open()
                self.shadow.open()
            except Exception as exc:  # StoreError, JournalFull, or a bad directory
                self._disable(exc)
                return None
            self._open = True
        self._writer.start()
        if report.truncated_bytes:
            log.warning("decision_journal_tail_repaired", bytes=report.truncated_bytes,
                        reason=report.reason)
        return report

    def record(self, decision: Mapping[str, Any] | Any) -> bool:
        """Queue one decision; never blocks, never raises. False when not journaled."""
        if self.shedding:
            self.shed += 1
            return False
        if not self.enabled:
            self.rejected += 1
            return False
        try:
            d = decision if isinstance(decision, Mapping) else decision.as_dict()
            mark = self.episode
            if mark is not None and mark.task_id is not None:
                task_id, step = mark.take(d.get("backend"))
                payload = encode_decision(d, None, task_id, step)
            else:
                payload = encode_decision(d)
        except Exception as exc:  # a malformed record must never reach the control thread
            self.rejected += 1
            if self.rejected in (1, 10, 100) or self.rejected % 1000 == 0:
                log.warning("decision_record_rejected", error=repr(exc), rejected=self.rejected)
            return False
        if self._writer.submit_record(self.journal, payload):
            self.submitted += 1
            self._recent.append(payload)
            tally = self.tally
            if tally is not None:  # the drift report's counters (store/drift_tally.py)
                tally.count_decision(d.get("state"), d.get("action"))
            return True
        self.rejected += 1
        return False

    __call__ = record

    def record_episode(self, episode: Mapping[str, Any]) -> bool:
        """Queue one ended task's episode record (store/episodes.py); never blocks or raises.
        Not for the control thread: it encodes JSON."""
        if not self.enabled:
            return False
        try:
            payload = encode_episode(episode)
        except (TypeError, ValueError) as exc:
            log.warning("episode_record_rejected", error=repr(exc))
            return False
        if len(payload) > self.episodes.max_record_bytes:
            log.warning("episode_record_rejected", error="too big", bytes=len(payload))
            return False
        if self.tally is not None:
            self.tally.count_episode(episode)
        return self._writer.submit_record(self.episodes, payload)

    def record_shadow(self, decision: Mapping[str, Any], task_id: str | None,
                      step: int | None) -> bool:
        """Queue one shadow decision (its acting decision's task id and step) in the shadow
        journal; never blocks or raises. For the shadow's worker thread, not the control
        thread's step counter: the episode mark is not touched."""
        if self.shedding or not self.enabled:
            return False
        try:
            payload = encode_decision(decision, None, task_id, step or 0)
        except (TypeError, ValueError):
            return False
        return self._writer.submit_record(self.shadow, payload)

    def recent(self, n: int = 10) -> list[Decision]:
        """The newest `n` journaled decisions, oldest first (from memory, any thread)."""
        out = [decode_decision(p) for p in list(self._recent)[-n:]] if n > 0 else []
        return [d for d in out if d is not None]

    def set_shedding(self, on: bool) -> None:
        """Stop journaling (counted in `shed`) while the disk is short (storage_low), or resume:
        a journal a full disk turned off (cause disk_full, before the mode held) comes back too
        — a failed append was cut back, so the journal is whole; an fsync failure never does."""
        if on != self.shedding:
            log.warning("decision_journal_shedding" if on else "decision_journal_resumed",
                        shed=self.shed)
        self.shedding = on
        if on:
            return
        with self._lock:
            if self.disabled != "disk_full" or self._stopped or self.journal.broken is not None:
                return
            self.disabled = None
            reopen = not self._open
        log.warning("decision_journal_reenabled", reopen=reopen)
        if reopen:
            self.open()  # turned off at open(): a failure turns it off again, with its event

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every record queued so far is durable (or failed)."""
        return self._writer.flush(timeout)

    def stats(self) -> JournalStats:
        w = self._writer.stats
        return {"enabled": self.enabled, "disabled": self.disabled, "submitted": self.submitted,
                "written": w.records_written, "dropped": w.records_dropped,
                "rejected": self.rejected, "errors": w.errors, "shedding": self.shedding,
                "shed": self.shed,
                "segments": len(self.journal.segments())}

    def _on_store_error(self, name: str, exc: BaseException) -> None:
        with self._lock:
            self._disable(exc)

    def _disable(self, exc: BaseException) -> None:  # lock held
        if self.disabled is not None:
            return
        cause = "disk_full" if isinstance(exc, JournalFull) else "io_error"
        self.disabled = cause
        log.error("decision_journal_disabled", cause=cause, error=str(exc))
        if self._on_event is not None:
            try:
                self._on_event({"type": EventType.JOURNAL_DISABLED, "journal": self.journal.name,
                                "cause": cause, "error": str(exc),
                                "records_written": self._writer.stats.records_written})
            except Exception:
                log.exception("decision_journal_event_failed")

    def stop(self) -> None:
        """Write what is queued, then close. Idempotent; never raises."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        self._writer.stop()
        self.journal.close()
        self.episodes.close()
        self.shadow.close()
