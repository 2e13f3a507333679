"""Loads the daemon's policy: the rule-based expert decides until the model stack is built, loaded.

With `inference.model` or `inference.triton_url` set, `start()` (on the start-up thread, after
READY — or before it with `--eager`) builds the inference stack, hands its router to the
executor and loads the sessions; a task that arrives meanwhile waits for it (`wait`, bounded).
Without a model, or when building fails, the executor's own `ExpertPolicy` keeps deciding.
Inference events may come from the control thread: they are only enqueued here.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, MutableSequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from edge_agent.daemon.model_trial import ModelTrial
from edge_agent.daemon.shadow import ShadowControl
from edge_agent.log import get_logger
from edge_agent.observe import channels as obs
from edge_agent.observe.tap import TAP
from edge_agent.vocab import EventType

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.events import Event
    from edge_agent.contract.status_model import ModelStatus
    from edge_agent.contract.status_parts import InferenceStart, InferenceStatus
    from edge_agent.executor.executor import Executor
    from edge_agent.inference.assembly import InferenceStack
    from edge_agent.inference.backend import InferenceEvent
    from edge_agent.store.decisions import DecisionJournal

_log = get_logger(__name__)


class PolicyLoader:
    """Owns the inference stack (None until built) and says which backend decides."""

    def __init__(self, cfg: Config, executor: Executor, executor_lock: threading.RLock,
                 journal: DecisionJournal | None, events: MutableSequence[Event],
                 publish: Callable[[Event], None], *, sim_gpu: bool = False) -> None:
        self._cfg = cfg
        self._sim_gpu = sim_gpu  # --sim with sim.gpu: the simulated GPU (inference/sim_gpu.py)
        self._executor = executor
        self._lock = executor_lock
        self._journal = journal
        self._events = events  # drained and published by the daemon's main thread
        self._publish = publish
        self.configured = cfg.inference.model is not None or cfg.inference.triton_url is not None
        self.stack: InferenceStack | None = None
        self.router_journals = False  # the router's records replace the executor's own
        self.result: InferenceStart | None = None  # for status.background
        self._settled = threading.Event()  # start() is over (built, failed or nothing to do)
        self.trial = ModelTrial(cfg, publish)  # the trial after model.update (model_trial.py)
        # model.shadow: a candidate beside the policy, fed every decision (daemon/shadow.py)
        self.shadow = ShadowControl(cfg, lambda: self.stack, self.unavailable, journal, publish)

    def start(self) -> InferenceStart:
        """Blocking: build, hand over, load. Background (or --eager) only; never raises."""
        try:
            self.result = self._start()
        finally:
            self._settled.set()
        return self.result

    def _start(self) -> InferenceStart:
        if not self.configured:
            return {"ok": True, "policy": "rule (no model configured)"}
        from edge_agent.inference.assembly import build_stack  # onnxruntime stays lazy

        band = self._cfg.executor.grip_force_band_n
        t0 = time.monotonic()
        try:
            factory = None
            if self._sim_gpu:
                from edge_agent.inference.sim_gpu import SimGpu

                factory = SimGpu()
            stack = build_stack(self._cfg.inference, event_sink=self._on_event,
                                decision_sink=self._on_decision,
                                settings_hook=lambda s: replace(s, grip_force_band_n=band),
                                session_factory=factory)
            # an open trial whose process died rolls back first (before model.update may run)
            self.trial.at_start(stack)
            with self._lock:
                self._executor.policy = stack.router  # decisions from here on go through it
                self.router_journals = True
            self.stack = stack
            stack.load()
        except Exception as exc:  # the rule-based expert keeps deciding
            _log.exception("inference_start_failed")
            return {"ok": False, "error": str(exc)}
        ms = round((time.monotonic() - t0) * 1e3, 1)
        backend = stack.router.preferred_ready()
        self._publish({"type": EventType.POLICY_READY, "ms": ms, "model_ready": stack.model_ready(),
                       "backend": backend})
        return {"ok": stack.model_ready(), "ms": ms, "backend": backend}

    def in_use(self) -> str:
        """The backend that made the last decision (`rule` without a model), for `state`."""
        stack = self.stack
        if stack is None:
            return "rule"
        return stack.router.backend_in_use or stack.router.preferred_ready() or "none"

    def wait(self, timeout: float) -> bool:
        """A task that arrives before its model is loaded waits for it (bounded). True when a
        model backend is ready, or when none is configured (the rule decides)."""
        if not self.configured:
            return True
        deadline = time.monotonic() + timeout
        while self.stack is None:  # not built yet: wait for the start-up thread
            if self._settled.is_set() or not self._settled.wait(deadline - time.monotonic()):
                return False
        return self.stack.wait_ready(max(0.0, deadline - time.monotonic()),
                                     loaded=self._settled.is_set)

    def status(self) -> InferenceStatus | None:
        return self.stack.status() if self.stack is not None else None

    def unavailable(self) -> str | None:
        """Why no model can be installed now (None: it can)."""
        if self.stack is not None:
            return None
        if not self.configured:
            return "no model is configured (set inference.model or inference.triton_url)"
        return "the inference stack is still loading; retry after the policy_ready event"

    def model_status(self) -> ModelStatus:
        """`status.model`: current, previous, trial, bad (daemon/model_trial.py), shadow (its
        dicts are untyped; tests/test_model_trial_daemon.py checks them against the schema)."""
        return cast("ModelStatus", {**self.trial.status(), "shadow": self.shadow.status()})

    def update_model(self, uri: str, sha256: str, version: str | None,
                     allow_bad: bool = False) -> dict[str, Any]:
        """`model.update`: verify (sha256, signature, meaning, a smoke run), install atomically
        in the cache (the previous model stays as the `cached` fallback), reload the sessions.
        Blocking (~0.1–1 s): the command worker runs it; admission refuses it mid-task.
        Call it when `unavailable()` is None. Raises ModelError (the reason), ValueError
        (the uri) or UpdateRefused (a trial runs; the model is marked bad, without allow_bad).
        The new model is then on trial (daemon/model_trial.py)."""
        stack = self.stack
        if stack is None:
            raise RuntimeError(f"update_model() without a stack: {self.unavailable()}")
        self.trial.check_update(sha256, allow_bad)
        t0 = time.monotonic()
        self.trial.begin(stack, sha256, allow_bad)  # saved before the candidate decides
        try:
            card = stack.update_model(uri, sha256, version).card
        except BaseException:
            self.trial.abandon()
            raise
        self.trial.installed(card)
        ms = round((time.monotonic() - t0) * 1e3, 1)
        return {"installed": {"name": card.name, "version": card.version,
                              "sha256": card.sha256},
                "ms": ms, "model_ready": stack.model_ready(), "policy": self.in_use()}

    def stop(self) -> None:
        self.trial.stop()
        self.shadow.stop()
        if self.stack is not None:
            self.stack.stop()

    def _on_event(self, ev: InferenceEvent) -> None:
        self.trial.taps.on_inference_event(ev)
        self._events.append(ev.as_dict())  # may run on the control thread: only enqueue

    def _on_decision(self, rec: Any) -> None:
        self.trial.taps.on_decision(rec)  # the control thread: counters only
        TAP.publish(obs.DECISIONS, (rec, False))  # a NamedTuple: encoded by the consumer
        if self._journal is not None:
            self._journal.record(rec.as_dict())
        self.shadow.offer(rec)  # the same observation to a shadow candidate, if one runs
