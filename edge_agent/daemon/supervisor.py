"""The daemon's threads and moving parts: named, stopped in a declared order, each one's health.

Two kinds of member. A *thread* the supervisor runs itself (`spawn`): start-up work, the
calibration, the MQTT bridge's builder, the signal router — its exception is caught, logged and
kept as `last_error`. A *part* that owns its threads (`adopt`: the control loop, the link
guardian's reader, the store writer, the report outbox, the comms): the supervisor only knows how
to stop it and, when the part says, whether it is alive.

`stop()` stops every member in the order declared at construction (a member not declared there
is refused when added, so the order is written down in one place), never raises, and says what
each step took. Threads in native code (an onnxruntime session load, a numpy import) cannot be
interrupted: `stop()` joins them until its deadline and `lingering()` names those still running.
`health()` is what `status` and the health monitor read.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_agent.log import get_logger

if TYPE_CHECKING:
    from edge_agent.contract.status import ThreadStatus

_log = get_logger(__name__)
Spawn = Callable[[str, Callable[[], None]], None]  # `Supervisor.spawn`: a named, watched thread


@dataclass(frozen=True, slots=True)
class ThreadHealth:
    """One member, as `status.threads` shows it (times: `time.monotonic()` seconds)."""

    name: str
    kind: str  # "thread": run by the supervisor; "part": owns its thread(s)
    alive: bool | None  # None: the part does not say (started and not stopped)
    started_at: float | None
    stopped_at: float | None
    last_error: str | None

    def as_dict(self) -> ThreadStatus:
        return {"name": self.name, "kind": self.kind, "alive": self.alive,
                "started_at": self.started_at, "stopped_at": self.stopped_at,
                "last_error": self.last_error}


class _Member:
    def __init__(self, name: str, kind: str, stop: Callable[[], None] | None,
                 alive: Callable[[], bool] | None, thread: threading.Thread | None) -> None:
        self.name, self.kind = name, kind
        self.stop, self.alive, self.thread = stop, alive, thread
        self.started_at = time.monotonic()
        self.stopped_at: float | None = None
        self.last_error: str | None = None

    def health(self) -> ThreadHealth:
        if self.thread is not None:
            alive: bool | None = self.thread.is_alive()
        elif self.alive is not None:
            try:
                alive = bool(self.alive())
            except Exception as exc:  # a part that cannot say is not alive
                self.last_error = f"{type(exc).__name__}: {exc}"
                alive = False
        else:
            alive = None if self.stopped_at is None else False
        return ThreadHealth(self.name, self.kind, alive, self.started_at, self.stopped_at,
                            self.last_error)


class Supervisor:
    """`spawn`/`adopt` members as they start; `stop()` once (idempotent); `health()` any time."""

    def __init__(self, stop_order: Sequence[str]) -> None:
        self._order = tuple(stop_order)
        self._members: dict[str, _Member] = {}
        self._lock = threading.Lock()
        self.stopping = threading.Event()  # set first thing in stop(): long work gives up
        self._stopped = False

    def _add(self, member: _Member) -> None:
        if member.name not in self._order:
            raise ValueError(f"{member.name!r} is not in the declared stop order")
        with self._lock:
            if member.name in self._members:
                raise ValueError(f"{member.name!r} is already supervised")
            self._members[member.name] = member

    def spawn(self, name: str, target: Callable[[], None], *, join: bool = True) -> None:
        """Run `target` on a daemon thread named `name`. `join=False`: a thread that lives as
        long as the process (the signal router), never joined."""
        member = _Member(name, "thread", None, None, None)

        def run() -> None:
            try:
                target()
            except BaseException as exc:  # kept for health, never re-raised
                member.last_error = f"{type(exc).__name__}: {exc}"
                _log.exception("thread_failed", thread=name)

        member.thread = threading.Thread(target=run, name=name, daemon=True)
        if not join:
            member.stop = lambda: None
        self._add(member)
        member.thread.start()

    def adopt(self, name: str, stop: Callable[[], None],
              alive: Callable[[], bool] | None = None) -> None:
        """A part that started its own thread(s): stopped by `stop` in the declared order."""
        self._add(_Member(name, "part", stop, alive, None))

    def health(self) -> list[ThreadHealth]:
        """Every member, in stop order."""
        with self._lock:
            members = [self._members[n] for n in self._order if n in self._members]
        return [m.health() for m in members]

    def lingering(self) -> list[str]:
        """Threads run here that are still alive (after `stop()`: stuck in native code)."""
        with self._lock:
            members = list(self._members.values())
        return [m.name for m in members if m.thread is not None and m.stop is None
                and m.thread.is_alive()]

    def stop(self, join_s: float = 1.0) -> dict[str, float]:
        """Stop every member in the declared order; threads run here get until `join_s` after
        the first step, together. Returns each step's ms. Idempotent, never raises."""
        self.stopping.set()
        with self._lock:
            if self._stopped:
                return {}
            self._stopped = True
            members = [self._members[n] for n in self._order if n in self._members]
        t0 = last = time.monotonic()
        took: dict[str, float] = {}
        for m in members:
            try:
                if m.stop is not None:
                    m.stop()
                elif m.thread is not None and m.thread is not threading.current_thread():
                    m.thread.join(timeout=max(0.0, join_s - (time.monotonic() - t0)))
            except Exception as exc:  # one part that fails to stop must not keep the rest up
                m.last_error = f"{type(exc).__name__}: {exc}"
                _log.exception("stop_failed", part=m.name)
            now = time.monotonic()
            m.stopped_at = now
            took[m.name] = round((now - last) * 1e3, 1)
            last = now
        return took
