"""Every shell command README.md and docs/*.md show runs as written here, or parses with its
real parser and names why it cannot run here.

tests/doc_commands.py finds them: fenced sh/bash/console/shell blocks (and untagged ones that
are shell), inline commands (`edge-agent …`, `python3 -m …`, `sudo …`, `./scripts/…`, `pip …`),
and options-only spans that add arguments to the `python -m` module named before them. Nothing
is listed by hand, so a command someone documents tomorrow is covered too. Each one:

- is classified by RULES below: run by one of the tests here, or skipped with its reason (a
  robot's tty, systemd as PID 1, root, a benchmark that runs for minutes). A command no rule
  covers fails `test_every_documented_command_is_run_or_has_a_reason`;
- every `edge-agent` and `python -m MODULE` invocation in it — skipped ones included — is parsed
  with the program's own argparse parser, exact arguments, without running it
  (tests/doc_argv_check.py); a synopsis (`[--n 100] [--faults …]`) has each option it names
  checked; a subcommand named in the prose (`edge-agent cmd`) must exist;
- every `pip install` is checked for what it would install: requirements that parse, extras
  that exist, no glob inside quotes, never onnxruntime and onnxruntime-gpu together.

What runs, and the one thing each run adds (nothing else is changed):
- README's session against `./scripts/run-sim.sh`: the daemon gets `--set state_dir=<tmp>
  --set mqtt.port=<private broker> --set mqtt.password=...` (the checkout's var/sim-01 may hold
  a latch from an earlier run; README's broker on 1883 may not exist or may be shared); `watch`
  gets `--port <private broker> --count 1` and the operator's login in the environment;
  `reports list` gets the private `--state-dir` and `--json`. Between lines the test waits for
  what a person would (the daemon up, the task moving), never for a fixed time.
- Commands that need nothing but the checkout (`check-config`, `doctor` on the sim config,
  `grep`): verbatim in the repository root, `.venv/bin` first on PATH (the docs' bare
  `edge-agent` is the installed console script).
- INSTALL's wheel build in a copy of the tracked files (it writes dist/ and build/), then its
  `pip install dist/…` lines with `--dry-run --no-deps --no-index` (the glob must expand).
- INSTALL's release-key block (keygen, sign, verify) in a scratch directory with a copy of
  models/; verify's placeholder `ed25519:...` becomes the key keygen printed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from doc_commands import DocCommand, Invocation, discover, invocations, is_synopsis
from mosquitto import DEFAULT_ACL, Mosquitto, wait_until
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
SIM_PASSWORD = "sim-01-test-pw"

SIM = "run: README's session on the simulated robot (test_readme_commands_work_as_written_...)"
HERE = "run: verbatim here (test_documented_commands_that_need_only_the_checkout_run)"
WHEEL = "run: in a copy of the checkout (test_install_wheel_builds_and_its_installs_resolve)"
MODEL = "run: in a scratch directory (test_install_release_key_block_runs)"
_BENCH = ("a benchmark: minutes of load on this machine, printing figures, not a test (its "
          "documented arguments are parsed with its own parser)")
_DAEMON = ("needs a running daemon (README's session runs cmd status, task.start, estop, reset, "
           "resume and watch against the simulated one)")
_ROBOT_PATHS = ("reads the robot's default config /etc/edge-agent/edge-agent.toml or its state "
                "in /var/lib/edge-agent, absent here")

# (where, pattern, verdict): the first rule whose `where` ("" any; "README.md", or with
# ":block" a fenced block of that file) and pattern (re.search on the command line) match
# decides. A verdict not starting with "run:" is why the command cannot run here.
RULES: list[tuple[str, str, str]] = [
    ("README.md:block", r"^\./scripts/run-sim\.sh$", SIM),
    ("README.md:block", r"^\.venv/bin/edge-agent (cmd|watch|reports list) ", SIM),
    ("", r"^\./scripts/test\.sh\b", "runs the whole suite, this test included (CI runs it)"),
    ("", r"^\./scripts/setup\.sh\b", "installs apt packages and rebuilds the shared .venv"),
    ("", r"(^|[|;&]\s*)(sudo|sudoedit)\b",
     "needs root (writes under /etc, /opt or /var/lib, or runs as the service user)"),
    ("", r"^(systemctl|journalctl|systemd-analyze)\b",
     "needs systemd as PID 1 and the installed unit (tests/test_systemd_unit.py checks the unit)"),
    ("", r"^ls -l /dev/serial/", "needs the robot's USB serial adapter"),
    ("", r"^/opt/edge-agent/", "needs the software installed under /opt/edge-agent (§3, root)"),
    ("", r"^python3? -m pip wheel\b", WHEEL),
    ("docs/INSTALL.md:block", r"^edge-agent model (keygen|sign|verify) ", MODEL),
    ("", r"^edge-agent model gate ",
     "hundreds of lock-step episodes (minutes of CPU): tests/test_gate.py and "
     "tests/test_gate_daemon.py run it on a few episodes of a few fault classes"),
    ("", r"^(\.venv/bin/)?edge-agent model status\b", _DAEMON),
    ("", r"^edge-agent model shadow\b",
     "needs a running daemon with a model and the candidate in inference.update_dir "
     "(tests/test_shadow_daemon.py runs it against one)"),
    ("", r"^(\.venv/bin/)?edge-agent record\b",
     "needs a running daemon or its state dir (tests/test_recorder_daemon.py runs record "
     "start, stop and list against one)"),
    ("", r"^python3? -m hil\.shadow_doc\b",
     "a real daemon's tasks with a shadow candidate, appended to docs/REPORTS.md (minutes)"),
    ("", r"^edge-agent model ", "names placeholder files (policy.onnx, ed25519:...): INSTALL.md "
                                "§4's block runs keygen, sign and verify"),
    ("", r"^(\.venv/bin/)?edge-agent check-config (?!/etc/)", HERE),
    ("", r"^(\.venv/bin/)?edge-agent doctor --config configs/", HERE),
    ("", r"^(\.venv/bin/)?edge-agent version$", HERE),
    ("", r"^grep ", HERE),
    ("", r"^python3? -m edge_agent\.contract\.asyncapi --check$", HERE),
    ("", r"^python3? -m edge_agent\.contract\.asyncapi --write$",
     "rewrites docs/asyncapi.yaml's generated block (tests/test_contract.py runs the same code "
     "on a copy; --check runs here)"),
    ("", r"^(\.venv/bin/)?edge-agent (cmd|status|watch)\b", _DAEMON),
    ("", r"^(\.venv/bin/)?edge-agent fleet\b",
     "needs a broker with running daemons (and, for a rollout, the model in their update_dir): "
     "tests/test_fleet_daemons.py runs status, rollout and estop against five"),
    ("", r"^(\.venv/bin/)?edge-agent run\b",
     "starts the daemon, which runs until stopped (README's ./scripts/run-sim.sh session runs it)"),
    ("", r"^(\.venv/bin/)?edge-agent (doctor|check-config|reports|journal)\b", _ROBOT_PATHS),
    ("", r"^python3? -m hil\.bench --list$", HERE),
    ("", r"^python3? -m hil\.bench_page\b",
     "rewrites docs/PERFORMANCE.md and docs/perf/ from the newest hil/results JSON "
     "(tests/test_bench_runner.py renders a fixture JSON into a scratch directory)"),
    ("", r"^python3? -m hil\.bench\b", _BENCH),
    ("", r"^python3? -m hil\.(bench_|sim\.bench\b|kalman_rmse\b)", _BENCH),
    ("", r"^python3? -m hil\.footprint\b", _BENCH),
    ("", r"^python3? -m hil\.foxglove_layout\b",
     "rewrites docs/foxglove/edge-agent-live.json (tests/test_liveview.py checks the file is "
     "what it writes)"),
    ("", r"^python3? -m hil\.episodes\b", "1,000 lock-step episodes: minutes of CPU, a benchmark"),
    ("", r"^python3? -m hil\.make_reports_doc\b",
     "regenerates docs/REPORTS.md and docs/reports/ from five real daemon runs (minutes)"),
    ("", r"^python3? -m hil\.rig\b",
     "runs the simulated robot until stopped (README's run-sim.sh session starts it)"),
    ("", r"^python3? -m hil\.guardian_freeze_loop\b",
     "freezes the guardian under CPU load for minutes, a reproduction loop "
     "(tests/test_guardian_freeze.py and tests/test_deadman_e2e.py are its tests)"),
    ("", r"^python3? -m hil\.load_lerobot\b",
     "needs lerobot and torch (~8 GB), not in the project's environment: "
     "tests/test_journal_export.py runs it where $EDGE_AGENT_LEROBOT_PYTHON names one"),
    ("", r"^python3? -m hil\.policy_loop\b",
     "two gates (minutes of lock-step episodes each) and a real daemon's shadow and trial tasks: "
     "~12 minutes, a benchmark (tests/test_gate*.py, test_shadow_daemon.py and "
     "test_model_trial_daemon.py run each step)"),
    ("", r"^python3? -m hil\.flywheel\b",
     "a real daemon's 200 tasks, labels, export, fine-tune and evaluation: most of an hour, a "
     "benchmark (tests/test_finetune_policy.py runs the fine-tune on a small export)"),
    ("", r"^python3? -m hil\.gate_power\b", _BENCH),
    ("", r"^python3? -m hil\.(soak|gc_pauses)\b",
     "a real daemon under faults for up to an hour (hil.soak) or tens of tasks beside busy "
     "processes (hil.gc_pauses): benchmarks; tests/test_soak_verdict.py checks the soak's "
     "verdicts and Markdown"),
    ("", r"^python3? models/make_bad_candidate\.py\b",
     "13 demonstration episodes and a fine-tune (a minute): tests/test_gate.py runs it"),
    ("", r"^python3? models/train_policy\.py\b",
     "trains from ~200 lock-step episodes: ~10 minutes of CPU, a benchmark "
     "(tests/test_train_skip_class.py checks --skip-class)"),
    ("", r"^python3? models/finetune_policy\.py\b",
     "needs an exported dataset and minutes of held-out episodes: tests/test_finetune_policy.py "
     "runs it on a three-episode export"),
    ("", r"^pip install\b", "changes this Python environment (the GPU swap installs a CUDA "
                            "package); test_documented_pip_installs checks what it installs"),
]


def verdict(c: DocCommand) -> str | None:
    text = f"python -m {c.module} {c.text}" if c.module else c.text
    where = {"", c.doc, f"{c.doc}:block" if c.block else c.doc}
    return next((v for w, pat, v in RULES if w in where and re.search(pat, text)), None)


COMMANDS = discover()


def _of(kind: str) -> list[DocCommand]:
    return [c for c in COMMANDS if verdict(c) == kind]


def test_discovery_finds_the_documented_commands() -> None:
    """The extraction itself works: blocks, inline spans, options-only spans, every doc."""
    texts = {(c.doc, c.text) for c in COMMANDS}
    assert ("README.md", "./scripts/run-sim.sh") in texts, texts
    assert ("docs/INSTALL.md", "grep ^ExecStart systemd/edge-agent.service") in texts
    assert any(c.doc == "README.md" and not c.block and c.text.startswith("edge-agent check-config")
               for c in COMMANDS)
    assert any(c.module == "hil.bench_degraded" for c in COMMANDS), COMMANDS
    assert {c.doc for c in COMMANDS} >= {"README.md", "docs/INSTALL.md", "docs/HEALTH.md",
                                         "docs/REPORTS.md"}
    assert len(COMMANDS) >= 80, len(COMMANDS)


def test_discovery_rules_on_a_sample(tmp_path: Path) -> None:
    sample = tmp_path / "sample.md"
    sample.write_text(
        "Run `edge-agent check-config\nconfigs/sim.toml --sim` or name `edge-agent` alone.\n\n"
        "```console\n$ edge-agent version\nedge-agent 0.1.0\n```\n\n"
        "```\nwire := COBS(frame) 0x00\n```\n\n"
        "```\n./scripts/run-sim.sh\n```\n\n"
        "```sh\nsudo install -m 0644 a \\\n  /etc/b   # a comment\n# only a comment\n```\n\n"
        "| what | command |\n|---|---|\n"
        "| a | `python3 -m hil.bench_x --n 1` then `--n 2 --seed 3`; a `--sim` daemon |\n"
        "| b | `--eager` |\n")
    found = [(c.text, c.block, c.module) for c in discover([sample])]
    assert found == [
        ("edge-agent check-config configs/sim.toml --sim", False, None),
        ("edge-agent version", True, None),
        ("./scripts/run-sim.sh", True, None),
        ("sudo install -m 0644 a /etc/b", True, None),
        ("python3 -m hil.bench_x --n 1", False, None),
        ("--n 2 --seed 3", False, "hil.bench_x"),
    ], found


def test_every_documented_command_is_run_or_has_a_reason() -> None:
    missing = [str(c) for c in COMMANDS if verdict(c) is None]
    assert not missing, ("documented commands no rule covers: run them in a test here, or add "
                         "a rule with the reason they cannot run here", missing)
    skipped = sorted({f"{verdict(c)}: {c}" for c in COMMANDS
                      if not str(verdict(c)).startswith("run:")})
    print("\n".join(["not run here, with the reason:", *skipped]))
    assert len(_of(SIM)) == 8 and _of(HERE) and _of(WHEEL) and len(_of(MODEL)) == 3


def _argv_jobs() -> list[tuple[DocCommand, str, list[str], str]]:
    jobs = []
    for c in COMMANDS:
        invs = [Invocation(f"python -m {c.module}", tuple(shlex.split(c.text)))] if c.module \
            else invocations(c.text)
        for inv in invs:
            if inv.program == "<unparsable>":
                jobs.append((c, inv.program, list(inv.argv), "parse"))
            elif inv.program == "edge-agent" or inv.program.startswith("python -m hil."):
                module = inv.program.removeprefix("python -m ")
                jobs.append((c, module, list(inv.argv),
                             "options" if is_synopsis(inv.argv) else "parse"))
    return jobs


def _subcommand_named(argv: list[str]) -> bool:
    """`edge-agent cmd`, `edge-agent reports`: subcommands named in the prose (they exist)."""
    from edge_agent.cli import _parser

    parser = _parser()
    for word in argv:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            return False
        parser = subs[0].choices[word]
    return bool(argv)


def test_every_documented_invocation_parses_with_its_real_parser() -> None:
    jobs = _argv_jobs()
    modules = {m for _, m, _, _ in jobs}
    assert {"edge-agent", "hil.bench_degraded", "hil.bench_daemon_estop"} <= modules, modules
    out = subprocess.run([sys.executable, str(REPO / "tests" / "doc_argv_check.py")],
                         input=json.dumps([[m, a, mode] for _, m, a, mode in jobs]),
                         capture_output=True, text=True, cwd=REPO, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    results = json.loads(out.stdout)
    bad = [(str(c), m, r["error"]) for (c, m, a, _), r in zip(jobs, results, strict=True)
           if not r["ok"] and not (m == "edge-agent" and not c.block and _subcommand_named(a))]
    assert not bad, bad


def _local_project(arg: str) -> tuple[bool, set[str]]:
    """(is this checkout or its wheel, the extras named)."""
    m = re.fullmatch(r"(\.|dist/edge_agent-[^\[]*\.whl)(?:\[([\w,-]+)\])?", arg)
    return (m is not None, set(filter(None, (m.group(2) or "").split(","))) if m else set())


def test_documented_pip_installs() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    extras_known = project["optional-dependencies"]
    checked = 0
    for c in COMMANDS:
        for inv in invocations(c.text):
            if inv.program != "pip" or inv.argv[:1] != ("install",):
                continue
            for quoted in re.findall(r"'([^']*)'|\"([^\"]*)\"", c.text):
                word = "".join(quoted)
                assert "*" not in word, (str(c), f"a glob in quotes is never expanded: {word}")
            names: set[str] = set()
            args = list(inv.argv[1:])
            while args:
                arg = args.pop(0)
                if arg in ("-e", "--editable"):
                    continue
                if arg.startswith("-"):
                    continue  # -q, --no-deps, --upgrade: no argument of their own here
                local, extras = _local_project(arg)
                if local:
                    assert extras <= extras_known.keys(), (str(c), extras)
                    reqs = [*project["dependencies"],
                            *(r for e in extras for r in extras_known[e])]
                    names |= {canonicalize_name(Requirement(r).name) for r in reqs}
                    continue
                try:
                    names.add(canonicalize_name(Requirement(arg).name))
                except InvalidRequirement as exc:
                    pytest.fail(f"{c}: {arg!r} is neither this project nor a requirement: {exc}")
            assert not {"onnxruntime", "onnxruntime-gpu"} <= names, (
                str(c), "installs onnxruntime and onnxruntime-gpu into one environment: both "
                        "write the same `onnxruntime` module")
            checked += 1
    assert checked >= 3, checked


def test_the_units_documentation_is_installed_by_a_documented_step() -> None:
    unit = (REPO / "systemd" / "edge-agent.service").read_text()
    docs = re.findall(r"^Documentation=(.*)$", unit, flags=re.M)
    assert docs, unit
    installed = set()
    for c in COMMANDS:
        words = c.text.split("#")[0].split()
        if "install" in words or "cp" in words:
            installed.add(words[-1])
    for url in (u for line in docs for u in line.split()):
        assert url.startswith("file://"), url  # a robot may have no route to a web page
        assert url.removeprefix("file://") in installed, (url, sorted(installed))
        src = [c.text.split()[-2] for c in COMMANDS
               if c.text.split("#")[0].split()[-1:] == [url.removeprefix("file://")]]
        assert src and all((REPO / s).is_file() for s in src), src


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EDGE_AGENT_CONFIG"}
    path = f"{REPO / '.venv' / 'bin'}:{env.get('PATH', '')}"
    return {**env, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(REPO), "PATH": path, **extra}


def _sh(line: str, timeout: float = 60, cwd: Path = REPO,
        **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", line], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=_env(**env))


def test_documented_commands_that_need_only_the_checkout_run() -> None:
    ran = {}
    for c in _of(HERE):
        out = _sh(c.text, timeout=120)
        argv = (invocations(c.text)[0].argv or ("",))
        if argv[0] == "doctor":  # its exit code is the worst finding on this machine
            assert out.returncode in (0, 1, 2), (str(c), out.stdout, out.stderr)
            assert re.search(r"exit [012]\s*$", out.stdout + out.stderr), (str(c), out.stdout)
        else:
            assert out.returncode == 0, (str(c), out.stdout, out.stderr)
        ran[c.text] = out.stdout
    assert ran["grep ^ExecStart systemd/edge-agent.service"] == (
        "ExecStart=/opt/edge-agent/.venv/bin/edge-agent run --config "
        "/etc/edge-agent/edge-agent.toml\n"), ran
    assert any(t.startswith("edge-agent check-config configs/sim.toml") for t in ran), ran


def test_install_wheel_builds_and_its_installs_resolve(tmp_path: Path) -> None:
    """INSTALL's build step verbatim in a copy of the tracked files (it writes dist/, build/);
    then each documented `pip install dist/…` as a dry run against the built wheel."""
    (build,) = [c.text for c in _of(WHEEL)]
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    src = tmp_path / "src"
    for f in filter(None, files):
        if (REPO / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            (src / f).write_bytes((REPO / f).read_bytes())
    out = _sh(build, timeout=300, cwd=src)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert list((src / "dist").glob("edge_agent-*.whl")), out.stdout[-2000:]
    installs = [c.text for c in COMMANDS if re.search(r"\bpip install\b.*\bdist/", c.text)]
    assert installs, "INSTALL installs the wheel it builds"
    for line in installs:
        # as root into /opt/edge-agent/.venv there; the same pip arguments, a dry run, here
        cmd = re.sub(r"^(sudo\s+)?\S*pip3?\b", lambda _: f"{shlex.quote(sys.executable)} -m pip",
                     line.split(" #")[0])
        out = _sh(cmd + " --dry-run --no-deps --no-index --ignore-installed", timeout=120, cwd=src)
        assert out.returncode == 0, (line, cmd, out.stdout[-2000:], out.stderr[-2000:])
        assert "Would install edge-agent" in out.stdout, out.stdout


def test_install_release_key_block_runs(tmp_path: Path) -> None:
    """INSTALL §4: keygen, sign, verify on a copy of models/ (sign writes the card)."""
    shutil.copytree(REPO / "models", tmp_path / "models")
    key = None
    for c in _of(MODEL):
        line = c.text
        if key and "ed25519:..." in line:
            line = line.replace("ed25519:...", key)  # the placeholder for keygen's output
        out = _sh(line, cwd=tmp_path)
        assert out.returncode == 0, (line, out.stdout, out.stderr)
        if " keygen " in line:
            key = re.search(r"ed25519:\S+", out.stdout).group(0)  # type: ignore[union-attr]
    assert key and (tmp_path / "release.key").exists()


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
    lines = [c.text for c in _of(SIM)]
    assert lines[0] == "./scripts/run-sim.sh", lines
    sim = RunSim(lines[0], tmp_path, sim_broker)
    try:
        wait_until(lambda: ((s := _status()) is not None and s["link_up"]
                   and s["mqtt_connected"]) or sim.proc.poll() is not None, 120,
                   "run-sim.sh: the daemon up, its link and MQTT connected")
        assert sim.proc.poll() is None, "\n".join(sim.lines[-30:])
        done: list[str] = []
        task_id = None
        for line in lines[1:]:
            argv = list(invocations(line)[0].argv)
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
