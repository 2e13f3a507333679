"""Issue 16, item 1: `model.update` is no file oracle, and only signed models are installed.

Against the real daemon (--sim) with `inference.trusted_keys`, `inference.update_dir` and a small
`inference.max_model_bytes`: files outside the update directory, symlinks, a 1 GiB file, an
untrusted directory, an unsigned model, a model without a card and a model with altered weights
whose card's sha256 was updated are refused, no reply carries the hash of a refused file, the
daemon never read the big file (its peak RSS), and the model in use stays. A model signed with
`edge-agent model sign` is installed and decides from then on. The cache and the CLI are checked
on real files with real Ed25519 keys.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import REPO, DaemonProc
from inference_models import make_policy
from mosquitto import wait_until

from edge_agent.inference.assembly import ACTION_LABELS, OBS_FIELD_UNITS
from edge_agent.inference.model_cache import ModelCache
from edge_agent.inference.model_card import ModelCard, ModelError, card_path_for
from edge_agent.inference.model_signing import generate_key, sign_card

TRAINED = REPO / "models" / "pick-place-policy.onnx"
HEX64 = re.compile(r"[0-9a-f]{64}")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _keygen(d: Path, name: str = "release.key") -> tuple[Path, str]:
    r = _cli("model", "keygen", "--out", str(d / name))
    assert r.returncode == 0, r.stderr
    assert (os.stat(d / name).st_mode & 0o077) == 0  # the private key is the owner's only
    return d / name, r.stdout.strip()


def _sign(model: Path, key: Path, *extra: str) -> None:
    r = _cli("model", "sign", str(model), "--key", str(key), *extra)
    assert r.returncode == 0, r.stderr


def _tamper(signed: Path, other_weights: Path, out: Path) -> Path:
    """`out`: other weights, with `signed`'s card (signature and all), its sha256 updated."""
    shutil.copyfile(other_weights, out)
    card = json.loads(card_path_for(signed).read_text())
    card["sha256"] = _sha(out)
    card_path_for(out).write_text(json.dumps(card))
    return out


def test_model_cli_signs_and_verifies(tmp_path: Path) -> None:
    key, public = _keygen(tmp_path)
    model = make_policy(tmp_path / "rel", "policy", seed=3)
    _sign(model, key, "--version", "3.1.0")
    card = json.loads(card_path_for(model).read_text())
    assert card["version"] == "3.1.0" and card["sha256"] == _sha(model)
    assert card["signature"]["alg"] == "ed25519"
    ok = _cli("model", "verify", str(model), "--public-key", public)
    assert ok.returncode == 0 and "OK" in ok.stdout, ok.stderr
    _other, stranger = _keygen(tmp_path, "other.key")
    bad_key = _cli("model", "verify", str(model), "--public-key", stranger)
    assert bad_key.returncode == 1 and "bad signature" in bad_key.stderr
    card["version"] = "9.9.9"  # the card is signed too, not only the weights
    card_path_for(model).write_text(json.dumps(card))
    assert _cli("model", "verify", str(model), "--public-key", public).returncode == 1
    tampered = _tamper(model, make_policy(tmp_path / "x", "x", seed=4), tmp_path / "t.onnx")
    r = _cli("model", "verify", str(tampered), "--public-key", public)
    assert r.returncode == 1 and "bad signature" in r.stderr
    assert _cli("model", "verify", str(model)).returncode == 2  # no key: usage


def test_the_cache_installs_only_signed_models_when_keys_are_configured(tmp_path: Path) -> None:
    pem, public = generate_key()
    cache = ModelCache(tmp_path / "models", fields=OBS_FIELD_UNITS, labels=ACTION_LABELS,
                       trusted_keys=(public,))
    a = make_policy(tmp_path / "a", "a", seed=1)
    with pytest.raises(ModelError, match="unsigned: the card has no signature"):
        cache.install(a.read_bytes(), ModelCard.load(card_path_for(a)), sha256=_sha(a))
    with pytest.raises(ModelError, match="unsigned: the model has no card"):
        cache.install(a.read_bytes(), None, sha256=_sha(a))
    signed = sign_card(ModelCard.load(card_path_for(a)), pem)
    with pytest.raises(ModelError, match="the signed card says"):
        cache.install(a.read_bytes(), signed, sha256=_sha(a), version="other")
    assert cache.current() is None
    entry = cache.install(a.read_bytes(), signed, sha256=_sha(a))
    assert cache.current() == entry
    b = make_policy(tmp_path / "b", "b", seed=2)  # other weights, the signed card re-pointed
    forged = signed.with_identity(_sha(b))
    with pytest.raises(ModelError, match="bad signature"):
        cache.install(b.read_bytes(), forged, sha256=_sha(b))
    assert cache.current() == entry
    # the key is rotated out of the config: the cached model no longer loads
    _pem2, public2 = generate_key()
    rotated = ModelCache(cache.dir, trusted_keys=(public2,))
    assert rotated.current() is None and ModelCache(cache.dir).current() == entry


def _status_inference(d: DaemonProc) -> dict[str, Any]:
    return dict(d.socket_cmd("status")["result"]["inference"] or {})


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


def test_model_update_refuses_what_it_must_not_read_or_install(tmp_path: Path) -> None:
    key, public = _keygen(tmp_path)
    shipped = tmp_path / "ship" / "policy.onnx"  # the configured model, signed for this robot
    shipped.parent.mkdir()
    shutil.copyfile(TRAINED, shipped)
    shutil.copyfile(card_path_for(TRAINED), card_path_for(shipped))
    _sign(shipped, key)
    drop = tmp_path / "drop"
    drop.mkdir(mode=0o755)
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0:guess-me\n")
    (drop / "link.onnx").symlink_to(secret)
    big = drop / "big.onnx"
    with big.open("wb") as f:  # 1 GiB, sparse: costs nothing unless someone reads it
        f.truncate(1 << 30)
    unsigned = make_policy(drop, "unsigned", seed=5)
    nocard = make_policy(drop, "nocard", seed=6)
    card_path_for(nocard).unlink()
    good = make_policy(drop, "good", seed=7, version="7.0.0")
    _sign(good, key)
    forged = _tamper(good, make_policy(tmp_path / "w", "w", seed=8), drop / "forged.onnx")

    d = DaemonProc(tmp_path, None, extra=(
        f"inference.model={shipped}", f"inference.update_dir={drop}",
        f'inference.trusted_keys=["{public}"]', "inference.max_model_bytes=1048576")).start()
    try:
        d.wait_ready()
        wait_until(lambda: _status_inference(d).get("model") is not None, 60, "policy loaded")
        assert _status_inference(d)["model"]["sha256"] == _sha(shipped)
        replies: list[dict[str, Any]] = []

        def update(uri: str, sha: str, code: str, why: str) -> None:
            r = d.socket_cmd("model.update", {"uri": uri, "sha256": sha}, timeout=30)
            replies.append(r)
            assert not r["ok"] and r["error"]["code"] == code and why in r["error"]["message"], r
            # the only hash a refusal may carry is the one the command sent
            assert set(HEX64.findall(json.dumps(r))) <= {sha}, r

        hwm0 = _vm_hwm_kib(d.proc.pid)  # type: ignore[union-attr]
        zero = "0" * 64
        update("/etc/passwd", zero, "bad_args", "only files directly inside")
        update(f"file://{secret}", zero, "bad_args", "only files directly inside")
        update(str(drop / ".." / "secret.txt"), zero, "bad_args", "only files directly inside")
        update(str(drop / "link.onnx"), zero, "bad_args", "symbolic link")
        update(str(big), zero, "bad_args", "larger than the limit")
        # the 1 GiB file was refused on its size, never read (it would be 1 GiB of RSS)
        assert _vm_hwm_kib(d.proc.pid) - hwm0 < 64 * 1024  # type: ignore[union-attr]
        update(str(unsigned), _sha(unsigned), "refused", "unsigned")
        update(str(nocard), _sha(nocard), "refused", "unsigned: the model has no card")
        update(str(forged), _sha(forged), "refused", "bad signature")
        update(str(good), zero, "refused", "sha256 mismatch")
        os.chmod(drop, 0o777)  # anyone could have put a file there
        update(str(good), _sha(good), "bad_args", "writable by group or others")
        os.chmod(drop, 0o755)
        os.chown(drop, 4321, -1)  # owned by someone else
        update(str(good), _sha(good), "bad_args", "owned by uid 4321")
        os.chown(drop, 0, -1)
        assert _status_inference(d)["model"]["sha256"] == _sha(shipped)  # nothing changed

        ok = d.socket_cmd("model.update", {"uri": str(good), "sha256": _sha(good)}, timeout=30)
        assert ok["ok"], ok
        assert ok["result"]["installed"] == {"name": "test-policy", "version": "7.0.0",
                                             "sha256": _sha(good)}
        assert _status_inference(d)["model"]["sha256"] == _sha(good)
    finally:
        d.stop()


def test_an_unsigned_configured_model_is_never_run_when_keys_are_set(tmp_path: Path) -> None:
    """Seeding the cache refuses it, and the daemon does not fall back to running the file
    directly: the rule-based expert decides until a signed model is installed."""
    _key, public = _keygen(tmp_path)
    # a task waits inference.model_wait_s only while the model loads: once the load is over
    # (refused here) it starts at once, not after 30 s (the command's timeout is 10 s)
    d = DaemonProc(tmp_path, None, extra=(
        f"inference.model={TRAINED}", f'inference.trusted_keys=["{public}"]',
        "inference.model_wait_s=30")).start()
    try:
        d.wait_ready()
        wait_until(lambda: bool(d.events("model_rejected")), 60, "the seed refused")
        assert "unsigned" in d.events("model_rejected")[0]["detail"]
        wait_until(lambda: d.socket_cmd("status")["result"]["background"].get("inference")
                   is not None, 60, "the policy stack settled")
        inf = _status_inference(d)
        assert inf.get("model") is None, inf
        started = d.socket_cmd("task.start", {"task": "pick_place"}, timeout=10)
        assert started["ok"] and started["result"]["policy"] == "rule", started
        assert "no policy model is ready" in started["result"].get("note", ""), started
    finally:
        d.stop()


def test_check_config_refuses_a_configured_model_the_keys_do_not_sign(tmp_path: Path) -> None:
    key, public = _keygen(tmp_path)
    model = tmp_path / "ship" / "policy.onnx"
    model.parent.mkdir()
    shutil.copyfile(TRAINED, model)
    shutil.copyfile(card_path_for(TRAINED), card_path_for(model))
    args = ["check-config", str(REPO / "configs" / "sim.toml"), "--sim", "--set",
            f"inference.model={model}", "--set", f'inference.trusted_keys=["{public}"]']
    r = _cli(*args)
    assert r.returncode == 1 and "inference.model" in r.stderr and "unsigned" in r.stderr, r
    _sign(model, key)
    r = _cli(*args)
    assert r.returncode == 0, r.stderr
