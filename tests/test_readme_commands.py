"""The commands README.md and docs/INSTALL.md show work as written, from this checkout.

README's shell blocks run verbatim through bash, in order, against `./scripts/run-sim.sh` — the
simulated daemon README starts. What the test adds, and why (nothing else is changed):

- `./scripts/run-sim.sh` gets `--set state_dir=<tmp> --set mqtt.port=<private broker> --set
  mqtt.password=...`: a state dir of its own (the checkout's var/sim-01 may hold a latch from
  an earlier run) and a private Mosquitto with the documented ACL instead of the machine's
  (README's broker on 1883 may not exist, or may be shared).
- `watch` runs until Ctrl-C: it gets `--port <private broker> --count 1` and the operator's
  login in `$EDGE_AGENT_MQTT_USERNAME/PASSWORD` (the sim device may not read its own state).
- Between lines the test waits for what a person would wait for (the daemon up; the task
  moving before the e-stop), never for a fixed time.

Skipped, with the reason: README_SKIPPED / INSTALL_SKIPPED below. Every `edge-agent` invocation
in both files — README's inline ones too — must parse with the real CLI parser (a documented
option that does not exist fails here), and INSTALL's commands that need neither root, systemd
nor a robot run verbatim.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mosquitto import DEFAULT_ACL, Mosquitto, wait_until

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
INSTALL = REPO / "docs" / "INSTALL.md"
SIM_PASSWORD = "sim-01-test-pw"

README_SKIPPED = {
    "./scripts/test.sh": "runs the whole suite, this test included (CI runs it)",
}
# INSTALL.md: the production install — everything under sudo or systemd needs root and a real
# systemd (PID 1); these need something else this machine does not have
INSTALL_SKIPPED_PREFIXES = {
    "sudo ": "needs root",
    "sudoedit ": "needs root (edits /etc)",
    "systemctl ": "needs systemd as PID 1",
    "journalctl ": "needs systemd as PID 1",
    "printf ": "writes a secret under /etc with sudo",
    "ls -l /dev/serial/by-id/": "needs the robot's serial adapter",
    "/opt/edge-agent/": "needs the software installed under /opt (root)",
    "# ": "a comment",
    "edge-agent model ": "the release side: runs where the release key lives, with edge-agent on "
                         "PATH (tests/test_trust_models.py runs keygen, sign and verify)",
    "edge-agent cmd model.update ": "needs a running robot daemon and a signed model in its drop "
                                    "directory (tests/test_trust_models.py does it on a sim)",
}


def shell_lines(md: Path) -> list[str]:
    """The command lines of every ```sh block (continuations joined, comment-only lines out)."""
    lines: list[str] = []
    for block in re.findall(r"```sh\n(.*?)```", md.read_text(), flags=re.S):
        pending = ""
        for raw in block.splitlines():
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            line = re.sub(r"\s+#\s.*$", "", line)  # a trailing comment (none sits in quotes)
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def edge_agent_argv(line: str) -> list[str] | None:
    """The arguments of an `edge-agent` invocation (after `sudo -u X`, VAR=value), else None."""
    try:
        words = shlex.split(line, comments=True)
    except ValueError:
        return None
    i = 0
    if words[:1] == ["sudo"]:
        i = 1
        while i < len(words) and words[i].startswith("-"):
            i += 2 if words[i] in ("-u", "-g") else 1
    while i < len(words) and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[i]):
        i += 1
    if i < len(words) and (words[i] == "edge-agent" or words[i].endswith("/bin/edge-agent")):
        return words[i + 1:]
    return None


def parses(argv: list[str]) -> str | None:
    """None when the real CLI parser accepts argv, else its error."""
    from edge_agent.cli import _parser

    try:
        _parser().parse_args(argv)
    except SystemExit as exc:
        return f"exit {exc.code}"
    return None


def inline_invocations(md: Path) -> list[str]:
    """Inline commands (`edge-agent check-config configs/sim.toml`); a bare mention of a
    subcommand in the prose (`edge-agent cmd`) is not one."""
    return [m for m in re.findall(r"`([^`\n]+)`", md.read_text())
            if m.startswith(("edge-agent ", ".venv/bin/edge-agent ")) and len(m.split()) > 2]


def test_every_documented_edge_agent_invocation_parses() -> None:
    lines = [*shell_lines(README), *shell_lines(INSTALL), *inline_invocations(README),
             *inline_invocations(INSTALL)]
    invocations = [(ln, argv) for ln in lines if (argv := edge_agent_argv(ln)) is not None]
    assert len(invocations) >= 10, invocations  # the extraction itself works
    bad = [(ln, err) for ln, argv in invocations if (err := parses(argv)) is not None]
    assert not bad, bad


def test_install_commands_that_need_no_root_run_verbatim() -> None:
    ran = []
    for line in shell_lines(INSTALL):
        if any(line.startswith(p) for p in INSTALL_SKIPPED_PREFIXES):
            continue
        if line.startswith("python3 -m pip wheel"):
            continue  # writes dist/ and build/: test_install_wheel_builds runs it in a copy
        out = subprocess.run(["bash", "-c", line], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, (line, out.stdout, out.stderr)
        ran.append((line, out.stdout))
    grep = [o for ln, o in ran if ln.startswith("grep ^ExecStart")]
    assert grep == ["ExecStart=/opt/edge-agent/.venv/bin/edge-agent run --config "
                    "/etc/edge-agent/edge-agent.toml\n"], ran
    # what is left unrun is exactly what the skip list names
    rest = [ln for ln in shell_lines(INSTALL) if not any(
        ln.startswith(p) for p in INSTALL_SKIPPED_PREFIXES)]
    assert {ln.split()[0] for ln in rest} <= {"grep", "python3"}, rest


def test_install_wheel_builds(tmp_path: Path) -> None:
    """INSTALL's build step, verbatim, in a copy of the tracked files (it writes dist/, build/)."""
    (line,) = [ln for ln in shell_lines(INSTALL) if ln.startswith("python3 -m pip wheel")]
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    src = tmp_path / "src"
    for f in filter(None, files):
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((REPO / f).read_bytes())
    out = subprocess.run(["bash", "-c", line], cwd=src, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert list((src / "dist").glob("edge_agent-*.whl")), out.stdout[-2000:]


@pytest.fixture
def sim_broker(tmp_path: Path) -> Iterator[Mosquitto]:
    b = Mosquitto(tmp_path / "mosquitto", {"sim-01": SIM_PASSWORD, "operator": "operator-pw"},
                  acl=DEFAULT_ACL)
    b.start()
    try:
        yield b
    finally:
        b.stop()


class RunSim:
    """`./scripts/run-sim.sh` as README runs it, in the background, output kept."""

    def __init__(self, line: str, tmp: Path, broker: Mosquitto) -> None:
        extra = (f" --set state_dir={tmp / 'state'} --set mqtt.port={broker.port}"
                 f" --set 'mqtt.password=\"{SIM_PASSWORD}\"'")
        self.proc = subprocess.Popen(["bash", "-c", line + extra], cwd=REPO, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     start_new_session=True, env=_env())
        self.lines: list[str] = []
        import threading

        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_AGENT_CONFIG"}
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def _sh(line: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=_env(**env))


def _status() -> dict[str, Any] | None:
    out = _sh(".venv/bin/edge-agent cmd status --json", timeout=30)
    if out.returncode != 0:
        return None
    result: dict[str, Any] = json.loads(out.stdout)["result"]
    return result


@pytest.mark.skipif(not (REPO / ".venv" / "bin" / "edge-agent").exists(),
                    reason="README's commands use .venv/bin/edge-agent (scripts/setup.sh)")
def test_readme_commands_work_as_written_against_the_simulated_daemon(
        tmp_path: Path, sim_broker: Mosquitto) -> None:
    lines = shell_lines(README)
    assert lines[:2] == ["./scripts/run-sim.sh", "./scripts/test.sh"], lines
    sim = RunSim(lines[0], tmp_path, sim_broker)
    try:
        wait_until(lambda: ((s := _status()) is not None and s["link_up"]
                   and s["mqtt_connected"]) or sim.proc.poll() is not None, 120,
                   "run-sim.sh: the daemon up, its link and MQTT connected")
        assert sim.proc.poll() is None, "\n".join(sim.lines[-30:])
        done: list[str] = []
        task_id = None
        for line in lines[1:]:
            if line in README_SKIPPED:
                continue
            argv = edge_agent_argv(line) or []
            if argv[:2] == ["cmd", "estop"]:
                # the e-stop should freeze a moving task (what README's next lines are about)
                wait_until(lambda: (_status() or {}).get("state") not in (None, "idle"), 60,
                           "the task moving")
            if argv[:1] == ["watch"]:
                out = _sh(line + f" --port {sim_broker.port} --count 1", timeout=60,
                          EDGE_AGENT_MQTT_USERNAME="operator",
                          EDGE_AGENT_MQTT_PASSWORD="operator-pw")
                assert out.returncode == 0, (line, out.stdout, out.stderr)
                assert "sim-01" in out.stdout, out.stdout
                done.append("watch")
                continue
            if argv[:2] == ["reports", "list"]:
                # the daemon runs on the test's private state dir (the one addition, as above)
                out = _sh(line + f" --state-dir {tmp_path / 'state'} --json")
                assert out.returncode == 0, (line, out.stdout, out.stderr)
                kinds = [r.get("kind") for r in json.loads(out.stdout)]
                assert "estop" in kinds, out.stdout  # the e-stop above left its report
                done.append("reports")
                continue
            out = _sh(line)
            assert out.returncode == 0, (line, out.stdout, out.stderr,
                                         "\n".join(sim.lines[-30:]))
            reply = json.loads(out.stdout)  # piped: the JSON reply
            assert reply["ok"] is True, (line, reply)
            name = argv[1]
            if name == "task.start":
                task_id = reply["result"]["task_id"]
            if name == "resume":  # no task id given: the one the e-stop froze goes on
                assert reply["result"]["task_id"] == task_id, reply
            if name == "status":
                assert reply["result"]["device"] == "sim-01"
            done.append(name)
        assert done == ["status", "task.start", "estop", "reset", "resume", "watch",
                        "reports"], done
    finally:
        sim.stop()
    assert sim.proc.returncode == 0, "\n".join(sim.lines[-30:])
