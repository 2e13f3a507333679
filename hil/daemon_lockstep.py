"""The whole daemon core in lock-step with the simulated firmware: virtual time, no threads of ours.

A real `edge_agent.daemon.app.Daemon` — command API with admission, executor, stop latch, link
mirror, sensor hub, snapshot store on disk — runs against `hil.sim.firmware.Firmware` through
`hil.lockstep.Lockstep`. What is not the daemon's own code is replaced at its lowest seam only:

- the link guardian process → `LockstepGuardian`: the guardian's real sans-IO rules
  (`GuardianRules`) between the daemon and the firmware, with the link-up/-down detection of
  `SerialLink` reduced to "a valid frame" / "no valid frame for `rx_fault_s`". Every frame the
  daemon hands the guardian is kept in `handed` with the daemon's latch state at that moment —
  what the stop model is checked against, not only what the guardian lets through (`to_tty`).
- the control thread → `host.tick` calling the daemon's control tick (`control.tick`) every
  control period;
- the monotonic clock → a `ManualClock` set to the runner's virtual time (the executor, latch,
  command API and link mirror all read it).

`kill9()` drops the daemon without a clean shutdown (the old guardian sees its daemon go and
holds); `boot()` starts a new one on the same state dir, as systemd would after a crash.
`stall(s)` stops the daemon for `s` of virtual time, as SIGSTOP would: no control tick, and the
guardian's frames wait for it (delivered, in order, before its first tick after the stall).
The firmware — the robot — keeps running throughout.

    h = DaemonLockstep(tmp_path, seed=3, estop_hold=False)
    h.boot()
    h.run_for(0.2)
    h.command("task.start", {})          # a Reply, as MQTT would get it
    h.press(); h.run_for(0.01); h.release()
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.clock import ManualClock
from edge_agent.commands.api import Reply
from edge_agent.config import Config, load_config
from edge_agent.daemon.app import Daemon
from edge_agent.errors import LinkError
from edge_agent.link.codec import (
    Command,
    Enable,
    Frame,
    GAt,
    GReset,
    GState,
    Hello,
    Message,
)
from edge_agent.link.guardian_rules import Actions, GuardianRules, Limits
from edge_agent.link.messages import FrameType
from edge_agent.robot import RobotDescription
from hil.lockstep import Lockstep
from hil.sim.config import DEFAULT_RIG, load_rig

ROOT = Path(__file__).resolve().parents[1]
ROBOT = ROOT / "configs" / "robot" / "edge-arm-4.toml"
_FIRMWARE_TYPES = FrameType.HELLO_ACK  # frame types from the firmware are numbered from here


@dataclass(frozen=True, slots=True)
class Handed:
    """One frame the daemon gave the guardian."""

    t: float
    boot: int  # which daemon (0 = the first boot)
    latched: bool  # the daemon's own latch when it sent this
    generation: int  # the latch's generation then
    msg: Message


class LockstepGuardian:
    """The link guardian's rules in-process; the daemon's `guardian` (GuardianClient's seam)."""

    def __init__(self, host: DaemonHost, robot: RobotDescription, cfg: Config, now: float,
                 boot: int) -> None:
        self.host = host
        self.boot = boot
        self.rules = GuardianRules(
            Limits.from_robot(robot), now, deadman_s=cfg.link.deadman_ms / 1000.0,
            hello=Hello(deadman_ms=100, status_period_us=cfg.link.status_period_us))
        self.handed: list[Handed] = []
        self.to_tty: list[tuple[float, Message]] = []  # everything the rules let through
        self._tty: list[Message] = []
        self._daemon: list[GState] = []
        self.last_rx: float | None = None
        self.opened_at = now
        self.alive = True
        self.daemon_lost = False
        self.ready = True
        self._apply(self.rules.on_port_opened(now), now)

    # -- the daemon's side (GuardianClient's interface) ---------------------------------------
    def send(self, msg: Message) -> None:
        if not self.alive:
            raise LinkError("the link guardian is not running")
        d = self.host.daemon
        now = self.host.clock.now()
        st = d.latch.state if d is not None else None
        self.handed.append(Handed(now, self.boot, bool(st and st.latched),
                                  st.generation if st else -1, msg))
        self._apply(self.rules.on_daemon(msg, now), now)

    def reset(self) -> None:
        """G_RESET; its answer (a G_STATE) reaches the daemon a moment later, so time passes
        here as it does while the real handler waits for it."""
        self.send(GReset())
        self.host.runner.run_for(0.002)

    def stop(self, timeout_s: float = 2.0) -> None:
        self.alive = False

    # -- the runner's side -------------------------------------------------------------------
    def from_firmware(self, frames: Sequence[Frame], now: float) -> list[Frame]:
        """Rules first (a STOP goes out before anything is relayed), then relay."""
        relay: list[Frame] = []
        for f in frames:
            self.last_rx = now
            if not self.rules.link_up:
                self._apply(self.rules.on_link(True, now), now)
            self._apply(self.rules.on_tty(f.msg, now), now)
            if f.msg.TYPE >= _FIRMWARE_TYPES:
                relay.append(f)
        silent_since = self.last_rx if self.last_rx is not None else self.opened_at
        if self.rules.link_up and now - silent_since >= self.host.rx_fault_s:
            self._apply(self.rules.on_link(False, now), now)
        self._apply(self.rules.on_tick(now), now)
        return relay

    def daemon_gone(self, now: float) -> None:
        self.daemon_lost = True
        self._apply(self.rules.on_daemon_lost(now), now)

    def take_states(self) -> list[GState]:
        out, self._daemon = self._daemon, []
        return out

    def take_tty(self) -> list[Message]:
        out, self._tty = self._tty, []
        return out

    def _apply(self, acts: Actions, now: float) -> None:
        self._daemon += acts.daemon
        self._tty += acts.tty
        self.to_tty += [(now, m) for m in acts.tty]


class DaemonHost:
    """The Lockstep runner's host: guardian rules every firmware tick, the daemon's control tick
    every control period."""

    def __init__(self, harness: DaemonLockstep) -> None:
        self.h = harness
        self.clock = harness.clock
        self.rx_fault_s = harness.rx_fault_s
        self.daemon: Daemon | None = None
        self.guardian: LockstepGuardian | None = None
        self.old_guardians: list[LockstepGuardian] = []  # a killed daemon's, still holding
        self._next_tick = 0.0
        self._index = itertools.count()
        self.stalled_until = -1.0  # the daemon is stopped (SIGSTOP) until then
        self._held: list[Frame] = []  # frames for a stalled daemon, in order

    @property
    def runner(self) -> Lockstep:
        return self.h.runner

    def tick(self, now: float, frames: Sequence[Frame]) -> Iterable[Message]:
        self.clock.set(max(now, self.clock.now()))
        out: list[Message] = []
        for g in self.old_guardians:
            g.from_firmware((), now)
            out += g.take_tty()
        g = self.guardian
        d = self.daemon
        if g is None:
            return out
        relay = g.from_firmware(frames, now)
        if d is not None:
            relay += [Frame(0, st) for st in g.take_states()]
            if now < self.stalled_until - 1e-9:
                self._held += relay
                return out + g.take_tty()
            relay, self._held = self._held + relay, []
            on_frame = d.mirror.on_frame
            for f in relay:
                on_frame(f)
            if now >= self._next_tick - 1e-9:
                self._next_tick = now + self.h.control_period_s
                d.control.tick(now, next(self._index))
                d.housekeeping(now)  # executor events → comms, snapshots on task events
        out += g.take_tty()
        return out


class DaemonLockstep:
    """A daemon (or a series of them, across kill -9 restarts) on one simulated robot."""

    def __init__(self, state_dir: Path, *, seed: int = 0, estop_hold: bool = True,
                 control_hz: float = 200.0, rx_fault_s: float = 0.3,
                 overrides: Sequence[str] = ()) -> None:
        self.state_dir = Path(state_dir)
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.cfg_path = self.state_dir.parent / f"{self.state_dir.name}.toml"
        self.cfg_path.write_text(
            f'schema_version = 1\nstate_dir = "{self.state_dir}"\n'
            f'[device]\nid = "lockstep"\n[robot]\ndescription = "{ROBOT}"\n'
            f"[control]\nrate_hz = {control_hz:g}\npriority = 0\n[link]\nport = \"socket://lockstep:1\"\n"
            "[journal]\nenabled = false\n[log]\nlevel = \"warning\"\n")
        self.overrides = tuple(overrides)
        self.cfg = load_config(self.cfg_path, self.overrides)
        self.control_period_s = 1.0 / control_hz
        self.rx_fault_s = rx_fault_s
        self.clock = ManualClock(0.0)
        self.host = DaemonHost(self)
        rig = load_rig(DEFAULT_RIG).replace(firmware_estop_hold=estop_hold)
        self.runner = Lockstep(self.cfg.robot, rig, seed=seed, host=self.host,
                               host_period_s=rig.tick_s)
        self.boots = 0
        self.handed: list[Handed] = []  # every boot's, in order
        self.events: list[dict[str, Any]] = []  # every event the daemons published, in order

    # -- the daemon's life -------------------------------------------------------------------
    @property
    def daemon(self) -> Daemon:
        d = self.host.daemon
        if d is None:
            raise RuntimeError("no daemon is running (boot() first)")
        return d

    def boot(self) -> Daemon:
        """A new daemon process on the state dir: restore, guardian, latch it if restored
        latched — start()'s path up to the control loop, with the lock-step seams."""
        if self.host.daemon is not None:
            raise RuntimeError("a daemon is running; kill9() it first")
        self.host.old_guardians = []  # the old guardian exited; the new one opens the tty
        d = Daemon(self.cfg, clock=self.clock)
        d.restore_state()
        g = LockstepGuardian(self.host, self.cfg.robot, self.cfg, self.runner.now, self.boots)
        g.handed = self.handed  # one list across boots
        self.host.guardian = g
        self.host.daemon = d
        d.control.guardian = g  # type: ignore[assignment]  # GuardianClient's seam
        d.control.latch_new_guardian()
        d.register_handlers()
        d.comms.add_listener(self.events.append)  # every event, kept in order
        self.boots += 1
        return d

    def kill9(self) -> None:
        """The daemon dies without a word: nothing more is persisted, no clean-shutdown mark.
        Its guardian sees the socket close and holds until the next boot replaces it."""
        d, g = self.host.daemon, self.host.guardian
        if d is None or g is None:
            return
        d.writer.stop()  # its thread would outlive the "process"; what it had queued lands
        self.host._held, self.host.stalled_until = [], -1.0
        g.daemon_gone(self.runner.now)
        self.host.old_guardians = [g]
        self.host.daemon = None
        self.host.guardian = None

    def stall(self, seconds: float) -> None:
        """Stop the daemon process for `seconds` from now (SIGSTOP ... SIGCONT)."""
        self.host.stalled_until = self.runner.now + seconds
        self.runner.run_for(seconds)

    # -- the world ---------------------------------------------------------------------------
    def run_for(self, dt: float) -> None:
        self.runner.run_for(dt)

    def command(self, name: str, args: dict[str, Any] | None = None, *,
                source: str = "lockstep") -> Reply:
        """One command through the command API, as a transport submits it."""
        payload: dict[str, Any] = {"v": 1, "id": f"c{next(_ids)}", **(args or {})}
        return self.daemon.api.handle(name, payload, source=source)

    def press(self) -> None:
        self.runner.inject("estop", "press")

    def release(self) -> None:
        self.runner.inject("estop", "release")

    def outcome(self, task_id: str) -> str | None:
        """The outcome of the task's `task_done` event, None while it runs."""
        for ev in self.events:
            if ev.get("type") == "task_done" and ev.get("task_id") == task_id:
                return str(ev.get("outcome"))
        return None

    @property
    def pressed(self) -> bool:
        return bool(self.runner.fw.estop_input)

    def close(self) -> None:
        d = self.host.daemon
        if d is not None:
            d.writer.stop()
        self.host.daemon = None


_ids = itertools.count(1)


def motion(msg: Message) -> bool:
    """A frame that would move the robot: a moving COMMAND (timed or not) or ENABLE(1)."""
    if isinstance(msg, GAt):
        msg = msg.cmd
    return ((isinstance(msg, Command) and msg.moves)
            or (isinstance(msg, Enable) and msg.enable))
