"""sd_notify contract with a real daemon and a real AF_UNIX datagram socket as $NOTIFY_SOCKET.

READY=1 only after setup (snapshot restored, link guardian spawned and the tty open); WATCHDOG=1
at most WATCHDOG_USEC/2 apart while healthy; no pings while the control loop hangs (failure
injection) or the link reader gets nothing (the link guardian SIGSTOPped); STOPPING=1 and exit 0
on SIGTERM. "Pings stop" is shown as a silence longer than a bound the healthy stream never
comes near (50 ms nominal period), waited for with a deadline — not a reaction-time assertion.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from daemon_proc import REPO, DaemonProc
from mosquitto import wait_until

from edge_agent.daemon.notify import SystemdNotifier

WATCHDOG_USEC = 2_000_000
HALF = WATCHDOG_USEC / 2e6


class NotifySocket:
    """Receives sd_notify datagrams; each is (host monotonic time, {field: value})."""

    def __init__(self, address: str) -> None:
        self.env_value = address
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind("\0" + address[1:] if address.startswith("@") else address)
        self.sock.settimeout(0.1)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            t = time.monotonic()
            fields = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
            self.messages.append((t, fields))

    def times(self, key: str) -> list[float]:
        return [t for t, f in list(self.messages) if key in f]

    def silent_for(self, key: str, seconds: float) -> bool:
        """No `key` datagram in the last `seconds` (and at least one before)."""
        ts = self.times(key)
        return bool(ts) and time.monotonic() - ts[-1] >= seconds

    def close(self) -> None:
        self._stop.set()
        self._thread.join(2)
        self.sock.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    n = NotifySocket(str(tmp_path / "notify.sock"))
    yield n
    n.close()


def _daemon(tmp_path: Path, notify: NotifySocket, **env: str) -> DaemonProc:
    return DaemonProc(tmp_path, None, env={"NOTIFY_SOCKET": notify.env_value, **env})


def _guardian_pid(daemon_pid: int) -> int | None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            if ppid == daemon_pid and b"edge_agent.link.guardian" in cmd:
                return int(entry)
    return None


def test_ready_comes_only_after_the_snapshot_is_restored_and_the_link_is_open(
        tmp_path: Path, notify: NotifySocket) -> None:
    # a first run latches an e-stop and stops cleanly: the snapshot holds the latch
    first = DaemonProc(tmp_path, None).start()
    try:
        first.wait_ready()
        assert first.socket_cmd("estop")["ok"]
    finally:
        assert first.stop() == 0
    d = _daemon(tmp_path, notify).start()
    try:
        wait_until(lambda: bool(notify.times("READY")), 60, "READY=1")
        t_ready, fields = next(m for m in notify.messages if "READY" in m[1])
        assert notify.messages[0][1].get("READY") == "1", "something came before READY"
        assert d.proc is not None and fields["MAINPID"] == str(d.proc.pid)
        # the snapshot was restored before READY: READY already reports the latched e-stop
        assert "mode estop" in fields["STATUS"], fields
        # the guardian was spawned and opened the tty before READY: its HELLO reached the robot
        hello = d.rig({"cmd": "record", "type": "HELLO"})["frames"]
        assert hello and hello[0]["t"] < t_ready
        print(f"HELLO reached the rig {1e3 * (t_ready - hello[0]['t']):.1f} ms before READY")
    finally:
        d.stop()


def test_watchdog_pings_stop_on_a_hung_loop_or_reader_and_sigterm_stops_cleanly(
        tmp_path: Path) -> None:
    notify = NotifySocket(f"@edge-agent-test-{os.getpid()}-{time.monotonic_ns()}")
    d = _daemon(tmp_path, notify, WATCHDOG_USEC=str(WATCHDOG_USEC)).start()
    guardian: int | None = None
    try:
        d.wait_ready()
        assert d.proc is not None
        # healthy: pings at most WATCHDOG_USEC/2 apart over 3 s
        wait_until(lambda: bool(notify.times("WATCHDOG")), 30, "first WATCHDOG=1")
        t0 = notify.times("WATCHDOG")[0]
        wait_until(lambda: notify.times("WATCHDOG")[-1] - t0 >= 3.0, 30, "3 s of pings")
        pings = [t for t in notify.times("WATCHDOG") if t <= t0 + 3.0]
        gaps = [b - a for a, b in itertools.pairwise(pings)]
        print(f"healthy: {len(pings)} pings in 3 s, max gap {1e3 * max(gaps):.0f} ms "
              f"(bound {HALF * 1e3:.0f} ms)")
        assert max(gaps) <= HALF

        # the control loop hangs: silence for a whole WatchdogSec (systemd would kill us)
        r = d.socket_cmd("failure.inject", {"target": "control_loop", "mode": "hang"})
        assert r["ok"], r
        wait_until(lambda: notify.silent_for("WATCHDOG", 2 * HALF), 20,
                   "pings to stop while the control loop hangs")
        n = len(notify.times("WATCHDOG"))
        r = d.socket_cmd("failure.inject", {"target": "control_loop", "mode": "release"})
        assert r["ok"], r
        wait_until(lambda: len(notify.times("WATCHDOG")) > n + 5, 20, "pings after release")

        # the link reader gets nothing: the guardian is frozen (SIGSTOP), not dead
        guardian = _guardian_pid(d.proc.pid)
        assert guardian is not None
        os.kill(guardian, signal.SIGSTOP)
        wait_until(lambda: notify.silent_for("WATCHDOG", HALF), 20,
                   "pings to stop while the link reader gets no frames")
        n = len(notify.times("WATCHDOG"))
        # the guardian client kills the hung guardian and starts another: pings come back
        wait_until(lambda: len(notify.times("WATCHDOG")) > n + 5, 30,
                   "pings after the guardian was replaced")
        assert _guardian_pid(d.proc.pid) not in (None, guardian)

        t_term = time.monotonic()
        os.kill(d.proc.pid, signal.SIGTERM)
        rc = d.proc.wait(20)
        took = time.monotonic() - t_term
        print(f"SIGTERM -> exit {rc} in {took * 1e3:.0f} ms")
        assert rc == 0
        assert notify.times("STOPPING"), "no STOPPING=1"
        assert took < 10.0  # the target is 2 s; generous here (a loaded shared machine)
    finally:
        if guardian is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(guardian, signal.SIGCONT)
        d.stop()
        notify.close()


def test_a_service_manager_that_does_not_read_never_blocks_the_sender(tmp_path: Path) -> None:
    """A full datagram queue costs counted errors, not a hung main loop (found by the
    start-up bench: 20 Hz pings into an unread socket hung the daemon's SIGTERM handling)."""
    path = str(tmp_path / "deaf.sock")
    deaf = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    deaf.bind(path)
    n = SystemdNotifier(path)
    sent: list[bool] = []
    t = threading.Thread(target=lambda: sent.extend(n.watchdog() for _ in range(5000)),
                         daemon=True)
    t.start()
    t.join(30)
    try:
        assert not t.is_alive(), "notify() blocked on a full queue"
        assert len(sent) == 5000 and n.errors > 0 and sent.count(False) == n.errors
    finally:
        n.close()
        deaf.close()


def test_the_cli_starts_the_guardian_beside_the_imports_and_the_daemon_adopts_it(
        tmp_path: Path, notify: NotifySocket) -> None:
    """Without --sim (a real tty path) the guardian is spawned right after the config, before
    logging and the daemon's imports; the daemon adopts that process — one guardian, not two —
    and READY still comes only after its first link-up."""
    from edge_agent.daemon.simrig import start_sim_rig

    rig = start_sim_rig(REPO / "configs" / "robot" / "edge-arm-4.toml", tmp_path, seed=3)
    try:
        d = _daemon(tmp_path, notify)
        d.cmd.remove("--sim")
        d.cmd += ["--set", f"link.port={rig.ptys[0]}"]
        d.start()
        try:
            ready = d.wait_ready()
            ph = ready["phases_ms"]
            assert ph["config"] <= ph["guardian_early"] <= ph["logging"] <= ph["daemon_import"]
            assert ready["link_up"] is True and ph["link_up"] <= ready["startup_ms"]
            started = d.events("guardian_started")
            assert [e["early"] for e in started] == [True], started
            assert d.proc is not None and _guardian_pid(d.proc.pid) == started[0]["pid"]
            assert d.socket_cmd("status")["result"]["link_up_ms"] is not None
        finally:
            assert d.stop(signal.SIGTERM) == 0
        assert d.proc is not None and _guardian_pid(d.proc.pid) is None
    finally:
        rig.stop()


def _guardians_on(tty: str) -> list[int]:
    out = []
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        with contextlib.suppress(OSError):
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"edge_agent.link.guardian" in cmd and tty.encode() in cmd.split(b"\0"):
                out.append(int(pid))
    return out


def test_a_start_up_failure_after_the_early_spawn_leaves_no_guardian_behind(
        tmp_path: Path) -> None:
    from edge_agent.comms.control_socket import SOCKET_NAME
    from edge_agent.config import load_config
    from edge_agent.daemon.app import Daemon
    from edge_agent.daemon.simrig import start_sim_rig
    from edge_agent.link.guardian_spawn import spawn, spec_from_config

    rig = start_sim_rig(REPO / "configs" / "robot" / "edge-arm-4.toml", tmp_path, seed=4)
    try:
        tty = rig.ptys[0]
        # 1. in the daemon process: a regular file where the control socket goes — start-up
        #    fails after the guardian was adopted; the exit takes the guardian along
        state = tmp_path / "state"
        state.mkdir(mode=0o700)
        (state / SOCKET_NAME).write_text("not a socket\n")
        d = DaemonProc(tmp_path, None, extra=(f"link.port={tty}",))
        d.cmd.remove("--sim")
        d.start()
        wait_until(d.exited, 60, "the daemon gives up")
        assert d.proc is not None and d.proc.returncode == 1
        assert any("not a socket" in line for line in d.lines), d.lines[-10:]
        assert [e["early"] for e in d.events("guardian_started")] == [True]
        assert _guardians_on(tty) == [], "an orphaned guardian still holds the tty"
        # 2. a daemon that never got as far as adopting its early guardian stops it
        cfg = load_config(REPO / "configs" / "sim.toml",
                          [f"state_dir={tmp_path / 'state2'}", f"link.port={tty}"])
        early = spawn(spec_from_config(cfg, tty))
        try:
            assert early.proc.poll() is None
            wait_until(lambda: _guardians_on(tty) == [early.proc.pid], 10, "the early guardian")
            Daemon(cfg, prespawned=early).stop()
            assert early.proc.poll() is not None and _guardians_on(tty) == []
        finally:  # never leave it holding a pty number the next test's rig may get
            early.abandon()
    finally:
        rig.stop()
