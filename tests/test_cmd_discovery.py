"""`edge-agent cmd` finds the running daemon without a config; replies and logs read well.

A real daemon (`run --sim`) publishes `<device>.sock` in the runtime directory (conftest points
EDGE_AGENT_RUNTIME_DIR at a private one); `cmd` run from elsewhere, without --config or
$EDGE_AGENT_CONFIG, reaches it. Terminal output is read from a real pty.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from daemon_proc import SIM_CONFIG, DaemonProc
from mosquitto import wait_until

REPO = Path(__file__).resolve().parents[1]
CLI = [sys.executable, "-m", "edge_agent.cli"]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("EDGE_AGENT_CONFIG", "NO_COLOR")}
    return {**env, "TERM": "xterm", **extra}


def cli(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env=_env(**env))


def cli_on_a_terminal(*args: str, cwd: Path, **env: str) -> tuple[int, str]:
    """Run with stdout and stderr on a real pty; exit code and what the terminal shows."""
    master, slave = os.openpty()
    try:
        proc = subprocess.Popen([*CLI, *args], cwd=cwd, stdout=slave, stderr=slave,
                                env=_env(**env))
        os.close(slave)
        slave = -1
        chunks = []
        while True:
            ready, _, _ = select.select([master], [], [], 60)
            if not ready:
                break
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        rc = proc.wait(60)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    return rc, b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProc]:
    d = DaemonProc(tmp_path_factory.mktemp("daemon"), None).start()
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 60, "link up")
        yield d
    finally:
        d.stop()


def test_cmd_finds_the_one_running_daemon_without_a_config(
        daemon: DaemonProc, tmp_path: Path, private_runtime_dir: Path) -> None:
    assert (private_runtime_dir / "dev1.sock").is_symlink()
    out = cli("cmd", "status", cwd=tmp_path)  # no --config, no $EDGE_AGENT_CONFIG
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["result"]["device"] == "dev1"  # piped: JSON
    out = cli("status", "--json", cwd=tmp_path)
    assert out.returncode == 0 and json.loads(out.stdout)["result"]["device"] == "dev1"


def test_with_several_daemons_cmd_names_them_and_device_picks_one(
        daemon: DaemonProc, tmp_path: Path, private_runtime_dir: Path) -> None:
    other = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a second daemon's socket
    other.bind(str(tmp_path / "control.sock"))
    other.listen(4)
    link = private_runtime_dir / "dev9.sock"
    os.symlink(tmp_path / "control.sock", link)
    try:
        out = cli("cmd", "status", cwd=tmp_path)
        assert out.returncode == 2, out.stdout
        assert "several daemons run here (dev1, dev9)" in out.stderr, out.stderr
        assert "--device" in out.stderr
        out = cli("cmd", "status", "--device", "dev1", cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["result"]["device"] == "dev1"
    finally:
        link.unlink()
        other.close()


def test_status_on_a_terminal_reads_like_systemctl_status_with_colour(
        daemon: DaemonProc, tmp_path: Path) -> None:
    rc, text = cli_on_a_terminal("cmd", "status", cwd=tmp_path)
    assert rc == 0, text
    assert not text.lstrip().startswith("{"), text  # not the JSON reply
    plain = _strip_ansi(text)
    lines = plain.splitlines()
    assert lines[0].startswith("● dev1 - edge-agent (simulated robot)"), plain
    for field in ("Mode: idle", "Stop: none", "Degraded: none", "Link: up", "Policy:",
                  "Loop: 200 Hz", "MQTT: not connected", "Uptime:"):
        assert any(ln.strip().startswith(field) for ln in lines), (field, plain)
    assert "target ≤ 0.5" in plain and "SCHED_" in plain
    assert "\x1b[" in text  # colour on a terminal
    rc, text = cli_on_a_terminal("cmd", "status", cwd=tmp_path, NO_COLOR="1")
    assert rc == 0 and "\x1b[" not in text and "Mode: idle" in text, text


def test_a_task_start_reply_says_the_task_id_plainly(daemon: DaemonProc, tmp_path: Path) -> None:
    rc, text = cli_on_a_terminal("cmd", "task.start", '{"task": "pick_place", "id": "job-77"}',
                                 cwd=tmp_path, NO_COLOR="1")
    assert rc == 0, text
    assert text.splitlines()[0] == "task job-77 started", text
    rc, text = cli_on_a_terminal("cmd", "estop", cwd=tmp_path, NO_COLOR="1")
    assert rc == 0 and text.startswith("e-stop latched"), text
    rc, text = cli_on_a_terminal("cmd", "status", cwd=tmp_path, NO_COLOR="1")
    assert "Stop: e-stop, cause estop_local" in text, text
    rc, text = cli_on_a_terminal("cmd", "resume", '{"task_id": "job-0"}', cwd=tmp_path,
                                 NO_COLOR="1")
    assert rc == 1 and text.startswith("refused: resume:"), text
    assert daemon.socket_cmd("reset")["ok"]


def test_guardian_log_lines_are_json_lines_like_the_daemons_when_piped(
        daemon: DaemonProc) -> None:
    starts = [e for e in daemon.events("start") if e.get("logger") == "edge_agent.link.guardian"]
    assert starts, "\n".join(daemon.lines[:20])
    rec = starts[0]
    assert rec["level"] == "info" and "realtime" in rec
    datetime.fromisoformat(rec["ts"].replace("Z", "+00:00"))  # the daemon's ts format


def test_a_daemon_killed_leaves_a_stale_pointer_that_cmd_reports(
        tmp_path: Path, private_runtime_dir: Path) -> None:
    d = DaemonProc(tmp_path, None, device="dev5").start()
    try:
        d.wait_ready()
        assert (private_runtime_dir / "dev5.sock").is_symlink()
    finally:
        d.stop(signal.SIGKILL)
    out = cli("cmd", "status", "--device", "dev5", cwd=tmp_path)
    assert out.returncode == 2
    assert "no running daemon 'dev5': its socket does not answer" in out.stderr, out.stderr
    with contextlib.suppress(FileNotFoundError):
        (private_runtime_dir / "dev5.sock").unlink()


def test_a_daemon_stopped_cleanly_removes_its_pointer(tmp_path: Path,
                                                      private_runtime_dir: Path) -> None:
    d = DaemonProc(tmp_path, None, device="dev6").start()
    try:
        d.wait_ready()
        assert (private_runtime_dir / "dev6.sock").is_symlink()
    finally:
        assert d.stop() == 0
    assert not os.path.lexists(private_runtime_dir / "dev6.sock")


def test_in_the_foreground_the_guardian_logs_console_lines_like_the_daemon(
        tmp_path: Path) -> None:
    """On a terminal, every line — daemon and guardian — is a console line, none raw JSON."""
    master, slave = os.openpty()
    cmd = [*CLI, "run", "--config", str(SIM_CONFIG), "--sim", "--set",
           f"state_dir={tmp_path / 'state'}", "--set", "device.id=dev7", "--set", "mqtt.port=1"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=slave, stderr=slave, env=_env(NO_COLOR="1"),
                            start_new_session=True)
    os.close(slave)
    text: list[str] = []

    def read() -> None:
        with contextlib.suppress(OSError):
            while data := os.read(master, 65536):
                text.append(data.decode(errors="replace"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        wait_until(lambda: "guardian.start" in "".join(text) and "] ready " in "".join(text), 60,
                   "the guardian's start line and the daemon's ready line")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        reader.join(10)
        os.close(master)
    lines = [ln for ln in "".join(text).replace("\r\n", "\n").splitlines() if ln.strip()]
    log_lines = [ln for ln in lines if not ln.startswith("rig:")]  # the simulated robot's own
    assert not [ln for ln in log_lines if ln.lstrip().startswith("{")], log_lines
    guardian = [ln for ln in log_lines if "guardian.start" in ln and "realtime=" in ln]
    assert guardian and guardian[0][:4].isdigit() and "[info" in guardian[0], log_lines


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", text)
