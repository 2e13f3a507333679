"""The link guardian's safety rules, sans-IO: (frame, now) in, frames for tty and daemon out.

The guardian process (guardian.py) and the lock-step runner feed every frame and every timer tick
through `GuardianRules`; it never reads a clock or touches a file. The rules (docs/PROTOCOL.md §5):

- E-stop press edge (ESTOP_EDGE pressed, or a STATUS showing the input active when it was not
  known active or the guardian is not latched): `STOP(CAT0, ESTOP_INPUT)` to the tty first, then
  latch. Every press edge yields a stop frame, latched or not. After a link fault the input
  counts as unknown, so the first frame showing it pressed is an edge again.
- A STOP from the daemon (remote e-stop, protective stop) is forwarded at once and latches with
  its reason. A link fault latches with LINK_FAULT. E-stop causes outrank protective ones.
- While latched no COMMAND that moves and no ENABLE(1) reaches the tty; STOP, ENABLE(0), PING,
  HELLO and COMMAND(HOLD) pass. G_RESET clears the latch only when the input is released and the
  link is up (so the input state is known); otherwise it is refused with a one-off
  `G_STATE(cause=RESET_REFUSED)`. After a clear, motion stays blocked until an ENABLE(1) passes.
- Deadman (§4): once the daemon has sent a COMMAND, silence for `deadman_s` puts a
  COMMAND(HOLD) stream (every `hold_period_s`) on the tty and `deadman_hold` in G_STATE until the
  daemon's next COMMAND. It is a latched protective stop (DEADMAN: the daemon may wake up with
  stale setpoints; only G_RESET + ENABLE(1) end it) when the stream was moving as it went silent
  or resumes with motion; a silence inside a HOLD stream (idle, start-up work) only holds. A
  STATUS newly showing the firmware's DEADMAN_TRIPPED, or an EVENT DEADMAN_TRIP, latches the same
  way; a COMMAND read past the deadman before the timer saw it (this process stalled with the
  daemon's frames queued) trips it first. The daemon's end of the socketpair closing is a
  deadman for good (latched).
- Every forwarded COMMAND is clamped to the robot's joint and gripper limits (limits.py); a
  COMMAND with the wrong joint count or a non-finite value is replaced by a hold.
- G_STATE goes to the daemon on every change and every `state_period_s` (default: half the
  deadman time, at most 1 s — the daemon's heartbeat: it counts silence past its deadman time as
  a deadman stop).
- Timed commands (G_AT, docs/PROTOCOL.md §5.2): the daemon computes each tick's COMMAND one
  period ahead and hands it over with its deadline; `on_tick` at that time feeds it through the
  COMMAND rules above (latch, clamp, deadman), so the frame leaves on the loop's clock whatever
  the daemon's wake-up jitter. At most one waits: a newer G_AT sends it first; any latch, any
  STOP or immediate COMMAND from the daemon, or the daemon's loss drops it — a frame computed
  before a stop never goes out after it. One already due goes out at once; one due further
  ahead than the deadman time is refused (counted in `timed_rejected`).
- This process's own stalls (docs/PROTOCOL.md §4): a gap in its own time while the robot moved,
  and motion decided before a stall but written after it, are deadman trips (guardian_stall.py).
"""

from __future__ import annotations

import math

from edge_agent.link.codec import (
    Command,
    Enable,
    EstopEdge,
    Event,
    EventCode,
    GAt,
    GReset,
    GState,
    Hello,
    HelloAck,
    Message,
    Ping,
    Status,
    StatusFlag,
    Stop,
    StopCategory,
    StopReason,
)
from edge_agent.link.guardian_actions import Actions, GuardianFlag, is_motion
from edge_agent.link.guardian_stall import OwnTime
from edge_agent.link.guardian_timed import LATE_RELEASE_S, TimedSlot
from edge_agent.link.limits import Limits

__all__ = ["LATE_RELEASE_S", "Actions", "GuardianFlag", "GuardianRules", "Limits"]


_ESTOP_REASONS = frozenset({StopReason.ESTOP_INPUT, StopReason.ESTOP_REMOTE})
_ESTOP_BIT = int(StatusFlag.ESTOP_INPUT)
_DEADMAN_BIT = int(StatusFlag.DEADMAN_TRIPPED)


class GuardianRules:
    """The guardian's state and rules; every method takes `now` (monotonic seconds)."""

    def __init__(self, limits: Limits, now: float, *, deadman_s: float = 0.05,
                 hold_period_s: float = 0.01, state_period_s: float | None = None,
                 hello: Hello | None = None, realtime: bool = False,
                 start_latched: StopReason | None = None) -> None:
        self.limits = limits
        self.deadman_s = deadman_s
        self.hold_period_s = hold_period_s
        self.state_period_s = (min(1.0, deadman_s / 2) if state_period_s is None
                               else state_period_s)
        self.hello = hello or Hello()
        self.latched = start_latched is not None
        self.cause = start_latched or StopReason.NONE
        self.estop_input = False
        self.fw_deadman = False  # the firmware's DEADMAN_TRIPPED as last seen
        self.link_up = False
        self.need_enable = False
        self.deadman_hold = False
        self.daemon_lost = False
        self.session_open = False
        self.version_mismatch = False
        self.realtime = realtime
        self._last_cmd_at: float | None = None  # the deadman is armed by the first COMMAND
        self._moving = False  # the daemon's last COMMAND asked for motion
        # the firmware's deadman tripped while we only held: it holds until ENABLE(1) and moves
        # nothing meanwhile, so motion sent without one would be dropped there unseen
        self._fw_held = False
        self._next_hold_at = math.inf
        self._next_state_at = now
        self._sent_key: tuple[object, ...] | None = None  # what the last G_STATE said
        self._own = OwnTime(now)  # this process's own stalls (guardian_stall.py)
        self.counters = {"stops_sent": 0, "dropped_motion": 0, "dropped_enable": 0,
                         "clamped": 0, "rejected": 0, "resets": 0, "resets_refused": 0,
                         "holds_sent": 0, "deadman_trips": 0,
                         "fw_deadman_reports": 0, "timed_released": 0, "timed_late": 0,
                         "timed_arrived_late": 0, "timed_dropped": 0, "timed_rejected": 0,
                         "stalls": 0, "stale_dropped": 0, "stale_written": 0}
        self._timed = TimedSlot(self.counters)  # a G_AT frame waiting for its time

    # -- inputs ----------------------------------------------------------------------------
    def on_tty(self, msg: Message, now: float) -> Actions:
        """A frame from the firmware (it is relayed to the daemon by the caller)."""
        acts = Actions()
        if self._own.woke(now, self.deadman_s):
            self._stalled(now, "stalls")
        if isinstance(msg, Status):  # 1 kHz: the common case must stay cheap
            flags = int(msg.flags)
            pressed = bool(flags & _ESTOP_BIT)
            tripped = bool(flags & _DEADMAN_BIT)
            if (pressed == self.estop_input and tripped == self.fw_deadman
                    and (self.latched or not pressed)):
                return acts  # nothing changed
            if pressed and (not self.estop_input or not self.latched):
                self._estop(acts)  # an edge whose ESTOP_EDGE frame was lost, or not yet latched
            self.estop_input = pressed
            if tripped and not self.fw_deadman:  # an edge (its EVENT may have been lost)
                self._fw_deadman()
            self.fw_deadman = tripped
        elif isinstance(msg, EstopEdge):
            if msg.pressed:
                self._estop(acts)
            self.estop_input = msg.pressed
        elif isinstance(msg, Event) and msg.code == EventCode.DEADMAN_TRIP:
            self._fw_deadman()
        elif isinstance(msg, HelloAck):
            self.session_open = msg.accepted
            self.version_mismatch = not msg.accepted
        return self._changed(acts, now)

    def on_daemon(self, msg: Message, now: float) -> Actions:
        """A frame from the daemon; what may reach the tty goes into `tty`."""
        acts = Actions()
        if self._own.woke(now, self.deadman_s):
            self._stalled(now, "stalls")
        if isinstance(msg, GAt):
            self._on_timed(msg, now, acts)
        elif isinstance(msg, Command):
            self._drop_timed()  # sent at once: it supersedes the one computed before it
            # Our own timer may have fired late (this process stalled, the daemon's frames
            # queued meanwhile): a COMMAND arriving past the deadman trips it first.
            self._deadman_due(now)
            if (self.deadman_hold or self._fw_held) and msg.moves and not self._moving:
                # a hold stream resumes with motion after a silence, or motion follows a
                # firmware trip no ENABLE(1) cleared: a stop the daemon sees, not a task that
                # commands a held arm until it gives up (3 x not_converged, measured)
                self._fw_held = False
                self._trip_deadman()
            self._moving = msg.moves
            if msg.moves:
                self._own.moved_at = now
            self._last_cmd_at = now
            self.deadman_hold = False
            self._next_hold_at = math.inf
            cmd = self.limits.clamp(msg)
            if cmd is None:
                self.counters["rejected"] += 1
                acts.tty.append(self.limits.hold())
            elif cmd.moves and (self.latched or self.need_enable):
                self.counters["dropped_motion"] += 1
            else:
                if cmd is not msg:
                    self.counters["clamped"] += 1
                acts.tty.append(cmd)
        elif isinstance(msg, Stop):
            acts.tty.append(msg)
            self._drop_timed()
            reason = msg.reason
            if reason == StopReason.NONE:
                cat0 = msg.category == StopCategory.CAT0
                reason = StopReason.ESTOP_REMOTE if cat0 else StopReason.PROTECTIVE
            self._latch(reason)
        elif isinstance(msg, Enable):
            if msg.enable and self.latched:
                self.counters["dropped_enable"] += 1
            else:
                if msg.enable:
                    self.need_enable = False
                    self._fw_held = False  # it clears the firmware's trip
                acts.tty.append(msg)
        elif isinstance(msg, GReset):
            self._reset(acts)
        elif isinstance(msg, Hello):
            self.hello = msg
            acts.tty.append(msg)
        elif isinstance(msg, Ping):
            acts.tty.append(msg)
        return self._changed(acts, now)

    def on_tick(self, now: float) -> Actions:
        """Timers: a timed command's deadline, the deadman, the hold stream, the G_STATE."""
        acts = Actions()
        if self._own.woke(now, self.deadman_s):
            self._stalled(now, "stalls")
        if self._timed.due(now):
            self._release(now, acts)
        self._deadman_due(now)
        if self.deadman_hold and now >= self._next_hold_at:
            acts.tty.append(self.limits.hold())
            self.counters["holds_sent"] += 1
            self._next_hold_at = now + self.hold_period_s
        if now >= self._next_state_at:
            self._sent_key = None  # force one out
        return self._changed(acts, now)

    def on_port_opened(self, now: float) -> Actions:
        """The tty was (re)opened: open a session with HELLO."""
        self.session_open = False
        return self._changed(Actions(tty=[self.hello]), now)

    def on_link(self, up: bool, now: float) -> Actions:
        """The link came up (a valid frame) or failed."""
        self.link_up = up
        if not up:
            self.session_open = False
            self.estop_input = False  # unknown until the next frame; a pressed input is an edge
            self.fw_deadman = False  # so is a tripped firmware deadman
            self._latch(StopReason.LINK_FAULT)
        return self._changed(Actions(), now)

    def on_daemon_lost(self, now: float) -> Actions:
        """The daemon's end closed: hold now (and on every tick) for as long as we run."""
        self.daemon_lost = True
        self._drop_timed()
        self._latch(StopReason.DEADMAN)
        self.deadman_hold = True
        self._last_cmd_at = -math.inf
        self._next_hold_at = now
        return self.on_tick(now)

    def before_write(self, msg: Message, now: float) -> Actions | None:
        """`msg`, let through by the last input, is about to be written; `now` is the caller's
        clock read just before the write. None: write it. Actions: do not — it is motion decided
        longer ago than the stall bound (this process was frozen with it in hand, the firmware's
        deadman tripped meanwhile); the deadman trips (`stale_dropped`)."""
        if not is_motion(msg) or not self._own.stale(now, self.stall_bound_s):
            return None
        self._stalled(now, "stale_dropped")
        return self._changed(Actions(), now)

    def after_write(self, msg: Message, now: float) -> Actions | None:
        """`msg` was written; `now` is the caller's clock read after the write. Motion decided
        longer ago than the stall bound may have gone out stale (the stall fell after
        `before_write`): STOP(CAT2, DEADMAN) to the tty at once, the deadman trips
        (`stale_written`). None (the common case): nothing to do."""
        if not is_motion(msg) or not self._own.stale(now, self.stall_bound_s):
            return None
        self.counters["stops_sent"] += 1
        self._stalled(now, "stale_written")
        return self._changed(Actions(tty=[Stop(StopCategory.CAT2, StopReason.DEADMAN)]), now)

    @property
    def stall_bound_s(self) -> float:
        """The longest a decision to move may wait for its write: the deadman time, or the
        firmware's (HELLO) when shorter — after it the firmware has tripped."""
        fw = self.hello.deadman_ms / 1000
        return min(self.deadman_s, fw) if fw > 0 else self.deadman_s

    def force_state(self) -> None:
        """Send G_STATE with the next actions (the previous one may have been lost)."""
        self._sent_key = None

    # -- derived ---------------------------------------------------------------------------
    @property
    def flags(self) -> GuardianFlag:
        f = GuardianFlag(0)
        for on, bit in ((self.realtime, GuardianFlag.REALTIME),
                        (self.session_open, GuardianFlag.SESSION_OPEN),
                        (self.version_mismatch, GuardianFlag.VERSION_MISMATCH),
                        (self.need_enable, GuardianFlag.NEED_ENABLE),
                        (self.daemon_lost, GuardianFlag.DAEMON_LOST)):
            if on:
                f |= bit
        return f

    @property
    def state(self) -> GState:
        cause = self.cause if self.latched else (
            StopReason.DEADMAN if self.deadman_hold else StopReason.NONE)
        return GState(self.latched, self.estop_input, self.deadman_hold, self.link_up, cause,
                      int(self.flags))

    def next_deadline(self) -> float:
        """When on_tick must run next (the caller may call it earlier)."""
        t = min(self._next_state_at, self._next_hold_at)
        if (due := self._timed.next_deadline()) is not None:
            t = min(t, due)
        if not self.deadman_hold and self._last_cmd_at is not None:
            t = min(t, self._last_cmd_at + self.deadman_s)
        return t

    # -- internals -------------------------------------------------------------------------
    def _estop(self, acts: Actions) -> None:
        acts.tty.insert(0, Stop(StopCategory.CAT0, StopReason.ESTOP_INPUT))
        self.counters["stops_sent"] += 1
        self._latch(StopReason.ESTOP_INPUT)

    def _deadman_due(self, now: float) -> None:
        if (not self.deadman_hold and self._last_cmd_at is not None
                and now >= self._last_cmd_at + self.deadman_s):  # as next_deadline() says
            self.deadman_hold = True
            self._next_hold_at = now
            if self._moving:
                self._trip_deadman()  # stale setpoints may follow: drop them

    def _stalled(self, now: float, counter: str) -> None:
        """This process stalled while the robot moved: the silence it saw is a deadman."""
        self.counters[counter] += 1
        self.deadman_hold = True
        self._next_hold_at = now
        self._trip_deadman()

    def _trip_deadman(self) -> None:
        self.counters["deadman_trips"] += 1
        self._latch(StopReason.DEADMAN)

    def _fw_deadman(self) -> None:
        self.counters["fw_deadman_reports"] += 1
        if self._moving:
            self._latch(StopReason.DEADMAN)
        else:
            self._fw_held = True

    def _on_timed(self, msg: GAt, now: float, acts: Actions) -> None:
        if self._timed.waiting is not None:
            # The daemon computes a frame only after the previous frame's deadline, so on its
            # clock the waiting one is due: out first, in order. (Ours may read a few µs behind
            # on another CPU of a VM.)
            self._release(now, acts)
        if self._timed.admit(msg, now, self.deadman_s) and self._timed.due(now):
            self._release(now, acts)  # arrived at or after its deadline

    def _release(self, now: float, acts: Actions) -> None:
        cmd = self._timed.take(now)
        acts.extend(self.on_daemon(cmd, now))  # the COMMAND rules, as if it arrived now

    def _drop_timed(self) -> None:
        self._timed.drop()

    @property
    def max_release_late_s(self) -> float:
        """The latest a timed frame went out after its deadline."""
        return self._timed.max_release_late_s

    def _latch(self, reason: StopReason) -> None:
        self._drop_timed()
        outranks = reason in _ESTOP_REASONS and self.cause not in _ESTOP_REASONS
        if not self.latched or outranks:
            self.cause = reason
        self.latched = True

    def _reset(self, acts: Actions) -> None:
        if not self.latched:
            self._sent_key = None  # answer anyway: the daemon waits for the outcome
            return
        if self.estop_input or not self.link_up:
            self.counters["resets_refused"] += 1
            refused = self.state
            acts.daemon.append(GState(refused.latched, refused.estop_input,
                                      refused.deadman_hold, refused.link_up,
                                      StopReason.RESET_REFUSED, refused.flags))
            return
        self.counters["resets"] += 1
        self.latched = False
        self.cause = StopReason.NONE
        self.need_enable = True

    def _changed(self, acts: Actions, now: float) -> Actions:
        key = (self.latched, self.estop_input, self.deadman_hold, self.link_up, self.cause,
               self.realtime, self.session_open, self.version_mismatch, self.need_enable,
               self.daemon_lost)
        self._own.last_input = now
        if key != self._sent_key:
            acts.daemon.append(self.state)
            self._sent_key = key
            self._next_state_at = now + self.state_period_s
        return acts
