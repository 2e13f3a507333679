"""`model.update` on the running daemon (--sim, the trained policy configured): a model with a
wrong sha256 or a bad uri is refused and the model in use stays; a good one is verified,
installed atomically and decides from then on, the previous one kept as the `cached` fallback;
refused while a task runs; still active after a restart."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from daemon_proc import REPO, DaemonProc
from inference_models import make_policy
from mosquitto import wait_until

TRAINED = REPO / "models" / "pick-place-policy.onnx"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _inference(d: DaemonProc) -> dict[str, Any]:
    return dict(d.socket_cmd("status")["result"]["inference"] or {})


def test_model_update_verifies_installs_and_survives_a_restart(tmp_path: Path) -> None:
    drop = tmp_path / "drop"  # inference.update_dir: model.update reads only from here
    new = make_policy(drop, "candidate", seed=7, version="candidate-7")
    new_sha, trained_sha = _sha(new), _sha(TRAINED)
    d = DaemonProc(tmp_path, None, extra=(f"inference.update_dir={drop}",)).start()
    try:
        d.wait_ready()
        wait_until(lambda: _inference(d).get("model") is not None, 60, "policy loaded")
        assert _inference(d)["model"]["sha256"] == trained_sha

        bad = d.socket_cmd("model.update", {"uri": str(new), "sha256": "0" * 64})
        assert not bad["ok"] and bad["error"]["code"] == "refused", bad
        assert "sha256 mismatch" in bad["error"]["message"]
        assert new_sha not in bad["error"]["message"]  # never the hash of an unaccepted file
        for uri, why in (("candidate.onnx", "absolute"), ("https://example.com/m.onnx",
                                                          "does not download"),
                         (str(drop / "missing.onnx"), "no such file")):
            r = d.socket_cmd("model.update", {"uri": uri, "sha256": new_sha})
            assert not r["ok"] and r["error"]["code"] == "bad_args" and why in \
                r["error"]["message"], r
        assert _inference(d)["model"]["sha256"] == trained_sha  # nothing changed
        # mid-task: refused (the trained policy does not abort a healthy task)
        assert d.socket_cmd("task.start", {"task": "pick_place"})["ok"]
        busy = d.socket_cmd("model.update", {"uri": str(new), "sha256": new_sha})
        assert not busy["ok"] and busy["error"]["code"] == "busy", busy
        assert d.socket_cmd("task.cancel")["ok"]

        ok = d.socket_cmd("model.update", {"uri": new.as_uri(), "sha256": new_sha,
                                           "version": "candidate-7"}, timeout=30)
        assert ok["ok"], ok
        assert ok["result"]["installed"]["sha256"] == new_sha
        assert ok["result"]["installed"]["version"] == "candidate-7"
        assert _inference(d)["model"]["sha256"] == new_sha
        pointer = json.loads((d.state_dir / "models" / "active.json").read_text())
        models = sorted(p.name for p in (d.state_dir / "models").glob("*.onnx"))
        assert models == sorted([f"{new_sha}.onnx", f"{trained_sha}.onnx"]), models
        assert pointer["current"] == new_sha and pointer["previous"] == trained_sha, pointer

    finally:
        assert d.stop() == 0

    again = DaemonProc(tmp_path, None, extra=(f"inference.update_dir={drop}",)).start()
    try:
        again.wait_ready()
        wait_until(lambda: _inference(again).get("model") is not None, 60, "policy loaded")
        assert _inference(again)["model"]["sha256"] == new_sha, _inference(again)
    finally:
        again.stop()
