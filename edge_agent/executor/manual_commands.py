"""The operator's manual mode on the executor: `manual.enter`, `manual.jog`, `manual.exit` and the
jog tick (docs/asyncapi.yaml; DESIGN.md's admission matrix). A mixin of Executor (executor.py),
cut along the seam of the operator's commands; it uses the executor's parts declared below.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from edge_agent.executor.controllers import Measured
from edge_agent.executor.machine import Trigger
from edge_agent.executor.manual import JogFrame
from edge_agent.executor.records import CommandResult, Outcome
from edge_agent.executor.tasks import State
from edge_agent.link.codec import Command, GripperMode, Mode
from edge_agent.vocab import ErrorCode, EventType, StopCause
from edge_agent.vocab import Mode as ExecMode

if TYPE_CHECKING:
    from edge_agent.executor.context import EventLog, TickInputs
    from edge_agent.executor.driver import TaskDriver
    from edge_agent.executor.latch import StopLatch
    from edge_agent.executor.machine import TaskMachine
    from edge_agent.executor.manual import JogController
    from edge_agent.executor.records import Counters
    from edge_agent.executor.tasks import ExecutorConfig


class ManualCommands:
    """`manual.*` and the jog tick; Executor provides the parts."""

    if TYPE_CHECKING:
        cfg: ExecutorConfig
        latch: StopLatch
        counters: Counters
        _in: TickInputs
        _events: EventLog
        _driver: TaskDriver
        _machine: TaskMachine
        _jog: JogController

        @property
        def mode(self) -> ExecMode: ...

        def _pre(self, now: float) -> None: ...

        def _refuse_by_mode(self, command: str) -> CommandResult | None: ...

        def _sync_latch(self, now: float) -> None: ...

        def _mode_changed(self) -> None: ...

    def _manual_tick(self, now: float, m: Measured, dt: float) -> Command:
        if self._in.predicted:
            self._jog.stop()
            return self._driver.hold()
        sp, lost = self._jog.update(now, m.q, dt)
        if lost:
            self.counters.jog_lost += 1
            self._events.emit({"type": EventType.JOG_LOST})
            if self.cfg.jog_loss_trips:
                self.latch.trip(StopCause.JOG_LOST, now)
                self._sync_latch(now)
        if sp is None:
            return self._driver.hold()
        return Command(Mode.POSITION, sp, GripperMode.HOLD, 0.0, 0.0)

    def manual_enter(self, now: float) -> CommandResult:
        """Enter manual mode (idle, holding, diagnostic); a saved task is given up."""
        self._pre(now)
        refused = self._refuse_by_mode("manual.enter")
        if refused is not None or self.mode == ExecMode.MANUAL:
            return refused or CommandResult.accept("already in manual")
        if self._driver.task is not None:
            self._driver.end(now, Outcome.ABORTED, "manual mode entered", None)
        self._jog.stop()
        self._machine.fire(Trigger.MANUAL_ENTER)
        self._mode_changed()
        return CommandResult.accept(mode=self.mode)

    def manual_jog(self, now: float, velocity: Sequence[float], ttl_ms: int,
                   frame: str = "joint") -> CommandResult:
        """One jog message: velocity in `frame` (joint rad/s, cartesian m/s) for ttl_ms."""
        self._pre(now)
        refused = self._refuse_by_mode("manual.jog")
        if refused is not None:
            return refused
        if self.mode != ExecMode.MANUAL:
            return CommandResult.refuse(ErrorCode.NOT_ADMITTED, "manual.jog: manual.enter first")
        if self._in.predicted:
            return CommandResult.refuse(ErrorCode.REFUSED, "manual.jog: a joint is predicted")
        if ttl_ms > self.cfg.jog_ttl_max_ms:
            return CommandResult.refuse(ErrorCode.BAD_ARGS,
                                        f"ttl_ms must be <= {self.cfg.jog_ttl_max_ms}")
        try:
            jf = JogFrame(frame)
        except ValueError:
            return CommandResult.refuse(ErrorCode.BAD_ARGS, f"unknown jog frame {frame!r}")
        why = self._jog.command(now, jf, velocity, ttl_ms)
        if why is not None:
            return CommandResult.refuse(ErrorCode.BAD_ARGS, why)
        return CommandResult.accept()

    def manual_exit(self, now: float) -> CommandResult:
        self._pre(now)
        if self._machine.state is not State.MANUAL:
            return self._refuse_by_mode("manual.exit") or CommandResult.accept("not in manual")
        self._jog.stop()
        self._machine.fire(Trigger.MANUAL_EXIT)
        self._mode_changed()
        return CommandResult.accept(mode=self.mode)
