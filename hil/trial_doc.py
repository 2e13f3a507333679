"""The model trial's rollback report for docs/REPORTS.md (called by hil/make_reports_doc.py).

A daemon with the trained policy takes a candidate by `model.update` (the trained policy with
another doc string: the same decisions, another sha256), a task starts, and `failure.inject
model slow` makes each run of the candidate's session 8 ms slower — over the trial's 5 ms budget
(docs/MODELS.md): the trial rolls it back between two decisions and files the `model_rollback`
report. The task is then cancelled and the daemon stopped.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from hil.make_reports_doc import REPO, Daemon, reports_of, wait

TRAINED = REPO / "models" / "pick-place-policy.onnx"


def _candidate(directory: Path) -> tuple[Path, str]:
    import onnx

    model = onnx.load(str(TRAINED))
    model.doc_string = "a candidate for the reports doc"
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / "candidate.onnx"
    out.write_bytes(model.SerializeToString())
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    card = json.loads(TRAINED.with_name(TRAINED.stem + ".card.json").read_text())
    card.update(sha256=sha, version="1.0.1-rc1")
    card.pop("signature", None)
    out.with_name("candidate.card.json").write_text(json.dumps(card))
    return out, sha


def _rollbacks(state_dir: Path) -> list[str]:
    return [rid for rid, r in reports_of(state_dir).items() if r["kind"] == "model_rollback"]


def run_trial_rollback(state_dir: Path, sets: list[str]) -> None:
    drop = state_dir.parent / "candidates"
    path, sha = _candidate(drop)
    d = Daemon(state_dir, [*sets, "debug.failure_injection=true", f"inference.update_dir={drop}"])
    try:
        d.start()
        wait(lambda: bool((d.status().get("inference") or {}).get("model")), 90, "the model")
        r = d.cmd_("model.update", uri=str(path), sha256=sha)
        assert r.get("ok"), r
        assert d.cmd_("task.start", task="pick_place")["ok"]
        wait(lambda: d.status().get("state") == "approach", 60, "approach")
        r = d.cmd_("failure.inject", target="model", mode="slow", latency_ms=8, duration_s=120)
        assert r.get("ok"), r
        wait(lambda: bool(_rollbacks(state_dir)), 60, "the model_rollback report")
        d.cmd_("task.cancel")
    finally:
        d.stop()
