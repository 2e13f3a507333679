"""Start-up work after READY: the policy model, the decision journal, the calibration.

Heavy and non-essential (onnxruntime loads sessions), so it runs on the
supervisor's threads after READY (`--eager`: `load()` before it, for comparison). Each piece
lands in `results` (`status.background`) and most end with an event. The calibration waits for
the rest — one heavy thing at a time — and gives up once the daemon is stopping.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from edge_agent.daemon.heap import HeapKeeper
from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.daemon.policy_loader import PolicyLoader
from edge_agent.link.codec import Message
from edge_agent.log import get_logger
from edge_agent.robot import RobotDescription
from edge_agent.sensors.hub import SensorHub
from edge_agent.store.decisions import DecisionJournal
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.contract.events import Event
    from edge_agent.contract.status_parts import BackgroundStatus

_log = get_logger(__name__)


class StartupWork:
    """`load()` then `calibrate()`, each on a thread of its own; `results` for `status`."""

    def __init__(self, policy: PolicyLoader, decisions: DecisionJournal | None, hub: SensorHub,
                 robot: RobotDescription, heap: HeapKeeper, mirror: LinkMirror, *,
                 send: Callable[[Message], None], publish: Callable[[Event], None],
                 stopping: threading.Event, on_policy: Callable[[], None] = lambda: None
                 ) -> None:
        self.policy = policy
        self.decisions = decisions
        self.hub = hub
        self.robot = robot
        self.heap = heap
        self.mirror = mirror
        self._send = send
        self._publish = publish
        self._stopping = stopping
        self._on_policy = on_policy  # the policy stack exists now (its health probes)
        self.results: BackgroundStatus = {}
        self.loaded = threading.Event()  # load() is over (or the daemon is stopping)

    def load(self) -> None:
        """The model, the journal's tail; each completion is an event."""
        try:
            self._load()
        finally:
            self.loaded.set()

    def _load(self) -> None:
        # first: a task that arrives early waits for the model
        self.results["inference"] = self.policy.start()
        self._on_policy()
        if self._stopping.is_set():
            return
        if self.decisions is not None:
            try:
                report = self.decisions.open()  # scans (and repairs) the newest segment's tail
                self.results["journal"] = {"ok": report is not None}
            except Exception as exc:
                self.results["journal"] = {"ok": False, "error": str(exc)}
                _log.exception("journal_open_failed")
        # The hub built its Kalman estimators with itself (closed form, no filterpy): they
        # have predicted from the first frame; the event keeps its place in the start-up story.
        self.results["estimators"] = {"ok": True, "ms": 0.0, "since": "construction"}
        self._publish({"type": EventType.ESTIMATORS_READY, "ms": 0.0})
        # What loaded after READY (onnxruntime, the sessions: ~10^5
        # objects) joins the frozen start-up heap: a full collection would otherwise scan it
        # all, holding the GIL for tens of ms — the control loop ran 50 ms late behind one.
        self.heap.startup_done()  # again after the calibration, the last start-up work

    def calibrate(self) -> None:
        """The rest calibration (daemon/calibration_run.py), after `load()`."""
        from edge_agent.daemon.calibration_run import calibrate

        self.loaded.wait(60.0)
        if self._stopping.is_set():
            return
        calibrate(self.mirror, self._send, self.hub, self.robot, results=self.results,
                  publish=self._publish, should_stop=self._stopping.is_set)
        self.heap.startup_done()  # the last start-up work: its heap is frozen too
