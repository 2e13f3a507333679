"""The durable report outbox: persist first, then plot and deliver to every sink on its own thread.

    outbox = Outbox(state_dir / "outbox", sinks=[disk, mqtt, webhook], max_entries=200)
    outbox.start()                    # loads what a previous run left (kill -9 included)
    outbox.submit(lambda: build_report(record, origin, decisions()))   # any thread: enqueues
    outbox.stop()                     # idempotent, never raises

Each report is one file `<id>.json` (the report, its Markdown, and per sink: pending / done /
merged, attempts, next try, last error), written atomically (temp → fsync → rename → fsync dir)
before any delivery, and rewritten after each delivery step — so a restart delivers exactly what
was not yet acknowledged, with the same idempotency key. A write that fails (a full disk) leaves
the entry in memory, delivered all the same (`unpersisted` counts them); under storage_low
(`shed_plots`) no plot is drawn. The plot is `<id>.png`, drawn by a
subprocess (reports/plot.py). When every sink is done the files are removed. The outbox holds at
most `max_entries` reports: a new one past that drops the oldest, counted in `state.json` and
told through `on_event` (a `report_dropped` event). Nothing here runs on the control path.
"""

from __future__ import annotations

import contextlib
import json
import queue
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from edge_agent.log import get_logger
from edge_agent.reports.markdown import redact, render_markdown
from edge_agent.reports.plot import render_plot
from edge_agent.reports.record import Report, ReportKind, is_report_id
from edge_agent.store import json_pieces
from edge_agent.store.atomic import read_capped, remove_durably, write_atomic
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.contract.events import Event
    from edge_agent.contract.status_parts import ReportsStatus

_log = get_logger(__name__)
STATE_NAME = "state.json"
# An entry is ~50 KB (the record with its raw sensor window, the Markdown); a file past this is
# set aside as corrupt, not read: at most `max_entries` of them are held.
ENTRY_MAX_BYTES = 4 << 20
PENDING, DONE, MERGED = "pending", "done", "merged"


@dataclass(frozen=True, slots=True)
class Result:
    """A sink's answer: delivered, or retry (after `retry_after_s` when the receiver said)."""

    ok: bool
    error: str = ""
    retry_after_s: float | None = None
    deferred: bool = False  # not tried (a local rate limit): no attempt is counted
    # sent, the receiver's acknowledgement not in yet (MQTT PUBACK): not delivered, no attempt
    # counted, nothing to persist — the sink is asked again after `retry_after_s`
    waiting: bool = False


class Entry:
    """One report in the outbox, with its delivery state (what `<id>.json` holds)."""

    def __init__(self, report: Report, markdown: str, sinks: dict[str, dict[str, Any]],
                 plot: str | None = None, created: float | None = None) -> None:
        self.report = report
        self.markdown = markdown
        self.sinks = sinks
        self.plot = plot  # None: not drawn yet; "ok"; or why there is none
        self.created = time.time() if created is None else created
        self._report_json: str | None = None  # encoded once: it never changes

    def report_json(self) -> str:
        """The report as JSON, encoded once and in pieces (store/json_pieces.py: a sensor
        window's C encode held the GIL for ms, and each delivery step re-wrote the entry)."""
        if self._report_json is None:
            self._report_json = json_pieces.dumps(self.report.as_dict(), allow_nan=False)
        return self._report_json

    def to_json(self) -> str:
        """`as_dict()` as JSON: only the small delivery state is encoded again each time."""
        rest = json.dumps({"markdown": self.markdown, "plot": self.plot,
                           "created": self.created, "sinks": self.sinks},
                          separators=(",", ":"), allow_nan=False)
        return f'{{"v":1,"report":{self.report_json()},{rest[1:]}'

    @property
    def id(self) -> str:
        return self.report.id

    def as_dict(self) -> dict[str, Any]:
        return {"v": 1, "report": self.report.as_dict(), "markdown": self.markdown,
                "plot": self.plot, "created": self.created, "sinks": self.sinks}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Entry:
        return cls(Report.from_dict(d["report"]), str(d["markdown"]),
                   {str(k): dict(v) for k, v in dict(d["sinks"]).items()}, d.get("plot"),
                   float(d.get("created", time.time())))


class Sink(Protocol):
    """A delivery target. `deliver` gets the leader and the repeats merged into it."""

    name: str

    def wait_s(self, now: float) -> float:
        """Seconds before this sink may send again (a rate limit); 0 when it may now."""
        ...

    def group(self, entry: Entry, pending: Sequence[Entry]) -> list[Entry]:
        """The pending repeats (other entries) to merge into `entry`'s message; [] for none."""
        ...

    def deliver(self, entry: Entry, merged: Sequence[Entry], plot: Path | None,
                state: dict[str, Any]) -> Result:
        """Deliver (idempotent by entry.id); may keep progress in `state` (persisted)."""
        ...


class Outbox:
    """See the module doc."""

    def __init__(self, directory: Path, sinks: Sequence[Sink], *, max_entries: int = 200,
                 plot: bool = True, max_rows: int = 20, retry_min_s: float = 1.0,
                 retry_max_s: float = 300.0, secrets: Sequence[str] = (),
                 plot_repeat_s: float = 60.0,
                 on_event: Callable[[Event], None] | None = None) -> None:
        self.dir = directory
        self.sinks = list(sinks)
        self.max_entries = max_entries
        self.plot = plot
        self.max_rows = max_rows
        self.retry_min_s = retry_min_s
        self.retry_max_s = retry_max_s
        # a plot costs a process and ~1 s of CPU: a repeat of the same fault inside this many
        # seconds goes without one (a fault storm must not become a plotting storm); a drift
        # report, filed once a period, always gets its plot
        self.plot_repeat_s = plot_repeat_s
        self._plotted: dict[str, float] = {}  # fault -> wall time of its last plot
        self.shed_plots = False  # storage_low (health/wiring.py): no new PNGs on a short disk
        self.unpersisted = 0  # writes of an entry that failed (a full disk): kept in memory
        self._secrets = tuple(secrets)
        self._on_event = on_event
        # the flight recorder's hook (daemon/recording.py): the report, linked to its MCAP file
        self.link: Callable[[Report], Report] | None = None
        self._entries: dict[str, Entry] = {}
        self._incoming: queue.Queue[Callable[[], Report]] = queue.Queue(maxsize=1000)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # status() from other threads
        self.dropped = 0
        self.delivered: dict[str, int] = {s.name: 0 for s in self.sinks}
        self.failures: dict[str, int] = {s.name: 0 for s in self.sinks}
        self.last_error: dict[str, str] = {}
        self.built = 0
        self.corrupt = 0

    # -- any thread ------------------------------------------------------------------------
    def submit(self, make: Callable[[], Report]) -> bool:
        """Queue a report (built on the outbox thread); False when the queue is full."""
        try:
            self._incoming.put_nowait(make)
        except queue.Full:
            with self._lock:
                self.dropped += 1
            return False
        self._wake.set()
        return True

    def status(self) -> ReportsStatus:
        with self._lock:
            return {"pending": len(self._entries), "dropped": self.dropped,
                    "built": self.built, "delivered": dict(self.delivered),
                    "failed_attempts": dict(self.failures), "corrupt": self.corrupt,
                    "unpersisted": self.unpersisted, "shed_plots": self.shed_plots,
                    "last_error": dict(self.last_error), "sinks": [s.name for s in self.sinks]}

    def pending_ids(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._load()
        self._thread = threading.Thread(target=self._run, name="report-outbox", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread (what is not delivered stays on disk for the next start)."""
        self._stopping.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)

    def _load(self) -> None:
        for tmp in self.dir.glob(".*.tmp*"):
            with contextlib.suppress(OSError):
                tmp.unlink()
        with contextlib.suppress(OSError, ValueError, TypeError):
            self.dropped = int(json.loads(read_capped(self.dir / STATE_NAME, 64 << 10))["dropped"])
        for path in sorted(self.dir.glob("*.json")):
            if not is_report_id(path.stem):
                continue
            try:
                entry = Entry.from_dict(json.loads(read_capped(path, ENTRY_MAX_BYTES)))
                for s in self.sinks:  # a sink added since: deliver there too
                    entry.sinks.setdefault(s.name, {"state": PENDING, "attempts": 0})
                self._entries[entry.id] = entry
            except (OSError, ValueError, KeyError, TypeError) as exc:
                self.corrupt += 1
                _log.error("report_outbox_corrupt", file=path.name, error=str(exc))
                with contextlib.suppress(OSError):
                    path.rename(path.with_suffix(".corrupt"))
        if self._entries:
            _log.info("report_outbox_loaded", pending=len(self._entries))

    # -- the outbox thread -----------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopping.is_set():
            try:
                self._take_incoming()
                wait = self._deliver_due()
            except Exception:  # never let one bad report end delivery
                _log.exception("report_outbox_error")
                wait = self.retry_min_s
            self._wake.wait(max(0.01, wait))
            self._wake.clear()

    def _take_incoming(self) -> None:
        while not self._stopping.is_set():
            try:
                make = self._incoming.get_nowait()
            except queue.Empty:
                return
            try:
                report = make()
                if self.link is not None:
                    report = self.link(report)
            except Exception:
                _log.exception("report_build_failed")
                continue
            plot_name = (f"{report.id}.png" if self.plot and report.has_plot and not
                         self.shed_plots and (report.kind is ReportKind.DRIFT
                                              or not self._repeat(report)) else None)
            md = render_markdown(report, max_rows=self.max_rows, plot_name=plot_name,
                                 secrets=self._secrets)
            entry = Entry(report, md, {s.name: {"state": PENDING, "attempts": 0}
                                       for s in self.sinks},
                          plot=None if plot_name else "none: no sensor window"
                          if not report.has_plot else "none: plots are off"
                          if not self.plot else "none: shed (storage_low)"
                          if self.shed_plots else f"none: a repeat within {self.plot_repeat_s:g} s")
            self._make_room()
            self._persist(entry)  # durable before anything is delivered (where the disk allows)
            with self._lock:
                self._entries[entry.id] = entry
                self.built += 1
            _log.info("report_built", id=report.id, kind=report.kind.value, title=report.title)

    def _repeat(self, report: Report) -> bool:  # a drift report (one a period) is never one
        last = self._plotted.get(report.fault)
        if last is None or not 0.0 <= report.wall - last < self.plot_repeat_s:
            self._plotted[report.fault] = report.wall  # this one gets the plot
            return False
        return True

    def _make_room(self) -> None:
        while len(self._entries) >= self.max_entries:
            oldest = min(self._entries)
            with self._lock:
                self._entries.pop(oldest)
                self.dropped += 1
                dropped = self.dropped
            remove_durably([self.dir / f"{oldest}.json", self.dir / f"{oldest}.png"])
            with contextlib.suppress(OSError):
                write_atomic(self.dir / STATE_NAME, json.dumps({"dropped": dropped}).encode())
            _log.warning("report_dropped", id=oldest, dropped=dropped,
                         max_entries=self.max_entries)
            if self._on_event is not None:
                self._on_event({"type": EventType.REPORT_DROPPED, "id": oldest, "dropped": dropped})

    def _deliver_due(self) -> float:
        """One pass over the pending entries, oldest first; the seconds until the next try."""
        wait = 60.0
        for entry_id in sorted(self._entries):
            if self._stopping.is_set() or not self._incoming.empty():
                return 0.0  # a new report first: it is persisted before more delivery
            entry = self._entries.get(entry_id)
            if entry is None:
                continue
            if entry.plot is None and self.shed_plots:
                entry.plot = "none: shed (storage_low)"
                self._persist(entry)
            elif entry.plot is None:
                self._draw(entry)
            for sink in self.sinks:
                wait = min(wait, self._try_sink(entry, sink))
            if all(st["state"] == DONE for st in entry.sinks.values()):  # merged: wait for it
                with self._lock:
                    self._entries.pop(entry.id, None)
                remove_durably([self.dir / f"{entry.id}.json", self.dir / f"{entry.id}.png"])
        return wait

    def _draw(self, entry: Entry) -> None:
        path = self.dir / f"{entry.id}.json"
        why = render_plot(path, self.dir / f"{entry.id}.png", cache_dir=self.dir / ".matplotlib")
        entry.plot = "ok" if why is None else f"failed: {why}"
        if why is not None:
            _log.warning("report_plot_failed", id=entry.id, why=why)
        self._persist(entry)

    def _try_sink(self, entry: Entry, sink: Sink) -> float:
        st = entry.sinks.setdefault(sink.name, {"state": PENDING, "attempts": 0})
        if st["state"] != PENDING:
            return 60.0
        now = time.time()
        if float(st.get("next", 0.0)) > now:
            return float(st["next"]) - now
        rate_wait = sink.wait_s(time.monotonic())
        if rate_wait > 0:
            return rate_wait
        members = self._group(entry, sink, st)
        png = self.dir / f"{entry.id}.png"
        try:
            res = sink.deliver(entry, members, png if entry.plot == "ok" else None, st)
        except Exception as exc:  # a sink bug must not stop the others
            _log.exception("report_sink_error", sink=sink.name, id=entry.id)
            res = Result(False, f"{type(exc).__name__}")
        if res.ok:
            st.update(state=DONE, delivered=time.time())
            st.pop("next", None)
            for m in members:
                m.sinks[sink.name].update(state=DONE, delivered=time.time())
                self._persist(m)
            with self._lock:
                self.delivered[sink.name] = self.delivered.get(sink.name, 0) + 1 + len(members)
            self._persist(entry)
            return 0.0
        if res.waiting:
            return res.retry_after_s or self.retry_min_s
        if res.deferred:
            st["next"] = time.time() + (res.retry_after_s or self.retry_min_s)
            self._persist(entry)
            return res.retry_after_s or self.retry_min_s
        attempts = int(st.get("attempts", 0)) + 1
        delay = (res.retry_after_s if res.retry_after_s is not None else
                 min(self.retry_max_s, self.retry_min_s * 2 ** min(attempts - 1, 30))
                 * random.uniform(0.5, 1.0))
        error = redact(res.error, self._secrets)
        st.update(attempts=attempts, next=time.time() + delay, last_error=error)
        with self._lock:
            self.failures[sink.name] = self.failures.get(sink.name, 0) + 1
            self.last_error[sink.name] = error
        _log.warning("report_delivery_failed", sink=sink.name, id=entry.id, attempts=attempts,
                     error=error, retry_in_s=round(delay, 2))
        self._persist(entry)
        return delay

    def _group(self, entry: Entry, sink: Sink, st: dict[str, Any]) -> list[Entry]:
        """The repeats merged into this entry's message: chosen once, persisted before the
        first send, so a retry after a crash sends the same group under the same key."""
        if "group" in st:
            return [e for i in st["group"] if (e := self._entries.get(i)) is not None]
        pending = [e for i, e in sorted(self._entries.items()) if i != entry.id
                   and e.sinks.get(sink.name, {}).get("state") == PENDING]
        members = sink.group(entry, pending)
        st["group"] = [m.id for m in members]
        for m in members:
            m.sinks[sink.name].update(state=MERGED, into=entry.id)
            self._persist(m)
        self._persist(entry)
        return members

    def _persist(self, entry: Entry) -> None:
        """Rewrite the entry's file; on a full disk (or another write error) it stays in memory,
        delivered all the same, and the next step's write tries again."""
        try:
            write_atomic(self.dir / f"{entry.id}.json", entry.to_json().encode())
        except OSError as exc:
            with self._lock:
                self.unpersisted += 1
            _log.warning("report_persist_failed", id=entry.id, error=str(exc),
                         unpersisted=self.unpersisted)
