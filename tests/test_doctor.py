"""`edge-agent doctor` against real misses: a broker that refuses the device (private Mosquitto
with a password file and an ACL), a tty that cannot be opened, a model that fails verification.

Each miss must come out as an error finding with its fix, and a non-zero exit code.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MQTT_USERS
from mosquitto import Mosquitto

REPO = Path(__file__).resolve().parents[1]
SIM = REPO / "configs" / "sim.toml"
MODEL = REPO / "models" / "pick-place-policy.onnx"
# the ACL of a broker nobody configured for this device: only the operator may do anything
OPERATOR_ONLY_ACL = "user operator\ntopic readwrite edge/#\n"


def doctor(*sets: str, sim: bool = False, user: str | None = None,
           args: tuple[str, ...] = ()) -> tuple[int, list[dict[str, Any]]]:
    """Run `edge-agent doctor --json` (as `user` via setpriv when given); exit code, findings."""
    cmd = [sys.executable, "-m", "edge_agent.cli", "doctor", "--config", str(SIM), "--json",
           "--timeout", "10"]
    if sim:
        cmd.append("--sim")
    cmd += args
    for s in sets:
        cmd += ["--set", s]
    if user is not None:
        pw = pwd.getpwnam(user)
        cmd = ["setpriv", f"--reuid={pw.pw_uid}", f"--regid={pw.pw_gid}", "--clear-groups", *cmd]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    try:
        body = json.loads(out.stdout)
    except ValueError:
        raise AssertionError(f"no JSON from doctor (rc {out.returncode}):\n{out.stdout}\n"
                             f"{out.stderr}") from None
    assert body["exit"] == out.returncode
    return out.returncode, body["findings"]


def by_check(findings: list[dict[str, Any]], check: str) -> list[dict[str, Any]]:
    return [f for f in findings if f["check"] == check]


@pytest.fixture
def state_dir() -> Iterator[Path]:
    """A state dir any user may write (the tty test runs doctor as nobody)."""
    d = Path(tempfile.mkdtemp(prefix="edge-doctor-"))
    d.chmod(0o777)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _device_sets(broker: Mosquitto, state_dir: Path, password: str) -> list[str]:
    return [f"state_dir={state_dir}", "device.id=dev1", f"mqtt.port={broker.port}",
            f'mqtt.password="{password}"']


def test_a_broker_that_refuses_the_login_is_an_error_with_the_fix(
        broker: Mosquitto, state_dir: Path) -> None:
    rc, findings = doctor(*_device_sets(broker, state_dir, "not-the-password"), sim=True)
    assert rc == 2, findings
    (login,) = by_check(findings, "broker")
    assert login["level"] == "error" and "login refused" in login["message"], login
    assert "mosquitto_passwd" in login["fix"] and "dev1" in login["fix"]


def test_an_acl_that_refuses_the_device_is_an_error_and_the_documented_acl_is_not(
        tmp_path: Path, broker: Mosquitto, state_dir: Path) -> None:
    closed = Mosquitto(tmp_path / "closed", MQTT_USERS, acl=OPERATOR_ONLY_ACL)
    closed.start()
    try:
        rc, findings = doctor(*_device_sets(closed, state_dir, MQTT_USERS["dev1"]), sim=True)
    finally:
        closed.stop()
    assert rc == 2, findings
    assert by_check(findings, "broker")[0]["level"] == "ok"  # the login itself works
    # Mosquitto grants the subscriptions and filters at delivery: the refused publish shows it
    (denied,) = [f for f in by_check(findings, "broker_acl") if f["level"] == "error"]
    assert "publish on edge/dev1/reply/doctor refused" in denied["message"], denied
    assert "docs/mosquitto/acl" in denied["fix"]

    # the same checks pass against the documented ACL (the `broker` fixture): they can tell
    rc, findings = doctor(*_device_sets(broker, state_dir, MQTT_USERS["dev1"]), sim=True)
    assert [f["level"] for f in by_check(findings, "broker_acl")] == ["ok", "ok"], findings
    assert not [f for f in findings if f["level"] == "error"], findings


def test_a_missing_device_and_a_path_that_is_no_tty_are_errors(
        broker: Mosquitto, state_dir: Path) -> None:
    base = _device_sets(broker, state_dir, MQTT_USERS["dev1"])
    rc, findings = doctor(*base, "link.port=/dev/ttyUSB-edge-agent-absent")
    assert rc == 2
    (tty,) = by_check(findings, "tty")
    assert tty["level"] == "error" and "no such device" in tty["message"]
    assert "/dev/serial/by-id/" in tty["fix"]

    plain = state_dir / "not-a-tty"
    plain.write_text("")
    rc, findings = doctor(*base, f"link.port={plain}")
    assert rc == 2
    (tty,) = by_check(findings, "tty")
    assert tty["level"] == "error" and "not a character device" in tty["message"], tty


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root and setpriv to run doctor as another user")
def test_a_tty_the_user_cannot_open_is_an_error_with_the_group_fix(
        broker: Mosquitto, state_dir: Path) -> None:
    """A real pty slave (root-owned, 0620) checked by doctor running as `nobody`: root could
    open anything, so the check runs as a user who cannot."""
    master, slave = os.openpty()
    try:
        path = os.ttyname(slave)
        os.chmod(path, 0o620)
        base = _device_sets(broker, state_dir, MQTT_USERS["dev1"])
        rc, findings = doctor(*base, f"link.port={path}", user="nobody")
        assert rc == 2, findings
        (tty,) = by_check(findings, "tty")
        assert tty["level"] == "error" and "permission denied" in tty["message"], tty
        assert "SupplementaryGroups=" in tty["fix"], tty
        # root opens it: the same tty is fine for a user who may
        rc, findings = doctor(*base, f"link.port={path}")
        assert by_check(findings, "tty")[0]["level"] == "ok", findings
    finally:
        os.close(slave)
        os.close(master)


def test_a_model_that_fails_verification_against_its_card_is_an_error(
        tmp_path: Path, broker: Mosquitto, state_dir: Path) -> None:
    model = tmp_path / "pick-place-policy.onnx"
    shutil.copy(MODEL, model)
    card = json.loads(MODEL.with_name("pick-place-policy.card.json").read_text())
    card["sha256"] = "0" * 64  # the card of another build
    (tmp_path / "pick-place-policy.card.json").write_text(json.dumps(card))
    base = _device_sets(broker, state_dir, MQTT_USERS["dev1"])
    rc, findings = doctor(*base, f"inference.model={model}", sim=True)
    assert rc == 2, findings
    (m,) = by_check(findings, "model")
    assert m["level"] == "error" and "fails verification" in m["message"], m
    assert "sha256" in m["message"] and "card" in m["fix"]

    # the shipped model with its own card verifies
    rc, findings = doctor(*base, sim=True)
    assert by_check(findings, "model")[0]["level"] == "ok", findings
    (prov,) = by_check(findings, "providers")
    assert prov["level"] == "ok" and "session runs on CPUExecutionProvider" in prov["message"]


def test_the_exit_code_is_the_worst_finding_and_the_text_output_gives_the_fix(
        broker: Mosquitto, state_dir: Path) -> None:
    cmd = [sys.executable, "-m", "edge_agent.cli", "doctor", "--config", str(SIM), "--sim",
           "--set", f"state_dir={state_dir}", "--set", "device.id=dev1",
           "--set", f"mqtt.port={broker.port}", "--set", 'mqtt.password="wrong"']
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    i = next(n for n, ln in enumerate(lines) if ln.startswith("ERROR") and "broker" in ln)
    assert "fix:" in lines[i + 1] and "mosquitto_passwd" in lines[i + 1]
    assert lines[-1].endswith("exit 2"), lines[-1]
    assert "\x1b[" not in out.stdout  # no colour when not a terminal


def test_a_unit_that_does_not_grant_the_priorities_is_reported(
        tmp_path: Path, broker: Mosquitto, state_dir: Path) -> None:
    shipped = REPO / "systemd" / "edge-agent.service"
    base = _device_sets(broker, state_dir, MQTT_USERS["dev1"])
    rc, findings = doctor(*base, sim=True, args=("--unit", str(shipped)))
    (unit,) = by_check(findings, "unit")
    assert unit["level"] == "ok" and "LimitRTPRIO=30" in unit["message"], unit

    stripped = tmp_path / "edge-agent.service"
    stripped.write_text("\n".join(ln for ln in shipped.read_text().splitlines()
                                  if not ln.startswith("LimitRTPRIO=")))
    rc, findings = doctor(*base, sim=True, args=("--unit", str(stripped)))
    assert rc >= 1
    (unit,) = by_check(findings, "unit")
    assert unit["level"] == "warn" and "LimitRTPRIO=unset" in unit["message"], unit
    assert "LimitRTPRIO=30" in unit["fix"]
    # a drop-in that grants it is read too
    (tmp_path / "edge-agent.service.d").mkdir()
    (tmp_path / "edge-agent.service.d" / "rt.conf").write_text("[Service]\nLimitRTPRIO=40\n")
    rc, findings = doctor(*base, sim=True, args=("--unit", str(stripped)))
    assert by_check(findings, "unit")[0]["level"] == "ok", findings


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_broker_without_a_size_limit_is_a_warning_and_one_with_it_is_not(
        tmp_path: Path, broker: Mosquitto, state_dir: Path, protocol: str) -> None:
    sets = [*_device_sets(broker, state_dir, MQTT_USERS["dev1"]), f'mqtt.protocol="{protocol}"']
    # the test broker sets no limit: a publish over what the daemon reads is accepted
    _rc, findings = doctor(*sets, sim=True)
    (size,) = by_check(findings, "broker_size")
    assert size["level"] == "warn", findings
    assert "max_packet_size 262144" in size["fix"]
    assert ("dropped without a reply" if protocol == "5" else "not proven") in size["message"]
    # the shipped config's limit, and mosquitto's max_packet_size: each is seen (Mosquitto 2.0
    # disconnects an MQTT 5 sender of a publish over either; max_packet_size any sender)
    for line in ("message_size_limit 131072", "max_packet_size 262144"):
        limited = Mosquitto(tmp_path / line.split()[0], MQTT_USERS)
        limited.use_config(limited.config.read_text() + line + "\n")
        limited.start()
        try:
            _rc, findings = doctor(*_device_sets(limited, state_dir, MQTT_USERS["dev1"]),
                                   f'mqtt.protocol="{protocol}"', sim=True)
        finally:
            limited.stop()
        (size,) = by_check(findings, "broker_size")
        if protocol == "3.1.1" and line.startswith("message_size_limit"):
            # a 3.1.1 sender of a publish over message_size_limit gets its PUBACK like any other
            assert size["level"] == "warn" and "not proven" in size["message"], findings
        else:
            assert size["level"] == "ok", findings
            assert ("refuses a" in size["message"]
                    or "takes no packet over 262144" in size["message"]), findings
        assert by_check(findings, "broker_acl")[0]["level"] == "ok", findings
