"""The `edge-agent` CLI as an operator runs it: real subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from edge_agent.config import load_config

REPO = Path(__file__).resolve().parents[1]
SIM = "configs/sim.toml"
ROBOT = REPO / "configs" / "robot" / "edge-arm-4.toml"
PASSWORD = "Zq8-hunter2-Xk41"


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout)


def write_config(tmp_path: Path, extra: str = "", port: str = '"/dev/ttyUSB0"') -> Path:
    p = tmp_path / "edge-agent.toml"
    p.write_text(f'schema_version = 1\nstate_dir = "state"\n[device]\nid = "dev-1"\n'
                 f"[link]\nport = {port}\n[robot]\ndescription = {json.dumps(str(ROBOT))}\n"
                 + extra)
    return p


def assert_one_line_error(err: str) -> None:
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert err.startswith("error: ")


def test_check_config_ok_line_and_hash() -> None:
    r = cli("check-config", SIM, "--sim")
    assert r.returncode == 0, r.stderr
    h = load_config(REPO / SIM, sim=True).hash
    assert r.stdout.strip() == f"OK: {SIM} (device sim-01, robot edge-arm-4 4 joints, hash {h})"
    assert r.stderr == ""


def test_check_config_without_sim_needs_link_port() -> None:
    r = cli("check-config", SIM)
    assert r.returncode == 1
    assert_one_line_error(r.stderr)
    assert r.stderr.startswith(f"error: {SIM}: link.port = None: is required")
    assert "--sim" in r.stderr


def test_check_config_bad_value(tmp_path: Path) -> None:
    p = write_config(tmp_path, "[mqtt]\nport = 70000\n")
    r = cli("check-config", str(p))
    assert r.returncode == 1 and r.stdout == ""
    assert_one_line_error(r.stderr)
    assert r.stderr.strip() == f"error: {p}: mqtt.port = 70000: must be >= 1 and <= 65535"


def test_check_config_unknown_key_suggests(tmp_path: Path) -> None:
    p = write_config(tmp_path, "[mqtt]\nhots = \"broker\"\n")
    r = cli("check-config", str(p))
    assert r.returncode == 1
    assert_one_line_error(r.stderr)
    # the value of an unknown key is never printed (a misspelt key may hold a password)
    assert "mqtt.hots = ***: unknown key; did you mean mqtt.host?" in r.stderr


def test_check_config_robot_error_names_robot_file(tmp_path: Path) -> None:
    robot = tmp_path / "arm.toml"
    robot.write_text(ROBOT.read_text().replace("link_length_m = 0.35", "link_length_m = -0.35"))
    p = write_config(tmp_path)
    r = cli("check-config", str(p), "--set", f"robot.description={robot}")
    assert r.returncode == 1
    assert_one_line_error(r.stderr)
    assert r.stderr.startswith(f"error: {robot}: joints[1].link_length_m = -0.35: must be >= 0")


def test_check_config_set_overrides() -> None:
    base = cli("check-config", SIM, "--sim").stdout
    r = cli("check-config", SIM, "--sim", "--set", "mqtt.port=1884",
            "--set", "link.port=/dev/pts/3")
    assert r.returncode == 0, r.stderr
    assert re.search(r"hash [0-9a-f]{12}\)$", r.stdout.strip())
    assert r.stdout != base  # the effective config changed, so did its hash
    bad = cli("check-config", SIM, "--sim", "--set", "mqtt.prot=1884")
    assert bad.returncode == 1
    assert_one_line_error(bad.stderr)
    assert bad.stderr.strip() == (f"error: {SIM} (--set): mqtt.prot = ***: unknown key; "
                                  "did you mean mqtt.port?")
    malformed = cli("check-config", SIM, "--set", "mqtt.port")
    assert malformed.returncode == 1
    assert "expected KEY=VALUE" in malformed.stderr


def test_check_config_missing_file() -> None:
    r = cli("check-config", "configs/nope.toml")
    assert r.returncode == 1
    assert_one_line_error(r.stderr)
    assert "file not found" in r.stderr


def test_check_config_print_hides_secrets_and_warns(tmp_path: Path) -> None:
    pw = tmp_path / "pw"
    pw.write_text(PASSWORD + "\n")
    pw.chmod(0o600)
    p = write_config(tmp_path, '[mqtt]\nhost = "broker.example"\npassword_file = "pw"\n')
    r = cli("check-config", str(p), "--print")
    assert r.returncode == 0, r.stderr
    assert PASSWORD not in r.stdout + r.stderr
    doc = json.loads(r.stdout.split("\n", 1)[1])
    assert doc["mqtt"]["password"] == "***" and doc["mqtt"]["host"] == "broker.example"
    assert r.stderr.startswith(f"warning: {p}: mqtt.password is sent in clear text")


def test_run_with_invalid_config_exits_78(tmp_path: Path) -> None:
    p = write_config(tmp_path, "[control]\nrate_hz = 5\n")
    r = cli("run", "--config", str(p))
    assert r.returncode == 78
    assert_one_line_error(r.stderr)
    assert "control.rate_hz = 5: must be >= 10" in r.stderr


def test_cmd_argument_errors() -> None:
    for args, fragment in ((["status", "{bad"], "JSON arguments"),
                           (["status", "[1, 2]"], "must be an object"),
                           (["status", "--timeout", "0"], "--timeout must be > 0")):
        r = cli("cmd", *args, "--config", SIM)
        assert r.returncode == 2, (args, r.stderr)
        assert_one_line_error(r.stderr)
        assert fragment in r.stderr


def test_cmd_with_bad_config() -> None:
    r = cli("cmd", "status", "--config", "configs/nope.toml")
    assert r.returncode == 1
    assert_one_line_error(r.stderr)


def test_cmd_without_daemon_or_broker_exits_3(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = write_config(tmp_path, f"[mqtt]\nport = {port}\n")
    r = cli("cmd", "status", "--config", str(p), "--timeout", "2")
    if "not yet implemented" in r.stderr:
        pytest.skip("edge_agent.comms.client is not in this tree")
    assert r.returncode == 3, r.stderr
    assert_one_line_error(r.stderr)


def test_version() -> None:
    r = cli("version")
    assert r.returncode == 0
    assert re.fullmatch(r"edge-agent \S+ \(wire protocol 1, config schema 1, python 3\.\d+\.\d+\)",
                        r.stdout.strip())
    assert cli("--version").stdout.startswith("edge-agent ")


@pytest.mark.parametrize(("args", "words"), [
    ([], ["run", "check-config", "cmd", "version", "exit codes"]),
    (["run"], ["--sim", "--eager", "--set", "protective stop", "mqtt.port=1884"]),
    (["check-config"], ["hash", "--print", "--set"]),
    (["cmd"], ["estop", "task.start", "--timeout", "EDGE_AGENT_CONFIG"]),
])
def test_help(args: list[str], words: list[str]) -> None:
    r = cli(*args, "--help")
    assert r.returncode == 0
    for w in words:
        assert w in r.stdout, w


def test_usage_errors_exit_2() -> None:
    assert cli().returncode == 2
    assert cli("launch").returncode == 2
    assert cli("run").returncode == 2  # --config is required
