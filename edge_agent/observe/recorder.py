"""The flight recorder: the tap's last seconds in memory; report triggers and on-demand captures
written to indexed MCAP files (lz4 chunks) in `<state_dir>/recordings/`.

One thread (`flight-recorder`) does all of it: it drains its tap subscription every
`period_s` into a ring bounded in seconds (`pre_s`) and bytes (`ring_bytes`, estimated from each
topic's encoded size). Nothing is encoded while no capture is open: JSON (channels.encode) is
made only for a file, at most WRITE_BATCH messages a period, so the recorder takes the GIL
from the control thread in short slices. `trigger(...)` (any thread: the report outbox) and
`start_capture`/`stop_capture` (the command API) only enqueue a request and return the path the
file will have. The thread opens the file, writes the ring's messages from `pre_s` before the
trigger, then every new message until `post_s` after it (or the stop, bounded by `max_capture_s`),
and finishes it (summary, indexes); at a stop, after at most FINAL_S of encoding the backlog,
every open file is finished with what it has. Files written so far are capped (`max_files`,
`max_bytes`): the oldest finished ones go. An open file is flushed every period: a process
killed mid-file leaves complete chunks that `mcap.stream_reader.StreamReader` reads up to the
tear.

Link frames (`/link/status` at 1 kHz, `/link/rx`, `/link/tx` at the loop's rate) wait in the
ring as their wire body, a quarter second of one topic in one lz4 block (observe/ring.py; at
most about 65 bytes of heap a STATUS frame, its time included, instead of about 1,200 as
objects). Received frames were decoded from that f32 wire format and sent ones are encoded to
it on their way to the guardian, so the bytes are what the wire carried; a capture parses them
back before encoding.

`mcap` is imported when the recorder starts (after READY), never before.
"""

from __future__ import annotations

import itertools
import queue
import re
import threading
import time
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.log import get_logger
from edge_agent.observe import channels as ch
from edge_agent.observe.capture import ENCODED, PACKED, Capture, encoded, pack, rotate, unpack
from edge_agent.observe.capture import (
    RecorderSettings as RecorderSettings,
)
from edge_agent.observe.ring import Frames, Ring
from edge_agent.observe.tap import TAP, Item, Tap

if TYPE_CHECKING:
    from edge_agent.contract.status_observe import RecorderStatus

_log = get_logger(__name__)
_NS = 1_000_000_000
MAX_OPEN = 4  # report captures open at once; a further report joins the newest (`merged`)
# the ring holds this much more than pre_s: a report is built (and asks for its file) on the
# outbox thread, a little after its time; its pre_s window must still be whole by then
RING_MARGIN_S = 5.0
WRITE_BATCH = 500  # messages encoded per capture per period (10,000/s at 50 ms: > 1 kHz)
# At stop, encoding the open captures' backlog ends after this; then every open file is finished
# (footer, indexes) with what it has, inside stop()'s join: a starved recorder (a loaded CPU) at
# a daemon stop leaves shorter files, never torn ones.
FINAL_S = 3.0
# A capture's items not yet written, at most: ~1 minute of every channel of a 1 kHz robot. A
# recorder starved of CPU (seen at load average 50+) fell behind and its backlog held 100-160 MB
# that the process kept after it caught up; past this, the oldest unwritten items go (a gap in
# that file, counted in `backlog_dropped` and logged once per file).
MAX_PENDING = 100_000
# The recorder's tap queue (raw items, not drained yet) holds at most the ring's span at this
# rate: 1 kHz STATUS, /loop and /link/tx at up to 500 Hz each, 100 Hz sensors, events. It held
# 200,000 items: a recorder starved of CPU for ~40 s (a CPU hog beside the daemon, 12-07) let
# ~64 MB of raw items queue (a STATUS frame is ~920 bytes as an object) and the process kept
# that RSS after it caught up (pymalloc arenas left partly used). Older items than the ring's
# span could only fill a capture's start: past it they go, counted in `dropped`.
TAP_RATE_HZ = 2_500
_EST_DEFAULT = 400  # bytes a message of a topic not encoded yet is taken to cost in the ring
_SAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def tap_maxlen(pre_s: float) -> int:
    """The recorder's tap queue bound: the ring's span (pre_s + RING_MARGIN_S) at TAP_RATE_HZ."""
    return max(1_000, int(TAP_RATE_HZ * (pre_s + RING_MARGIN_S)))


class Recorder:
    """See the module doc. `start()` after READY; `stop()` finishes open files."""

    def __init__(self, directory: Path, settings: RecorderSettings, *, tap: Tap = TAP) -> None:
        self.dir = directory
        self.s = settings
        self._tap = tap
        self._sub: Any = None
        self._ring = Ring(PACKED | ENCODED)
        self._est: dict[str, int] = {}  # topic -> encoded bytes per message (running mean)
        self._requests: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._open: list[Capture] = []
        # The captures' backlogs: long-lived deques, reused. A new deque holding a trigger's
        # pre_s backlog (tens of thousands of ring items) made every young-generation garbage
        # collection traverse all of them until it was promoted — 5-40 ms of GIL, in whichever
        # thread collected (hil.gc_pauses); an old container is not traversed by them.
        self._backlogs: list[deque[Item]] = [deque() for _ in range(MAX_OPEN + 1)]
        self._on_demand: Capture | None = None
        self._demand_path: Path | None = None  # the caller's side of _on_demand
        self._triggered: dict[Path, int] = {}  # report captures not finished: path -> end (ns)
        self.merged = 0  # triggers that joined an open file (MAX_OPEN open already)
        self._names = itertools.count(1)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # status() against the thread
        self.written = 0  # files finished
        self.refused = 0  # on-demand starts refused (the recorder thread saw one running)
        self.rotated = 0  # files removed by the caps
        self.encode_errors = 0
        self.backlog_dropped = 0  # unwritten items a starved capture shed (MAX_PENDING)
        self.cpu_s = 0.0  # the recorder thread's CPU time
        self.last_path: str | None = None

    # -- any thread ---------------------------------------------------------------------------
    def start(self) -> None:
        import mcap.writer  # noqa: F401  - after READY: fail here, not on the first trigger

        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._sub = self._tap.subscribe("recorder", maxlen=tap_maxlen(self.s.pre_s))
        self._thread = threading.Thread(target=self._run, name="flight-recorder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout)
        if self._sub is not None:
            self._tap.unsubscribe(self._sub)
            self._sub = None

    def trigger(self, reason: str, t_wall: float | None = None, *, report_id: str | None = None,
                kind: str | None = None) -> Path:
        """A capture from `pre_s` before `t_wall` (now if None) to `post_s` after it; the
        path the finished file will have."""
        t_ns = int((time.time() if t_wall is None else t_wall) * _NS)
        end = t_ns + int(self.s.post_s * _NS)
        mark = {"reason": reason, "report_id": report_id, "kind": kind, "trigger": ch.stamp(t_ns)}
        with self._lock:
            if len(self._triggered) >= MAX_OPEN:  # a storm: the newest open file grows
                path = max(self._triggered, key=self._triggered.__getitem__)
                self._triggered[path] = max(self._triggered[path], end)
                self.merged += 1
                self._requests.put(("mark", (path, t_ns, mark)))
                return path
            path = self._path(reason, t_ns)
            self._triggered[path] = end
        self._requests.put(("open", Capture(
            path, t_ns - int(self.s.pre_s * _NS), end, t_ns + int(self.s.max_capture_s * _NS),
            mark, t_ns)))
        return path

    def start_capture(self, name: str = "manual") -> Path | None:
        """An on-demand capture from `pre_s` ago until `stop_capture` (or max_capture_s);
        None while one is already recording (its path: `recording()`)."""
        t_ns = time.time_ns()
        with self._lock:
            if self._demand_path is not None:
                return None
            path = self._demand_path = self._path(name, t_ns)
        mark = {"reason": "record.start", "report_id": None, "kind": name,
                "trigger": ch.stamp(t_ns)}
        self._requests.put(("start", Capture(
            path, t_ns - int(self.s.pre_s * _NS), None,
            t_ns + int(self.s.max_capture_s * _NS), mark, t_ns)))
        return path

    def stop_capture(self) -> Path | None:
        """The on-demand capture ends now (finished within a period); its path, None if none."""
        with self._lock:
            path, self._demand_path = self._demand_path, None
        if path is not None:
            self._requests.put(("stop", time.time_ns()))
        return path

    def recording(self) -> Path | None:
        """The on-demand capture's path while one runs."""
        return self._demand_path

    def status(self) -> RecorderStatus:
        sub = self._sub
        with self._lock:
            return {"dir": str(self.dir), "open": [str(c.path) for c in self._open],
                    "recording": str(self._demand_path) if self._demand_path else None,
                    "written": self.written,
                    "refused": self.refused, "merged": self.merged,
                    "rotated": self.rotated,
                    "ring_messages": self._ring.messages, "ring_bytes": self._ring.bytes,
                    "dropped": sub.dropped if sub is not None else 0,
                    "encode_errors": self.encode_errors, "cpu_s": round(self.cpu_s, 3),
                    "backlog_dropped": self.backlog_dropped,
                    "last_path": self.last_path}

    def _path(self, reason: str, t_ns: int) -> Path:
        when = time.strftime("%Y%m%dT%H%M%S", time.gmtime(t_ns / _NS))
        return self.dir / f"{when}Z-{_SAFE.sub('_', reason)[:40]}-{next(self._names):04d}.mcap"

    # -- the recorder thread ---------------------------------------------------------------
    def _run(self) -> None:
        t0 = time.thread_time()
        while True:
            stopping = self._stop.wait(self.s.period_s)
            try:
                self._cycle(final=stopping)
            except Exception:  # one bad cycle must not end the recorder
                _log.exception("recorder_cycle_failed")
            self.cpu_s = time.thread_time() - t0
            if stopping:
                break

    def _cycle(self, *, final: bool = False) -> None:
        fresh = self._take()
        # a capture begun by this cycle's requests takes the ring, `fresh` included: only the
        # ones open before get `fresh` below (each recording had one cycle's messages twice)
        had = {id(c) for c in self._open}
        while True:
            try:
                what, arg = self._requests.get_nowait()
            except queue.Empty:
                break
            self._request(what, arg)
        now = time.time_ns()
        final_by = time.monotonic() + FINAL_S
        for c in list(self._open):
            if id(c) in had:
                c.pending.extend(x for x in fresh if x[1] >= c.start_ns)
            if len(c.pending) > MAX_PENDING:
                self._shed(c)
            end = self._end_of(c)
            done = final or now >= end
            # encoding is the recorder's only real work: at most WRITE_BATCH messages a cycle
            # (a trigger's pre_s backlog goes out over a few cycles, not in one GIL-long burst)
            if final:
                self._drain_until(c, end, final_by)
            else:
                self._drain(c, end, None if done else WRITE_BATCH)
            if done and (final or not c.pending or c.pending[0][1] > end):
                with self._lock:
                    if not final and self._triggered.get(c.path, end) > end:
                        continue  # a later report joined it meanwhile
                    self._triggered.pop(c.path, None)
                self._finish(c)
            elif c.file is not None:
                c.file.flush()

    def _end_of(self, c: Capture) -> int:
        if c.end_ns is None:  # on demand, not stopped yet
            return c.limit_ns
        with self._lock:
            return min(self._triggered.get(c.path, c.end_ns), c.limit_ns)

    def _take(self) -> list[Item]:
        """The tap's new items into the ring, unencoded (encoding waits for a capture that
        needs them): a steady state with no capture open is an append and a trim per item.
        Bytes are estimated from each topic's encoded size so far."""
        sub = self._sub
        if sub is None:
            return []
        fresh: list[Item] = sub.drain(1 << 20)
        ring, est, s = self._ring, self._est, self.s
        for i, item in enumerate(fresh):
            if item[0] in PACKED:
                item = fresh[i] = pack(item)
            elif item[0] in ENCODED:
                item = fresh[i] = encoded(item)
            ring.add(item, est.get(item[0], _EST_DEFAULT))
        if fresh:
            ring.trim(fresh[-1][1] - int((s.pre_s + RING_MARGIN_S) * _NS), s.ring_bytes)
        return fresh

    def _shed(self, c: Capture) -> None:
        """Over MAX_PENDING: the oldest unwritten items go (the writer is behind)."""
        over = len(c.pending) - MAX_PENDING
        popleft = c.pending.popleft
        for _ in range(over):
            popleft()
        with self._lock:
            self.backlog_dropped += over
        if not c.shed:
            c.shed = True
            _log.warning("recording_backlog_dropped", path=str(c.path), dropped=over,
                         max_pending=MAX_PENDING, hint="the recorder is starved of CPU")

    def _drain_until(self, c: Capture, end: int, by: float) -> None:
        """At stop: the backlog in batches until monotonic `by`; what is left is not written."""
        while c.pending and c.pending[0][1] <= end and time.monotonic() < by:
            self._drain(c, end, WRITE_BATCH)
        left = sum(1 for x in c.pending if x[1] <= end)
        if left:
            _log.warning("recording_cut_at_stop", path=str(c.path), messages_left=left,
                         written=c.messages, budget_s=FINAL_S)

    def _drain(self, c: Capture, end: int, budget: int | None) -> None:
        pending = c.pending
        n = 0
        while pending and (budget is None or n < budget):
            if pending[0][1] > end:
                break  # after the capture's end (for now: a later report may extend it)
            topic, t, payload = pending.popleft()
            if type(payload) is Frames:  # a block of the ring's: its frames go first
                pending.extendleft(reversed(payload.items()))
                continue
            try:
                data = (payload if topic in ENCODED and type(payload) is bytes
                        else ch.encode(topic, unpack(topic, payload), t))
            except Exception:
                self.encode_errors += 1
                continue
            self._est[topic] = (self._est.get(topic, len(data)) * 15 + len(data)) // 16
            self._write(c, t, topic, data)
            n += 1

    def _request(self, what: str, arg: Any) -> None:
        if what == "stop":
            c = self._on_demand
            if c is not None:
                c.end_ns = arg
                self._on_demand = None
            return
        if what == "mark":  # a further report in a file already open: its mark
            path, t_ns, mark = arg
            for c in self._open:
                if c.path == path:
                    c.pending.appendleft((ch.RECORDER, t_ns, mark))
            return
        cap: Capture = arg
        if what == "start" and self._on_demand is not None:
            with self._lock:
                self.refused += 1
                if what == "start" and self._demand_path == cap.path:
                    self._demand_path = None
            _log.warning("recording_refused", path=str(cap.path), open=len(self._open))
            return
        self._begin(cap)
        if what == "start":
            self._on_demand = cap

    def _begin(self, c: Capture) -> None:
        from mcap.writer import CompressionType, Writer

        c.file = open(c.path, "wb")  # noqa: SIM115 - closed in _finish
        w = Writer(c.file, chunk_size=self.s.chunk_bytes, compression=CompressionType.LZ4)
        w.start(profile="", library="edge-agent")
        schemas: dict[str, int] = {}
        for topic, chan in ch.CHANNELS.items():
            sid = schemas.get(chan.schema_name)
            if sid is None:
                sid = schemas[chan.schema_name] = w.register_schema(
                    chan.schema_name, chan.schema_encoding, chan.schema_bytes())
            c.ids[topic] = w.register_channel(topic, chan.message_encoding, sid)
        c.writer = w
        w.add_metadata("edge_agent.capture", {k: str(v) for k, v in c.mark.items()})
        with self._lock:
            self._open.append(c)
        self._write(c, c.trigger_ns, ch.RECORDER, ch.encode(ch.RECORDER, c.mark, c.trigger_ns))
        backlog = self._backlogs.pop() if self._backlogs else deque()
        backlog.extend(c.pending)  # nothing yet, as a rule
        backlog.extend(self._ring.backlog(c.start_ns))
        c.pending = backlog
        _log.info("recording_started", path=str(c.path), reason=c.mark["reason"])

    def _write(self, c: Capture, t: int, topic: str, data: bytes) -> None:
        c.writer.add_message(c.ids[topic], log_time=t, data=data, publish_time=t,
                             sequence=c.messages)
        c.messages += 1

    def _finish(self, c: Capture) -> None:
        try:
            c.writer.finish()
        finally:
            if c.file is not None:
                c.file.close()
            with self._lock:
                self._open.remove(c)
                self.written += 1
                self.last_path = str(c.path)
            c.pending.clear()
            if len(self._backlogs) <= MAX_OPEN:
                self._backlogs.append(c.pending)
            if self._on_demand is c:
                self._on_demand = None
                if self._demand_path == c.path:  # ended by max_capture_s, not by a stop
                    self._demand_path = None
        _log.info("recording_written", path=str(c.path), messages=c.messages)
        self._rotate()

    def _rotate(self) -> None:
        removed = rotate(self.dir, {c.path for c in self._open}, self.s.max_files,
                         self.s.max_bytes)
        if removed:
            with self._lock:
                self.rotated += removed
