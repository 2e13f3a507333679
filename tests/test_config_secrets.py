"""edge_agent.config: secrets never shown, the config hash, and a start-up path that stays light."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from config_helpers import PASSWORD, REPO, ROBOT, load, secret_file

from edge_agent.config import ConfigError, Secret

# --------------------------------------------------------------------------- secrets


def test_password_file_is_read_and_never_shown(tmp_path: Path) -> None:
    secret_file(tmp_path / "secrets" / "pw")
    c = load(tmp_path, {"mqtt": {"password_file": '"secrets/pw"'}})
    assert c.mqtt.password is not None and c.mqtt.password.reveal() == PASSWORD
    assert c.mqtt.password_file == tmp_path / "secrets" / "pw"
    assert c.secret_values() == (PASSWORD,)
    shown = [repr(c), str(c), repr(c.mqtt), f"{c.mqtt.password}", json.dumps(c.as_dict()),
             c.hash, "\n".join(c.warnings)]
    for text in shown:
        assert PASSWORD not in text
    assert hashlib.sha256(PASSWORD.encode()).hexdigest() not in json.dumps(c.as_dict())
    assert c.as_dict()["mqtt"]["password"] == "***"


@pytest.mark.parametrize(("content", "mode", "why"), [
    (PASSWORD + "\n", 0o644, "other users can access it (mode 0644)"),
    (PASSWORD + "\n", 0o602, "other users can access it"),
    ("\n", 0o600, "the file is empty"),
    ("a\nb\n", 0o600, "on one line"),
])
def test_bad_password_file(tmp_path: Path, content: str, mode: int, why: str) -> None:
    secret_file(tmp_path / "pw", content, mode)
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, {"mqtt": {"password_file": '"pw"'}})
    assert ei.value.key == "mqtt.password_file" and why in ei.value.why
    assert PASSWORD not in str(ei.value)


def test_world_readable_client_key_is_refused(tmp_path: Path) -> None:
    secret_file(tmp_path / "c.crt", "cert\n", 0o644)
    secret_file(tmp_path / "c.key", "key\n", 0o644)
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, {"mqtt.tls": {"cert_file": '"c.crt"', "key_file": '"c.key"'}})
    assert ei.value.key == "mqtt.tls.key_file" and "chmod o-rwx" in ei.value.why
    (tmp_path / "c.key").chmod(0o640)
    c = load(tmp_path, {"mqtt.tls": {"cert_file": '"c.crt"', "key_file": '"c.key"'}})
    assert c.mqtt.tls.enabled and c.mqtt.tls.key_file == tmp_path / "c.key"


@pytest.mark.parametrize(("changes", "key"), [
    ({"mqtt": {"password": "12345678"}}, "mqtt.password"),
    ({"mqtt": {"passwd": '"hunter2-secret"'}}, "mqtt.passwd"),
    ({"mqtt": {"api_token": '"hunter2-secret"'}}, "mqtt.api_token"),
    ({"reports": {"webhook_url": '"hunter2-secret"'}}, "reports.webhook_url"),
])
def test_errors_about_secrets_do_not_show_them(tmp_path: Path, changes: dict[str, Any],
                                               key: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, changes)
    assert ei.value.key == key
    assert "hunter2-secret" not in str(ei.value) and "12345678" not in str(ei.value)
    assert " = ***: " in str(ei.value)


def test_secret_type() -> None:
    s = Secret("p4ss-word")
    assert repr(s) == str(s) == f"{s}" == "***"
    assert s == Secret("p4ss-word") and s != Secret("other")
    assert hash(s) == hash(Secret("p4ss-word"))
    assert s.reveal() == "p4ss-word" and "p4ss-word" not in s.digest()


def test_webhook_url_is_a_secret(tmp_path: Path) -> None:
    url = "https://hooks.example/T000/B000/tok3n-abcdef"
    c = load(tmp_path, {"reports": {"webhook_url": json.dumps(url)}})
    assert c.reports.webhook_url is not None and c.reports.webhook_url.reveal() == url
    assert url not in repr(c) and url not in json.dumps(c.as_dict())
    assert url in c.secret_values()


def test_systemd_directory_variables_expand_in_paths(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    creds = tmp_path / "creds"
    secret_file(creds / "mqtt-password")
    monkeypatch.setenv("CREDENTIALS_DIRECTORY", str(creds))
    monkeypatch.setenv("STATE_DIRECTORY", str(tmp_path / "lib"))
    c = load(tmp_path, {"": {"state_dir": '"${STATE_DIRECTORY}"'},
                        "mqtt": {"password_file": '"${CREDENTIALS_DIRECTORY}/mqtt-password"'}})
    assert c.state_dir == tmp_path / "lib"
    assert c.mqtt.password is not None and c.mqtt.password.reveal() == PASSWORD
    monkeypatch.delenv("CREDENTIALS_DIRECTORY")
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, {"mqtt": {"password_file": '"${CREDENTIALS_DIRECTORY}/mqtt-password"'}})
    assert ei.value.key == "mqtt.password_file" and "is not set" in ei.value.why
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, {"mqtt": {"password_file": '"$HOME/pw"'}})
    assert "only CREDENTIALS_DIRECTORY" in ei.value.why


# --------------------------------------------------------------------------- hash


def test_hash_is_stable_and_tracks_effective_values(tmp_path: Path) -> None:
    h = load(tmp_path).hash
    assert load(tmp_path).hash == h
    assert load(tmp_path, {"control": {"rate_hz": "200.0"}}).hash == h  # same value, other text
    assert load(tmp_path, {"mqtt": {"port": "1883"}}).hash == h  # explicit default
    assert load(tmp_path, overrides=["mqtt.port=1883"]).hash == h
    assert load(tmp_path, {"mqtt": {"port": "1884"}}).hash != h
    assert load(tmp_path, overrides=["mqtt.port=1884"]).hash == load(
        tmp_path, {"mqtt": {"port": "1884"}}).hash
    # The hash is published: it leaves secrets out (else it would test password guesses).
    p1 = load(tmp_path, {"mqtt": {"password": '"first-pw"'}}).hash
    assert p1 == load(tmp_path, {"mqtt": {"password": '"second-pw"'}}).hash


def test_hash_tracks_the_robot_description_contents(tmp_path: Path) -> None:
    robot = tmp_path / "robot.toml"
    robot.write_text(ROBOT.read_text())
    changes = {"robot": {"description": '"robot.toml"'}}
    h = load(tmp_path, changes).hash
    robot.write_text(ROBOT.read_text().replace("velocity_max_rad_s = 1.5",
                                               "velocity_max_rad_s = 1.4", 1))
    assert load(tmp_path, changes).hash != h


def test_with_link_port_filled_later_the_hash_is_kept(tmp_path: Path) -> None:
    import dataclasses

    c = load(tmp_path, {"link": {"port": None}}, sim=True)
    filled = dataclasses.replace(c, link=dataclasses.replace(c.link, port="/dev/pts/9"))
    assert filled.hash == c.hash and filled.link.port == "/dev/pts/9"


# --------------------------------------------------------------------------- start-up cost


def test_importing_config_stays_light() -> None:
    code = ("import sys, edge_agent.config, edge_agent.logsetup\n"
            "heavy = {'onnxruntime', 'numpy', 'scipy', 'filterpy', 'paho', 'tritonclient',"
            " 'matplotlib', 'transitions', 'serial'}\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
    code2 = ("import sys, edge_agent.config, edge_agent.logsetup\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in"
             " {'structlog', 'rich', 'asyncio', 'attr', 'pygments'}))")
    out2 = subprocess.run([sys.executable, "-c", code2], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout
    assert out2.strip() == "[]"  # logging costs nothing until something is logged
