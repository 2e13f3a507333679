"""The daemon's side of the link guardian: spawn it, talk to it over a socketpair, restart it.

    client = GuardianClient(config.link.port, robot_path, deadman_s=0.05,
                            on_frame=reader,             # every frame from the guardian
                            on_guardian_down=on_lost,    # (reason: str): enter a protective stop
                            on_guardian_up=on_started)   # (): after every (re)start
    client.start()
    client.send(Command(...))      # thread-safe; LinkError while the guardian is down
                                   # (COMMANDs before its first G_STATE are dropped, counted)
    client.reset()                 # G_RESET; the answer is a G_STATE
    client.stop()                  # idempotent: SIGTERM (the guardian holds), then kill

`on_frame` runs on the client's reader thread (the daemon's link reader) for every frame: the
firmware's frames relayed unchanged (STATUS, ESTOP_EDGE, SENSOR, HELLO_ACK, PONG, EVENT) and the
guardian's G_STATE (on every change and every second; `latched`, `estop_input`, `deadman_hold`,
`link_up`, `cause` a StopReason, `flags` a GuardianFlag). Mirror the latch from it at once.
A refused G_RESET is answered by one G_STATE with `cause=RESET_REFUSED`. Also readable at any
time: `ready`, `alive`, `pid`, `restarts`, `last_state`, `dropped_before_ready`.

The guardian is restarted (backoff 0.1 s … 5 s) when it exits, or when it sends no G_STATE for
`heartbeat_timeout_s` (it is then killed). A restarted guardian starts latched (PROTECTIVE), so the
wire stays stopped until the daemon's reset, and the tty's e-stop input is read again before any
reset can pass. Callbacks must be quick and must not call `stop()`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from edge_agent.errors import LinkError
from edge_agent.link.codec import (
    Command,
    Frame,
    FrameDecoder,
    GAt,
    GReset,
    GState,
    Message,
    SeqCounter,
    encode,
)
from edge_agent.link.guardian_spawn import GuardianSpec, Spawned, spawn
from edge_agent.link.serial_link import Backoff
from edge_agent.log import get_logger

_log = get_logger(__name__)


def _nothing(*_: object) -> None:
    return None


class GuardianClient:
    """Owns one guardian process at a time and the daemon's end of its socketpair."""

    def __init__(self, port: str, robot_path: str | Path, deadman_s: float = 0.05, *,
                 on_frame: Callable[[Frame], None],
                 on_guardian_down: Callable[[str], None] = _nothing,
                 on_guardian_up: Callable[[], None] = _nothing,
                 priority: int = 30, extra_args: Sequence[str] = (),
                 heartbeat_timeout_s: float = 3.0, send_timeout_s: float = 0.25,
                 restart_min_s: float = 0.1, restart_max_s: float = 5.0,
                 stderr: int | None = None, reader_priority: int = 0) -> None:
        self.port = port
        self.robot_path = str(robot_path)
        self.deadman_s = deadman_s
        self.priority = priority
        self.extra_args = tuple(extra_args)
        self.spec = GuardianSpec(port, robot_path, deadman_s, priority, extra_args)
        self.reader_priority = reader_priority  # SCHED_FIFO for the reader thread; 0 = none
        self.reader_scheduling = "SCHED_OTHER"  # what the reader thread really got
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.send_timeout_s = send_timeout_s
        self.stderr = stderr  # where the guardian's JSON log lines go (default: ours)
        self._on_frame, self._on_down, self._on_up = on_frame, on_guardian_down, on_guardian_up
        self._backoff = Backoff(restart_min_s, restart_max_s)
        self._seq = SeqCounter()
        self._send_lock = threading.Lock()
        self._stopping = threading.Event()
        self._sock: socket.socket | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name="guardian-reader", daemon=True)
        self.restarts = 0
        self.dropped_before_ready = 0
        self._ready = False  # the current guardian has sent its first G_STATE
        self.last_state: GState | None = None
        self._started_at = self._last_state_at = time.monotonic()

    # -- API -------------------------------------------------------------------------------
    def start(self, prespawned: Spawned | None = None) -> GuardianClient:
        """Spawn the guardian (its first attempt to open the tty) and start the reader thread.

        `prespawned`: adopt a guardian the CLI already started with the same spec (an early
        start beside the daemon's imports); one with another spec is stopped and replaced."""
        if prespawned is not None and prespawned.spec.key() != self.spec.key():
            _log.warning("guardian_prespawned_mismatch", port=prespawned.spec.port)
            prespawned.abandon()
            prespawned = None
        self._spawn(restart=False, prespawned=prespawned)
        self._thread.start()
        return self

    def send(self, msg: Message) -> None:
        """Send one frame to the guardian; LinkError when it is down or does not take it.

        Until a new guardian's first G_STATE (it is still starting and reads nothing) COMMAND
        frames are dropped and counted (`dropped_before_ready`): a 200 Hz stream would fill the
        socket and block the caller; the stream's next COMMAND follows anyway. Other frames
        (STOP, ENABLE, G_RESET, …) wait in the socket for it.
        """
        if not self._ready and isinstance(msg, Command | GAt):
            self.dropped_before_ready += 1
            return
        with self._send_lock:
            sock = self._sock
            if sock is None:
                raise LinkError("the link guardian is not running")
            try:
                sock.sendall(encode(msg, self._seq.next()))
            except OSError as exc:  # timeout, EPIPE, closed under us
                raise LinkError(f"send to the link guardian failed: {exc}") from exc

    def reset(self) -> None:
        """Ask the guardian to clear its latch (refused while the e-stop input is active)."""
        self.send(GReset())

    @property
    def pid(self) -> int | None:
        proc = self._proc
        return proc.pid if proc is not None else None

    @property
    def ready(self) -> bool:
        """The current guardian is running and has sent its first G_STATE."""
        return self._ready and self._sock is not None

    @property
    def alive(self) -> bool:
        proc = self._proc
        return proc is not None and proc.poll() is None and self._sock is not None

    def stop(self, timeout_s: float = 2.0) -> None:
        """Stop the guardian (it holds and exits) and the reader; idempotent, never raises."""
        self._stopping.set()
        try:
            self._end_process(timeout_s)
            if self._thread.is_alive() and self._thread is not threading.current_thread():
                self._thread.join(timeout=timeout_s)
        except Exception:  # stop() must never raise
            _log.exception("guardian_stop_failed")

    # -- internals -------------------------------------------------------------------------
    def _spawn(self, *, restart: bool, prespawned: Spawned | None = None) -> None:
        spawned = prespawned or spawn(self.spec, restart=restart, stderr=self.stderr)
        spawned.sock.settimeout(self.send_timeout_s)
        self._proc = spawned.proc
        self._ready = False
        self._sock = spawned.sock
        self._started_at = spawned.started_at
        self._last_state_at = self._started_at
        _log.info("guardian_started", pid=spawned.proc.pid, port=self.port, restart=restart,
                  early=prespawned is not None)

    def _set_reader_priority(self) -> None:
        """SCHED_FIFO for this thread alone (Linux: pid 0 is the calling thread).

        The reader holds the GIL for each frame it decodes (1 kHz). Preempted in the middle by
        an ordinary process, it kept the control thread — SCHED_FIFO, waiting for the GIL —
        waiting too; at a real-time priority just below the control thread's it finishes its
        few microseconds first. Refused (no CAP_SYS_NICE / RLIMIT_RTPRIO): it runs anyway."""
        if self.reader_priority <= 0:
            return
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(self.reader_priority))
            self.reader_scheduling = f"SCHED_FIFO {self.reader_priority}"
        except (OSError, AttributeError) as exc:
            self.reader_scheduling = (f"SCHED_OTHER (SCHED_FIFO {self.reader_priority} "
                                      f"refused: {exc})")
            _log.warning("reader_priority_refused", priority=self.reader_priority,
                         error=str(exc))

    def _run(self) -> None:
        self._set_reader_priority()
        while True:
            reason = self._read_until_gone()
            self._end_process(1.0)
            if self._stopping.is_set():
                return
            _log.warning("guardian_lost", reason=reason)
            self._call(self._on_down, reason)
            if time.monotonic() - self._started_at > 10.0:
                self._backoff.reset()
            if self._stopping.wait(self._backoff.next()):
                return
            try:
                self._spawn(restart=True)
            except LinkError as exc:
                self._started_at = time.monotonic()
                _log.error("guardian_restart_failed", error=str(exc))
                continue
            self.restarts += 1
            self._call(self._on_up)

    def _read_until_gone(self) -> str:
        sock = self._sock
        if sock is None:
            return "not started"
        decoder = FrameDecoder()
        while not self._stopping.is_set():
            try:
                data = sock.recv(65536)
            except TimeoutError:
                if time.monotonic() - self._last_state_at > self.heartbeat_timeout_s:
                    return f"no G_STATE for {self.heartbeat_timeout_s:g} s (hung)"
                continue
            except OSError as exc:
                return f"socket error: {exc}"
            if not data:
                proc = self._proc
                try:
                    rc = proc.wait(timeout=1.0) if proc is not None else None
                except subprocess.TimeoutExpired:
                    rc = None
                return f"exited (rc={rc})"
            for frame in decoder.feed(data):
                if isinstance(frame.msg, GState):
                    self.last_state = frame.msg
                    self._last_state_at = time.monotonic()
                    self._ready = True
                self._call(self._on_frame, frame)
        return "stopping"

    def _end_process(self, timeout_s: float) -> None:
        with self._send_lock:
            sock, self._sock = self._sock, None
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.terminate()  # SIGTERM: the guardian writes a hold and exits
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()

    def _call(self, fn: Callable[..., None], *args: object) -> None:
        try:
            fn(*args)
        except Exception:  # a daemon callback bug must not kill the link reader
            _log.exception("guardian_callback_failed", callback=getattr(fn, "__name__", "?"))
