"""Issue 16, item 4: nothing derived from a secret is published, secrets stay out of configs others
can read, and a config error never prints a secret or the value of an unknown key.

Real config files with real modes, and the real `edge-agent check-config` process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from config_helpers import PASSWORD, REPO, load, secret_file, write

from edge_agent.config import load_config
from edge_agent.errors import ConfigError

HOOK = "https://hooks.example/T0/B0/tok3n-abcdef"


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_the_published_hash_does_not_depend_on_the_password(tmp_path: Path) -> None:
    base = load(tmp_path).hash
    h1 = load(tmp_path, {"mqtt": {"password": json.dumps(PASSWORD)}}).hash
    h2 = load(tmp_path, {"mqtt": {"password": '"another-guess"'}}).hash
    assert h1 == h2 != base  # a guess cannot be tested against `status`'s config_hash
    secret_file(tmp_path / "hook", HOOK + "\n")
    with_hook = load(tmp_path, {"reports": {"webhook_url_file": '"hook"'}}).hash
    assert with_hook != base  # the file's path is configuration, its contents are not
    secret_file(tmp_path / "hook", HOOK + "/other\n")
    assert load(tmp_path, {"reports": {"webhook_url_file": '"hook"'}}).hash == with_hook


@pytest.mark.parametrize(("changes", "key"), [
    ({"mqtt": {"password": json.dumps(PASSWORD)}}, "mqtt.password"),
    ({"reports": {"webhook_url": json.dumps(HOOK)}}, "reports.webhook_url"),
])
def test_an_inline_secret_in_a_config_others_can_read_is_refused(
        tmp_path: Path, changes: dict[str, dict[str, str]], key: str) -> None:
    p = write(tmp_path, changes, mode=0o644)
    with pytest.raises(ConfigError) as ei:
        load_config(p)
    assert ei.value.key == key and f"{key}_file" in ei.value.why
    assert PASSWORD not in str(ei.value) and HOOK not in str(ei.value)
    r = _cli("check-config", str(p))
    assert r.returncode == 1 and f"{key} = ***" in r.stderr, r.stderr
    assert PASSWORD not in r.stderr + r.stdout and "tok3n" not in r.stderr + r.stdout
    p.chmod(0o640)  # readable by the service's group only: fine
    assert load_config(p).source == p


def test_webhook_url_file_is_a_secret_file(tmp_path: Path) -> None:
    secret_file(tmp_path / "hook", HOOK + "\n")
    c = load(tmp_path, {"reports": {"webhook_url_file": '"hook"'}})
    assert c.reports.webhook_url is not None and c.reports.webhook_url.reveal() == HOOK
    assert HOOK in c.secret_values() and HOOK not in json.dumps(c.as_dict())
    secret_file(tmp_path / "hook", HOOK + "\n", mode=0o644)
    with pytest.raises(ConfigError, match="other users can access it"):
        load(tmp_path, {"reports": {"webhook_url_file": '"hook"'}})
    secret_file(tmp_path / "hook", "not a url\n")
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, {"reports": {"webhook_url_file": '"hook"'}})
    assert "not a url" not in str(ei.value)


@pytest.mark.parametrize("item", ["mqtt.pasword=hunter2-Xk41", "mqtt.passwd=hunter2-Xk41",
                                  "reports.webhok_url=https://h.example/hunter2-Xk41",
                                  "mqtt.tls.secret=hunter2-Xk41"])
def test_an_unknown_key_never_echoes_its_value(item: str) -> None:
    r = _cli("check-config", str(REPO / "configs" / "sim.toml"), "--sim", "--set", item)
    assert r.returncode == 1 and "unknown key" in r.stderr
    assert "hunter2" not in r.stderr + r.stdout, r.stderr


def test_the_config_hash_is_no_password_oracle(tmp_path: Path) -> None:
    """The old hash covered sha256(salt + password): a published hash let anyone confirm a
    guess. Now configs that differ only in the password print the same hash."""
    hashes = []
    for pw in (PASSWORD, "a-wrong-guess"):
        p = write(tmp_path, {"mqtt": {"password": json.dumps(pw)}})
        r = _cli("check-config", str(p))
        assert r.returncode == 0, r.stderr
        hashes.append(r.stdout.rsplit("hash ", 1)[1])
    assert hashes[0] == hashes[1]
