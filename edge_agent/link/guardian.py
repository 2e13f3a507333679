"""The link guardian process: owns the tty, relays frames, enforces the stop rules at the wire.

    python -m edge_agent.link.guardian --fd N --port PORT --robot ROBOT.toml [options]

Started by the daemon (`GuardianClient`), which passes one end of an AF_UNIX stream socketpair as
fd N. One select() loop over the tty, the socket, a signal pipe and the rules' next deadline:
- tty → daemon: every frame goes through `GuardianRules.on_tty` (an e-stop edge writes STOP at
  once, before anything else), then the bytes are relayed unchanged when they decoded cleanly
  (re-encoded, sequence numbers kept, when something in them was skipped);
- daemon → tty: each frame goes through `GuardianRules.on_daemon`; what passes is re-encoded with
  the guardian's own sequence numbers, so the tty carries one gap-free sequence however the
  guardian's own STOP and HOLD frames are interleaved (`STATUS.last_cmd_seq` counts in it);
  motion is judged again on a fresh clock just before and just after its write
  (`before_write`/`after_write`): this process frozen between the decision and the write is a
  deadman trip, never a stale setpoint at the robot;
- G_STATE to the daemon carries the sequence number of the last relayed firmware frame, so the
  daemon's decoder sees it as a repeat (`duplicates`), never as a gap in the firmware's stream.
The guardian sends HELLO each time it opens the port (the daemon's own HELLO, when it sent one,
replaces the default). Daemon gone (end of file) or SIGTERM/SIGINT: one COMMAND(HOLD), exit 0.
It asks for SCHED_FIFO (`--priority`, default 30) and says in its log and in G_STATE.flags
(REALTIME) whether it got it. Logs go to stderr in the daemon's format (--log-format: JSON
lines, or its console lines on a terminal). At exit it logs its counters and
`stop_reaction` (select() returning → STOP written: its own share of the e-stop reaction).
Only stdlib, pyserial, the codec, the rules, the robot description and edge_agent.logline (stdlib
only) are imported.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from types import FrameType as PyFrame
from typing import Any

from edge_agent import logline
from edge_agent.link.codec import (
    Frame,
    FrameDecoder,
    GState,
    Hello,
    Message,
    SeqCounter,
    Stop,
    StopReason,
    encode,
)
from edge_agent.link.guardian_actions import is_motion
from edge_agent.link.guardian_rules import Actions, GuardianRules, Limits
from edge_agent.link.serial_link import LinkConfig, SerialLink
from edge_agent.robot import load_robot

_OUT_CAP = 1 << 20  # bytes queued for a daemon that does not read: ~5 s of status, then dropped
_FIRMWARE_TYPES = 0x80  # frame types from the firmware are 0x80 and up (docs/PROTOCOL.md §2)


_LOG_JSON = [True]  # set in main() from --log-format


def _log(event: str, **kw: Any) -> None:
    """One line on stderr in the daemon's format: JSON lines (journald) or its console lines."""
    rec: dict[str, Any] = {"ts": logline.iso_utc(time.time()), "level": kw.pop("level", "info"),
                           "logger": "edge_agent.link.guardian", "event": event,
                           "pid": os.getpid(), **kw}
    if _LOG_JSON[0]:
        line = logline.render_json(rec)  # `logger` says whose line it is
    else:  # the console format drops `logger`: the event name says it
        rec["event"] = f"guardian.{event}"
        line = logline.render_console(rec, _LOG_COLOR[0])
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


_LOG_COLOR = [False]


def _configure_log(fmt: str) -> None:
    tty = sys.stderr.isatty()
    _LOG_JSON[0] = fmt == "json" or (fmt == "auto" and not tty)
    _LOG_COLOR[0] = tty and not os.environ.get("NO_COLOR")


def _ask_realtime(priority: int) -> tuple[bool, str]:
    if priority <= 0:
        return False, "not asked (--priority 0)"
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (PermissionError, OSError, AttributeError) as exc:
        return False, f"SCHED_FIFO {priority} refused: {exc}"
    return True, f"SCHED_FIFO {priority}"


def fw_deadman_ms(args: argparse.Namespace) -> int:
    """The firmware's deadman must outlast ours: our HOLD stream (after --deadman-ms of daemon
    silence) keeps it from tripping, so it stays the last line (PROTOCOL.md §4). A fixed 100 ms
    under a 250 ms guardian deadman tripped the firmware first on a 100-250 ms stall, latched
    unseen when the daemon's last COMMAND was a HOLD: later motion moved nothing."""
    if args.fw_deadman_ms is not None:
        return int(args.fw_deadman_ms)
    return max(100, math.ceil(2 * float(args.deadman_ms)))


class Guardian:
    """The loop; `run()` returns the exit status."""

    def __init__(self, args: argparse.Namespace, sock: socket.socket, limits: Limits,
                 realtime: bool) -> None:
        now = time.monotonic()
        self.sock = sock
        hello = Hello(deadman_ms=fw_deadman_ms(args), status_period_us=args.status_period_us)
        self.rules = GuardianRules(
            limits, now, deadman_s=args.deadman_ms / 1000, hold_period_s=args.hold_period_ms / 1000,
            hello=hello, realtime=realtime,
            start_latched=StopReason.PROTECTIVE if args.start_latched else None)
        self.link = SerialLink(
            LinkConfig(port=args.port, baudrate=args.baudrate,
                       write_timeout_s=args.write_timeout_ms / 1000,
                       rx_timeout_s=args.rx_timeout_ms / 1000,
                       open_timeout_s=args.open_timeout_ms / 1000,
                       max_bad_in_row=args.fault_after,
                       backoff_min_s=args.reopen_min_s, backoff_max_s=args.reopen_max_s),
            on_open=self._on_open, on_up=self._on_up, on_down=self._on_down)
        self.tty_seq = SeqCounter()
        self.from_daemon = FrameDecoder()
        self.out = bytearray()
        self.out_overflows = 0
        self.stop_reaction_s: deque[float] = deque(maxlen=100_000)
        self.max_late_s = self.max_busy_s = 0.0
        self.fw_seq = 0
        self.states: list[GState] = []  # for the daemon, in the order the rules made them
        self.tty_later: list[Message] = []  # from link callbacks: written after the link call
        self.stop_reason: str | None = None
        self.wake_r, wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(wake_w, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    # -- link callbacks: the rules learn at once, their outputs go out after the link call ---
    def _later(self, acts: Actions) -> None:
        self.states += acts.daemon
        self.tty_later += acts.tty

    def _on_open(self, now: float) -> None:
        self._later(self.rules.on_port_opened(now))

    def _on_up(self, now: float) -> None:
        _log("link_up", port=self.link.config.port)
        self._later(self.rules.on_link(True, now))

    def _on_down(self, cause: str, detail: str, now: float) -> None:
        _log("link_fault", level="warning", cause=cause, detail=detail,
             counters=self.link.counters_dict())
        self._later(self.rules.on_link(False, now))

    def _on_signal(self, signum: int, frame: PyFrame | None) -> None:
        self.stop_reason = signal.Signals(signum).name

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> int:
        woke = time.monotonic()
        while self.stop_reason is None:
            now = time.monotonic()
            self.link.poll(now)
            self._apply(self.rules.on_tick(now), now)
            self._flush(now)
            timeout = max(0.0, min(self.link.next_deadline(), self.rules.next_deadline())
                          - time.monotonic())
            tty_fd = self.link.fileno()
            rlist: list[Any] = [self.sock, self.wake_r]
            if tty_fd is not None:
                rlist.insert(0, tty_fd)
            before = time.monotonic()
            self.max_busy_s = max(self.max_busy_s, before - woke)  # one wake-up's work
            readable, writable, _ = select.select(rlist, [self.sock] if self.out else [], [],
                                                  timeout)
            now = woke = time.monotonic()
            if not readable and not writable:  # woken late by the timer: the machine stalled us
                self.max_late_s = max(self.max_late_s, now - before - timeout)
            if tty_fd is not None and tty_fd in readable:
                self._from_tty(now)
            if self.sock in readable:
                now = time.monotonic()  # fresh: G_AT deadlines are absolute, and the tty's
                self._from_daemon(now)  # frames may have taken a while
                self._flush(now)
            if writable:
                self._to_daemon(b"")
            if self.wake_r in readable:
                while True:
                    try:
                        if not os.read(self.wake_r, 64):
                            break
                    except BlockingIOError:
                        break
        return self._shutdown()

    def _from_tty(self, now: float) -> None:
        def on_frame(f: Frame) -> None:  # runs as each frame is decoded
            # a STOP goes out before anything else is decoded or relayed
            self._apply(self.rules.on_tty(f.msg, now), now)

        got = self.link.read(now, on_frame)
        if got.frames:
            ours = [f for f in got.frames if f.msg.TYPE >= _FIRMWARE_TYPES]
            if got.clean is not None and len(ours) == len(got.frames):
                self._to_daemon(got.clean)
            elif ours:
                self._to_daemon(b"".join(encode(f.msg, f.seq) for f in ours))
            self.fw_seq = got.frames[-1].seq
        self._flush(now)

    def _from_daemon(self, now: float) -> None:
        try:
            data = self.sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            _log("daemon_lost", level="warning")
            self._apply(self.rules.on_daemon_lost(now), now)
            self.stop_reason = "daemon_lost"
            return
        for f in self.from_daemon.feed(data):
            self._apply(self.rules.on_daemon(f.msg, now), now)

    def _apply(self, acts: Actions, now: float) -> None:
        """Write the tty frames now; queue the states (before the writes: a write that fails
        reports the link fault through a callback, and that state is the newer one)."""
        self.states += acts.daemon
        for m in acts.tty:
            self._write_tty(m, now)

    def _flush(self, now: float) -> None:
        while self.tty_later:
            self._write_tty(self.tty_later.pop(0), now)
        for st in self.states:
            self._to_daemon(encode(st, self.fw_seq))
        self.states.clear()

    def _write_tty(self, msg: Message, now: float) -> None:
        urgent = isinstance(msg, Stop)
        motion = is_motion(msg)
        data = encode(msg, self.tty_seq.peek())  # before the check: nothing slow after it
        if motion:
            # `now` was read before the rules let it through: a SIGSTOP, a swap storm or a
            # debugger may have frozen us since, while the firmware's deadman tripped and the
            # daemon latched. The rules judge the motion again on a fresh clock, and again after
            # the write for a freeze that falls between the two.
            t = time.monotonic()
            refused = self.rules.before_write(msg, t)
            if refused is not None:
                self._apply(refused, t)
                return
        self.tty_seq.next()
        self.link.write(data, now, urgent=urgent)
        if urgent:  # `now` is when select() returned: this is the guardian's own share
            self.stop_reaction_s.append(time.monotonic() - now)
        elif motion:
            t = time.monotonic()
            stale = self.rules.after_write(msg, t)
            if stale is not None:
                self._apply(stale, t)

    def _to_daemon(self, data: bytes) -> None:
        self.out += data
        if not self.out:
            return
        try:
            del self.out[: self.sock.send(self.out)]
        except BlockingIOError:
            pass
        except OSError:
            self.out.clear()  # the daemon is gone; its end of file will tell the loop
            return
        if len(self.out) > _OUT_CAP:
            # COBS framing resyncs at the next delimiter: dropping bytes costs the daemon one bad
            # frame, and G_STATE is sent again so it cannot miss a change.
            self.out.clear()
            self.out_overflows += 1
            self.rules.force_state()

    def _shutdown(self) -> int:
        now = time.monotonic()
        if self.stop_reason != "daemon_lost":  # that path already sent its hold
            self._write_tty(self.rules.limits.hold(), now)
        r = sorted(x * 1e3 for x in self.stop_reaction_s)
        reaction: dict[str, float] = {"n": len(r)}
        if r:
            reaction |= {"p50_ms": r[len(r) // 2], "p99_ms": r[int(len(r) * 0.99)],
                         "max_ms": r[-1]}
        _log("exit", reason=self.stop_reason, rules=self.rules.counters,
             link=self.link.counters_dict(), daemon_overflows=self.out_overflows,
             stop_reaction=reaction, max_timer_late_ms=self.max_late_s * 1e3,
             max_timed_release_late_ms=self.rules.max_release_late_s * 1e3,
             max_busy_ms=self.max_busy_s * 1e3)
        self.link.stop()
        self.sock.close()
        return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m edge_agent.link.guardian", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fd", type=int, required=True, help="the daemon's socketpair end")
    p.add_argument("--port", required=True, help="tty path or pyserial URL")
    p.add_argument("--robot", required=True, help="robot description (TOML) for the limits")
    p.add_argument("--deadman-ms", type=float, default=50.0,
                   help="daemon silence before the guardian holds")
    p.add_argument("--hold-period-ms", type=float, default=10.0)
    p.add_argument("--fw-deadman-ms", type=int, default=None,
                   help="HELLO deadman_ms (default: twice --deadman-ms, at least 100)")
    p.add_argument("--status-period-us", type=int, default=1000, help="HELLO status_period_us")
    p.add_argument("--baudrate", type=int, default=1_000_000)
    p.add_argument("--write-timeout-ms", type=float, default=5.0)
    p.add_argument("--rx-timeout-ms", type=float, default=100.0,
                   help="3 windows this long without a valid frame: link fault")
    p.add_argument("--open-timeout-ms", type=float, default=2000.0,
                   help="no valid frame this long after opening: link fault")
    p.add_argument("--fault-after", type=int, default=16,
                   help="link.fault_after: this many bad frames in a row: link fault")
    p.add_argument("--reopen-min-s", type=float, default=0.05,
                   help="link.reopen_min_s: first backoff before a faulted port is reopened")
    p.add_argument("--reopen-max-s", type=float, default=2.0,
                   help="link.reopen_max_s: the backoff doubles up to this")
    p.add_argument("--priority", type=int, default=30, help="SCHED_FIFO priority; 0: do not ask")
    p.add_argument("--log-format", choices=("auto", "json", "console"), default="auto",
                   help="the daemon's log.format: auto = console lines on a terminal, else JSON")
    p.add_argument("--start-latched", action="store_true",
                   help="start latched (PROTECTIVE): a restart after a guardian failure")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    _configure_log(args.log_format)
    sock = socket.socket(fileno=args.fd)
    sock.setblocking(False)
    limits = Limits.from_robot(load_robot(args.robot))
    realtime, how = _ask_realtime(args.priority)
    _log("start", port=args.port, realtime=realtime, scheduling=how,
         deadman_ms=args.deadman_ms, start_latched=args.start_latched)
    guardian = Guardian(args, sock, limits, realtime)
    gc.collect()
    gc.freeze()  # start-up objects are never scanned again: shorter collections in the loop
    return guardian.run()


if __name__ == "__main__":
    sys.exit(main())
