"""Every shipped file in configs/ is valid (configs/rig/ is the rig's own format, tested there)."""

from __future__ import annotations

import re
import shutil
import tomllib
from pathlib import Path

import pytest

from edge_agent.config import config_keys, load_config
from edge_agent.robot import load_robot

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"
DAEMON_CONFIGS = sorted(CONFIGS.glob("*.toml"))
ROBOTS = sorted((CONFIGS / "robot").glob("*.toml"))
# Keys whose files a deployment provides; examples are checked with stand-ins for them.
_FILE_KEYS = (("mqtt", "password_file"), ("mqtt.tls", "ca_file"), ("mqtt.tls", "cert_file"),
              ("mqtt.tls", "key_file"), ("inference", "model"), ("sim", "rig_config"))


def test_configs_exist() -> None:
    names = {p.name for p in DAEMON_CONFIGS}
    assert {"sim.toml", "robot-production.example.toml"} <= names
    assert ROBOTS, "no robot description in configs/robot/"


@pytest.mark.parametrize("path", ROBOTS, ids=lambda p: p.name)
def test_robot_description_is_valid(path: Path) -> None:
    r = load_robot(path)
    assert r.n_joints >= 1 and r.name


@pytest.mark.parametrize("path", DAEMON_CONFIGS, ids=lambda p: p.name)
def test_daemon_config_is_valid(path: Path, tmp_path: Path) -> None:
    sim = "sim" in path.name
    if ".example." in path.name:
        path = _stage_example(path, tmp_path)
    cfg = load_config(path, sim=sim)
    assert cfg.warnings == (), cfg.warnings
    assert cfg.robot.n_joints >= 1


def _stage_example(path: Path, tmp_path: Path) -> Path:
    """Copy an example next to its robot description, with stand-ins for the deployment's files
    (secrets 0640, as the example's own header says)."""
    shutil.copytree(CONFIGS / "robot", tmp_path / "robot")
    staged = tmp_path / path.name
    shutil.copy(path, staged)
    data = tomllib.loads(path.read_text(encoding="utf-8"))
    for section, key in _FILE_KEYS:
        node = data
        for part in section.split("."):
            node = node.get(part, {})
        rel = node.get(key)
        if isinstance(rel, str):
            assert not rel.startswith("/"), f"{section}.{key}: keep it relative to the config"
            f = tmp_path / rel
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text("stand-in\n")
            f.chmod(0o640)
    return staged


def test_sim_config_is_what_the_simulation_needs() -> None:
    c = load_config(CONFIGS / "sim.toml", sim=True)
    assert c.device.id == "sim-01"
    assert (c.mqtt.host, c.mqtt.port, c.mqtt.password, c.mqtt.tls.enabled) == (
        "127.0.0.1", 1883, None, False)
    assert c.mqtt.topic_prefix == "edge/sim-01"
    assert c.state_dir == REPO / "var" / "sim-01"  # /var/ is git-ignored
    assert c.robot.name == "edge-arm-4"
    assert c.debug.failure_injection is True
    assert c.link.port is None  # --sim fills it with the rig's pty
    # --set device.id moves the derived topic prefix and username with it
    other = load_config(CONFIGS / "sim.toml", ["device.id=sim-02"], sim=True)
    assert (other.mqtt.topic_prefix, other.mqtt.username) == ("edge/sim-02", "sim-02")


def test_production_example_is_production_grade(tmp_path: Path) -> None:
    path = CONFIGS / "robot-production.example.toml"
    c = load_config(_stage_example(path, tmp_path))
    assert c.link.port == "/dev/ttyUSB0"
    assert c.mqtt.tls.enabled and not c.mqtt.tls.insecure and c.mqtt.port == 8883
    assert c.mqtt.tls.ca_file is not None and c.mqtt.tls.key_file is not None
    assert c.mqtt.password_file is not None and c.mqtt.password is not None
    assert c.debug.failure_injection is False
    assert c.log.format == "json"
    assert c.state_dir == Path("/var/lib/edge-agent")
    assert "CPUExecutionProvider" in c.inference.providers
    # signed models only, and model.update only from a root-owned drop directory
    assert c.inference.trusted_keys and c.inference.update_dir is not None


def test_sim_config_documents_every_key() -> None:
    """configs/sim.toml is the reference: each schema key appears (set or commented out)."""
    section = ""
    seen: set[str] = set()
    for line in (CONFIGS / "sim.toml").read_text(encoding="utf-8").splitlines():
        head = re.match(r"\s*\[([\w.]+)\]", line)
        if head:
            section = head.group(1)
            continue
        m = re.match(r"\s*#?\s*(\w+)\s*=", line)
        if m:
            seen.add(f"{section}.{m.group(1)}" if section else m.group(1))
    missing = [k for k in config_keys() if k not in seen]
    assert not missing, f"undocumented in configs/sim.toml: {missing}"
