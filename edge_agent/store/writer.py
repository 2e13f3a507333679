"""The store thread: makes snapshots and journal records durable off the caller's thread.

`submit_snapshot()` and `submit_record()` never block on disk: they enqueue and return. A
snapshot supersedes any snapshot of the same store still waiting in the queue (coalesced: only
the newest is written, and every superseded submitter's `on_done` fires when it is durable), so
snapshots take at most one queue slot per store. Journal records are never merged; past
`max_records` waiting records a new one is dropped and counted. Consecutive records for one
journal are written with one fsync (group commit).

`flush(timeout)` waits until everything submitted before the call is durable — e.g. the reply
to an e-stop goes out once the latch is on disk. Failures go to `on_error(store_name, exc)`
(the daemon turns a failed snapshot into a protective stop) and to the job's `on_done(exc)`.
Callbacks run on the store thread and must not block.

Objects handed to `submit_snapshot()` belong to the writer from then on: do not mutate them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from edge_agent.errors import StoreError
from edge_agent.log import get_logger
from edge_agent.store.journal import Journal
from edge_agent.store.snapshot import SnapshotStore

log = get_logger(__name__)

OnDone = Callable[[BaseException | None], None]
OnError = Callable[[str, BaseException], None]
_GROUP_MAX = 256  # records per group commit


@dataclass(frozen=True, slots=True)
class WriterStats:
    """Counters of the store thread (a copy; read it with `StoreWriter.stats`)."""

    snapshots_written: int = 0
    snapshots_coalesced: int = 0
    records_written: int = 0
    records_dropped: int = 0
    rejected_after_stop: int = 0
    errors: int = 0


@dataclass(slots=True)
class _Job:
    first_ticket: int
    target: SnapshotStore | Journal
    obj: Mapping[str, Any] | None = None  # a snapshot
    payload: bytes | None = None  # a journal record
    on_done: list[OnDone] = field(default_factory=list)


class StoreWriter:
    """Owns the store thread. `start()`, submit…, `flush()`, `stop()` (idempotent, drains)."""

    def __init__(self, on_error: OnError | None = None, *, max_records: int = 1024,
                 thread_name: str = "store") -> None:
        self._on_error = on_error
        self._max_records = max_records
        self._thread_name = thread_name
        self._cond = threading.Condition()
        self._queue: deque[_Job] = deque()
        self._pending: dict[SnapshotStore, _Job] = {}
        self._records_waiting = 0
        self._ticket = 0
        self._inflight: int | None = None  # first ticket of the job(s) being written
        self._stats = WriterStats()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stopped = False

    @property
    def stats(self) -> WriterStats:
        with self._cond:
            return self._stats

    def _count(self, **inc: int) -> None:  # call with the lock held
        self._stats = replace(self._stats, **{k: getattr(self._stats, k) + v
                                              for k, v in inc.items()})

    def start(self) -> None:
        """Start the store thread (jobs submitted before are kept and written)."""
        with self._cond:
            if self._thread is not None or self._stopping:
                return
            self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ submit

    def submit_snapshot(self, store: SnapshotStore, obj: Mapping[str, Any],
                        on_done: OnDone | None = None) -> bool:
        """Queue a snapshot of `store`; never blocks. False if the writer is stopped."""
        with self._cond:
            if self._stopping:
                self._count(rejected_after_stop=1)
                return self._reject(on_done)
            self._ticket += 1
            job = self._pending.get(store)
            if job is None:
                job = self._pending[store] = _Job(self._ticket, store, obj=obj)
                self._queue.append(job)
            else:  # keeps its place in the queue, carries the newest state
                job.obj = obj
                self._count(snapshots_coalesced=1)
            if on_done is not None:
                job.on_done.append(on_done)
            self._cond.notify_all()
            return True

    def submit_record(self, journal: Journal, payload: bytes,
                      on_done: OnDone | None = None) -> bool:
        """Queue a journal record; never blocks. False if dropped (queue full) or stopped."""
        with self._cond:
            if self._stopping:
                self._count(rejected_after_stop=1)
                return self._reject(on_done)
            if self._records_waiting >= self._max_records:
                self._count(records_dropped=1)
                if self._stats.records_dropped in (1, 10, 100) or \
                        self._stats.records_dropped % 1000 == 0:
                    log.warning("store_queue_full", journal=journal.name,
                                dropped=self._stats.records_dropped)
                return self._reject(on_done, "record dropped: store queue full")
            self._ticket += 1
            self._records_waiting += 1
            cb = [on_done] if on_done is not None else []
            self._queue.append(_Job(self._ticket, journal, payload=payload, on_done=cb))
            self._cond.notify_all()
            return True

    @staticmethod
    def _reject(on_done: OnDone | None, why: str = "store writer stopped") -> bool:
        if on_done is not None:
            _call(on_done, StoreError(why))
        return False

    # ------------------------------------------------------------------ flush / stop

    def flush(self, timeout: float) -> bool:
        """Wait until all submitted before this call is durable (or failed); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cond:
            target = self._ticket
            while not self._done_through(target):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def _done_through(self, ticket: int) -> bool:
        if self._inflight is not None and self._inflight <= ticket:
            return False
        return not self._queue or self._queue[0].first_ticket > ticket

    def stop(self, timeout: float = 5.0) -> None:
        """Write what is queued, then end the thread. Idempotent; never raises."""
        try:
            with self._cond:
                if self._stopped:
                    return
                self._stopping = True
                self._cond.notify_all()
                thread = self._thread
            if thread is None:
                self._run()  # never started: drain on the caller's thread
            elif thread is not threading.current_thread():
                thread.join(timeout)
                if thread.is_alive():
                    log.error("store_writer_stop_timeout", timeout_s=timeout)
                    return
            with self._cond:
                self._stopped = True
        except Exception as exc:  # stop() must never raise
            log.error("store_writer_stop_failed", error=repr(exc))

    # ------------------------------------------------------------------ thread

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._stopping:
                    self._cond.wait()
                if not self._queue:
                    return
                batch = self._take()
                self._inflight = batch[0].first_ticket
            err = self._write(batch)
            for job in batch:
                for cb in job.on_done:
                    _call(cb, err)
            with self._cond:
                self._inflight = None
                self._cond.notify_all()

    def _take(self) -> list[_Job]:  # lock held
        job = self._queue.popleft()
        if isinstance(job.target, SnapshotStore):
            del self._pending[job.target]
            return [job]
        batch = [job]
        while (self._queue and len(batch) < _GROUP_MAX
               and self._queue[0].target is job.target):
            batch.append(self._queue.popleft())
        self._records_waiting -= len(batch)
        return batch

    def _write(self, batch: list[_Job]) -> BaseException | None:
        target = batch[0].target
        try:
            if isinstance(target, SnapshotStore):
                assert batch[0].obj is not None
                target.save(batch[0].obj)
                written = {"snapshots_written": 1}
            else:
                for job in batch:
                    assert job.payload is not None
                    target.append(job.payload, sync=False)
                target.sync()
                written = {"records_written": len(batch)}
        except Exception as exc:
            with self._cond:
                self._count(errors=1)
            log.error("store_write_failed", store=target.name, error=str(exc))
            if self._on_error is not None:
                _call_error(self._on_error, target.name, exc)
            return exc
        with self._cond:
            self._count(**written)
        return None


def _call(cb: OnDone, err: BaseException | None) -> None:
    try:
        cb(err)
    except Exception as exc:
        log.error("store_callback_failed", error=repr(exc))


def _call_error(cb: OnError, name: str, err: BaseException) -> None:
    try:
        cb(name, err)
    except Exception as exc:
        log.error("store_on_error_failed", error=repr(exc))
