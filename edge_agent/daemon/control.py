"""The control path: each tick (sensors → executor → a COMMAND frame), every frame to the guardian.

`tick(now, index)` is what the control thread (executor/loop.py's RateLoop) runs every period and
what the lock-step host (hil/daemon_lockstep.py) calls on virtual time. The executor is touched
under `executor_lock` only: ticks and commands one at a time (~0.1 ms a tick); re-entrant,
because a latch change inside a command or a tick calls back into the snapshot on the same
thread. (The command API's own lock is another thing: it makes one command's admission and
handler atomic against other commands, and may be held for a model update; this one is held
for one executor call at a time, so a tick never waits long behind a command.)
"""

from __future__ import annotations

import contextlib
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edge_agent.clock import Clock
from edge_agent.daemon.deadman import GuardianWatch
from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.daemon.output import CommandOutput
from edge_agent.errors import LinkError
from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import StopLatch
from edge_agent.executor.loop import RateLoop
from edge_agent.executor.records import CommandResult, ExecutorSnapshot
from edge_agent.executor.tasks import ExecutorConfig
from edge_agent.link.codec import (
    Command,
    Enable,
    Message,
    Mode,
    Status,
    Stop,
    StopCategory,
    StopReason,
)
from edge_agent.link.guardian_client import GuardianClient
from edge_agent.log import bind_task
from edge_agent.observe import channels as obs
from edge_agent.observe.tap import TAP
from edge_agent.sensors.hub import SensorHub
from edge_agent.vocab import ESTOP_CAUSES, EventType, StopCause

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.contract.events import Event
    from edge_agent.contract.payloads import TelemetryFields
    from edge_agent.contract.status import LoopStatus
    from edge_agent.store.episodes import EpisodeMark

# executor events after which the snapshot is saved at once (task and mode changes)
SENSOR_HZ = 100.0  # the /sensors channel's rate (the tick's sensor picture, decimated)
PERSISTED_EVENTS = frozenset({"task_done", "attempt_failed", "diagnostic", "task_started",
                              "task_frozen", "task_resumed", "mode_changed"})
_STOP_REASON = {
    StopCause.ESTOP_INPUT: StopReason.ESTOP_INPUT, StopCause.LINK_FAULT: StopReason.LINK_FAULT,
    StopCause.GUARDIAN_LOST: StopReason.LINK_FAULT, StopCause.DEADMAN: StopReason.DEADMAN,
    StopCause.COLLISION: StopReason.COLLISION,
}


@dataclass(frozen=True, slots=True)
class ControlSettings:
    """The control path's numbers: `[control]`, the deadman time and the robot's home pose."""

    rate_hz: float
    spin_s: float
    priority: int
    output_at_deadline: bool
    deadman_s: float
    home: tuple[float, ...]

    @classmethod
    def from_config(cls, cfg: Config) -> ControlSettings:
        c = cfg.control
        return cls(c.rate_hz, 0.0 if c.no_spin else c.spin_s, c.priority,
                   c.output_at_deadline, cfg.link.deadman_ms / 1000.0, tuple(cfg.robot.home))


def executor_config(cfg: Config) -> ExecutorConfig:
    """The executor's numbers from the config file (the rest keep their defaults)."""
    e = cfg.executor
    return ExecutorConfig(
        tool_tolerance_m=e.tool_tolerance_m, grip_force_n=e.grip_force_n,
        grip_force_band_n=e.grip_force_band_n, max_attempts=e.max_attempts,
        l3_threshold=e.l3_threshold, collision_current_factor=e.collision_current_factor,
        decision_hz=cfg.control.decision_hz, diagnostic_window_s=e.diagnostic_capture_s,
        manual_speed_fraction=e.jog_speed_scale,
        regrasp_window_s=e.regrasp_window_s, max_regrasps=e.max_regrasps,
        l1_timeouts_s={k: float(getattr(e.l1_timeouts_s, k)) for k in (
            "approach", "grasp", "lift", "transfer", "release", "retreat")})


class ControlPath:
    """The executor, its lock and the frames out; `guardian` is set at start-up."""

    def __init__(self, settings: ControlSettings, executor: Executor, latch: StopLatch,
                 hub: SensorHub, mirror: LinkMirror, clock: Clock) -> None:
        self.settings = settings
        self.executor = executor
        self.latch = latch
        self.hub = hub
        self.clock = clock
        self.watch = GuardianWatch(mirror, latch, settings.deadman_s, self.guardian_ready)
        self.executor_lock = threading.RLock()
        self.guardian: GuardianClient | None = None
        self.loop: RateLoop | None = None
        self.output = CommandOutput(self.send, settings.output_at_deadline)
        self.period = 1.0 / settings.rate_hz
        self._hold = Command(Mode.HOLD, settings.home)  # q ignored in HOLD
        self.send_errors = 0
        # executor events, published by the main thread's housekeeping (not the control thread)
        self.events: deque[Event] = deque(maxlen=10_000)
        # the running task, for the decision journal (daemon/episodes.py): kept here, on the
        # thread that drains the executor's events, so the first decision already carries it
        self.episode: EpisodeMark | None = None
        self._ticked = threading.Condition()  # a tick ran: what `wait_until` waits on
        # the sensor picture to the observe tap (flight recorder, live view) at ~SENSOR_HZ
        self._sensor_every = max(1, round(settings.rate_hz / SENSOR_HZ))

    def tick(self, now: float, index: int) -> None:
        """One control period: sensors → executor → one COMMAND frame (daemon/output.py)."""
        if self.guardian is None:
            return
        self.watch.check(now)  # a stall latches before the first setpoint computed after it
        snap = self.hub.snapshot(now)
        if TAP.active and index % self._sensor_every == 0:  # one deque append (observe/tap.py)
            TAP.publish(obs.SENSORS, (snap, self.hub.median_on))
        with self.executor_lock:
            latch_state = self.latch.state
            cmd = self.executor.tick(now, snap)
            events = self.executor.drain_events()
            if events:
                self._take(events)
        self.watch.commanded(cmd.moves, now)
        with self._ticked:
            self._ticked.notify_all()
        # the next deadline: on the loop's schedule (lock-step time has no lateness)
        deadline = self.loop.deadline if self.loop is not None else now
        self.output.emit(cmd, latch_state, deadline + self.period)

    def start_loop(self) -> RateLoop:
        """The control thread, ticking from now on (its `stop()` is the caller's)."""
        s = self.settings
        self.loop = RateLoop(self.tick, s.rate_hz, spin_s=s.spin_s, priority=s.priority,
                             tap_topic=obs.LOOP)
        self.loop.start()
        return self.loop

    def wait_until(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait (bounded) until `ready()` holds after a tick; True if it does."""
        with self._ticked:
            return self._ticked.wait_for(ready, timeout)

    def run(self, fn: Callable[[float], CommandResult], *, enable: bool = False
            ) -> CommandResult:
        """A command on the executor, between ticks; `enable`: an ENABLE frame goes out before
        the next tick's first setpoint when it succeeds."""
        with self.executor_lock:
            res = fn(self.clock.now())
            if res.ok and enable:
                self.enable_drives()
            events = self.executor.drain_events()  # a task started: the mark before the tick
            if events:
                self._take(events)
        return res

    def _take(self, events: list[Event]) -> None:
        """Executor events (lock held): the episode mark follows them; the main thread
        publishes them."""
        mark = self.episode
        if mark is not None:
            for ev in events:
                mark.follow(ev)
        if TAP.active:  # copies: the main thread adds ts/mono to the dicts when it publishes
            for ev in events:
                TAP.publish(obs.EXECUTOR, dict(ev))
        self.events.extend(events)

    def guardian_ready(self) -> bool:
        """A guardian being (re)started is GUARDIAN_LOST's business, not the deadman's."""
        g = self.guardian
        return g is not None and g.ready

    def send(self, msg: Message) -> None:
        """A frame to the guardian; a failed send is counted (the guardian's loss is handled
        by its client and the latch, not here)."""
        if self.guardian is None:
            return
        TAP.publish(obs.LINK_TX, msg)  # frames are immutable; encoded on the consumer's thread
        try:
            self.guardian.send(msg)
        except LinkError:
            self.send_errors += 1

    def send_or_raise(self, msg: Message) -> None:
        """A frame to the guardian; LinkError when there is none or it cannot take it."""
        g = self.guardian
        if g is None:
            raise LinkError("no link guardian")
        g.send(msg)

    def enable_drives(self) -> None:
        """Before new motion: the guardian passes no motion after a reset until an ENABLE."""
        self.send(Enable(True))

    def send_stop(self, cause: StopCause) -> None:
        cat = StopCategory.CAT0 if cause in ESTOP_CAUSES else StopCategory.CAT2
        reason = _STOP_REASON.get(cause, StopReason.ESTOP_REMOTE if cause in ESTOP_CAUSES
                                  else StopReason.PROTECTIVE)
        self.send(Stop(cat, reason))

    def latch_new_guardian(self) -> None:
        """A latch restored from the snapshot (unclean restart, saved e-stop) was tripped before
        the guardian existed: latch the new guardian too, so the wire holds whatever the
        daemon's own command stream does — as an e-stop if one was saved."""
        saved_causes = self.latch.state.causes
        if saved_causes:
            self.send_stop(next((c for c in saved_causes if c in ESTOP_CAUSES), saved_causes[0]))

    def stop_guardian(self) -> None:
        """HOLD, then the guardian process goes (it holds the robot on its own rules)."""
        g = self.guardian
        if g is not None:
            with contextlib.suppress(LinkError):
                g.send(self._hold)
            g.stop()

    def publish_events(self, publish: Callable[[Event], None]) -> bool | None:
        """The executor's events since the last call, in order (the main thread's work, never
        the control thread's). None: there were none; True: one of them is persisted at once."""
        if not self.events:
            return None
        persist_now = False
        while self.events:
            ev = self.events.popleft()
            persist_now = persist_now or ev.get("type") in PERSISTED_EVENTS
            if ev["type"] == EventType.TASK_STARTED or ev["type"] == EventType.TASK_RESUMED:
                bind_task(ev["task_id"])  # this thread's records carry the task from now
            publish(ev)
            if ev["type"] == EventType.TASK_DONE:
                bind_task(None)
        return persist_now

    def loop_status(self) -> LoopStatus | None:
        """`status.loop`: the loop's figures and how it and the link reader are scheduled."""
        loop, g = self.loop, self.guardian
        if loop is None:
            return None
        out: LoopStatus = {**loop.stats.as_dict(), "rate_hz": round(1.0 / loop.period, 3),
                           "scheduling": loop.scheduling,
                           "reader_scheduling": g.reader_scheduling if g else None,
                           "output_at_deadline": self.output.at_deadline,
                           "sent_at_once": self.output.sent_at_once}
        return out

    def telemetry(self, last_status: Status | None, link_frames: int) -> TelemetryFields:
        """The telemetry message: the loop's figures and the last STATUS from the robot."""
        out: TelemetryFields = {"loop": self.loop.stats.as_dict() if self.loop else None,
                                "link_frames": link_frames, "send_errors": self.send_errors}
        if last_status is not None:
            st = last_status
            out["q"] = [round(v, 5) for v in st.q]
            out["gripper_pos"] = round(st.gripper_pos, 5)
            out["gripper_force"] = round(st.gripper_force, 3)
            out["fw_time_us"] = st.fw_time_us
        return out

    def snapshot(self) -> ExecutorSnapshot:
        with self.executor_lock:
            return self.executor.to_snapshot()
