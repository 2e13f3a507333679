"""Issue 29 item 1 on the real daemon (--sim): `inference.require_gate` over `model.update`, and
the gate beside a running daemon.

The daemon runs with `inference.trusted_keys`, `inference.require_gate = true` and an update
directory; its configured model is the shipped one, signed. `edge-agent model gate --config`
(the daemon's config and overrides) takes the daemon's current model from its cache, lowers
itself to idle priority and asks the daemon's status over its control socket: it refuses to run
while a task runs. A candidate with the shipped weights in other bytes (a different sha256, the
same decisions) passes the gate. Signed without a gate record it is refused by model.update,
naming what is missing and what to run; a model whose record failed is refused with the
verdict; signed with its passing record it is installed.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import REPO, SIM_CONFIG, DaemonProc
from inference_models import make_policy
from mosquitto import wait_until

from edge_agent.config import load_config
from edge_agent.errors import ConfigError
from edge_agent.inference.model_card import card_path_for

TRAINED = REPO / "models" / "pick-place-policy.onnx"


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _model(d: DaemonProc) -> dict[str, Any] | None:
    inf = d.socket_cmd("status")["result"]["inference"] or {}
    return inf.get("model")


def _resaved(src: Path, out: Path) -> Path:
    """The same graph and weights in other bytes (a doc string): same decisions, new sha256."""
    import onnx

    m = onnx.load(str(src))
    m.doc_string = "resaved for the gate test"
    out.write_bytes(m.SerializeToString())
    card = json.loads(card_path_for(src).read_text())
    card.update(sha256=_sha(out), version="1.0.0+resaved")
    card_path_for(out).write_text(json.dumps(card))
    return out


def test_idle_priority_is_nice_19_and_sched_idle() -> None:
    code = ("import os, json; from hil.gate_host import lower_priority; d = lower_priority(); "
            "print(json.dumps([d, os.nice(0), os.sched_getscheduler(0) == os.SCHED_IDLE]))")
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                       timeout=60, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    done, nice, sched_idle = json.loads(r.stdout)
    assert done["priority"] == "idle" and done["nice"] == nice == 19
    assert done["sched"] == "SCHED_IDLE" and sched_idle


def test_require_gate_needs_trusted_keys() -> None:
    with pytest.raises(ConfigError, match=r"needs inference\.trusted_keys"):
        load_config(SIM_CONFIG, ["inference.require_gate=true"], sim=True)


def test_model_update_requires_a_passing_gate_record(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    key = tmp_path / "release.key"
    public = _cli("model", "keygen", "--out", str(key)).stdout.strip()
    shipped = tmp_path / "ship" / "policy.onnx"
    shipped.parent.mkdir()
    shutil.copyfile(TRAINED, shipped)
    shutil.copyfile(card_path_for(TRAINED), card_path_for(shipped))
    assert _cli("model", "sign", str(shipped), "--key", str(key)).returncode == 0
    drop = tmp_path / "drop"
    drop.mkdir(mode=0o755)
    good = _resaved(TRAINED, drop / "good.onnx")
    worse = make_policy(drop, "worse", seed=7, version="7.0.0")  # random weights
    sets = (f"inference.model={shipped}", f"inference.update_dir={drop}",
            f'inference.trusted_keys=["{public}"]', "inference.require_gate=true")
    d = DaemonProc(tmp_path, None, extra=sets).start()
    try:
        d.wait_ready()
        wait_until(lambda: _model(d) is not None, 60, "policy loaded")
        assert _model(d)["sha256"] == _sha(shipped)  # type: ignore[index]
        gate_sets = [a for s in (f"state_dir={d.state_dir}", *sets) for a in ("--set", s)]

        def gate(cand: Path, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
            # normal priority: at idle priority (the default with --config) the gate gets
            # no CPU on this shared machine while other tests run (as on a busy robot)
            return _cli("model", "gate", str(cand), "--config", str(SIM_CONFIG), *gate_sets,
                        "--episodes", "2", "--faults", "none", "--latency-observations", "200",
                        "--priority", "normal", "--out", str(out), *extra)

        # a task runs: the gate does not
        assert d.socket_cmd("task.start", {"task": "pick_place"})["ok"]
        busy = gate(good, tmp_path / "busy.json")
        assert busy.returncode == 1 and "the daemon runs task" in busy.stderr, busy.stderr
        assert not (tmp_path / "busy.json").exists()
        assert d.socket_cmd("task.cancel")["ok"]
        wait_until(lambda: not d.socket_cmd("status")["result"]["executor"]["task"], 30,
                   "task cancelled")

        r = gate(good, tmp_path / "good.json", "--journal", str(d.state_dir))
        assert r.returncode == 0, r.stdout + r.stderr
        rec = json.loads((tmp_path / "good.json").read_text())
        # the cancelled task's decisions, replayed: the same weights decide the same
        rp = rec["replay"]
        assert rp["decisions"] > 0 and rp["agreement"] == 1.0 and rp["differences"] == []
        assert sum(v["decisions"] for v in rp["by_state"].values()) == rp["decisions"]
        assert "journal replay" in r.stdout
        assert rec["current"]["sha256"] == _sha(shipped)  # the daemon's current, from its cache
        assert "model cache" in rec["current"]["from"]
        assert rec["host"]["priority"] == "normal"
        assert "no task running" in rec["host"]["daemon"]
        assert rec["latency"]["deadline_ms"] == 20.0

        def update(model: Path) -> dict[str, Any]:
            return d.socket_cmd("model.update", {"uri": str(model), "sha256": _sha(model)},
                                timeout=60)

        assert _cli("model", "sign", str(good), "--key", str(key)).returncode == 0
        no_gate = update(good)
        assert not no_gate["ok"] and no_gate["error"]["code"] == "refused", no_gate
        msg = no_gate["error"]["message"]
        assert "inference.require_gate" in msg and "no gate record" in msg
        assert "edge-agent model gate" in msg and "--gate" in msg

        w = gate(worse, tmp_path / "worse.json", "--alpha", "0.5")  # 2 of 2 worse: p = 0.25
        assert w.returncode == 1, w.stdout + w.stderr
        s = _cli("model", "sign", str(worse), "--key", str(key), "--gate",
                 str(tmp_path / "worse.json"))
        assert s.returncode == 0 and "require_gate refuses" in s.stderr
        failed = update(worse)
        assert not failed["ok"] and "verdict is 'fail'" in failed["error"]["message"], failed
        assert "none: worse" in failed["error"]["message"]
        assert _model(d)["sha256"] == _sha(shipped)  # type: ignore[index]

        s = _cli("model", "sign", str(good), "--key", str(key), "--gate",
                 str(tmp_path / "good.json"))
        assert s.returncode == 0, s.stderr
        ok = update(good)
        assert ok["ok"], ok
        assert ok["result"]["installed"]["sha256"] == _sha(good)
        assert _model(d)["sha256"] == _sha(good)  # type: ignore[index]
    finally:
        d.stop()
