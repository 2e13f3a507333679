"""Benchmark: a latency regression during a model trial, from its onset to the rollback.

    python3 -m hil.bench_trial_rollback [--n 20] [--latency-ms 8] [--inject-at-s 1.0]

One real `edge-agent run --sim` daemon (hil/daemon_proc.py; no broker: every command goes over
the control socket). Each round: `model.update` installs a candidate (the trained policy with
another doc string: the same decisions, another sha256; from the second round with
`"allow_bad": true`, since the first rollback marked it bad), a task starts, `--inject-at-s`
into it `failure.inject model slow` makes each run of the candidate's session `--latency-ms`
longer (at the onnxruntime seam), and the bench waits for the trial's rollback. Printed per
round and as median / P99 / max: onset (the injection's reply) → rollback done (the trial
record's `ended_wall`), the daemon's own first slow decision → rollback, and verdict → rollback
(the pointer swap and the two session reloads). The same-run floor: the rule needs `MIN_SLOW`
slow decisions, so at `control.decision_hz` no rollback can come sooner than MIN_SLOW - 1
decision periods after the first slow decision; the ratio of the median to it is printed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from edge_agent.inference.trial_rules import MIN_SLOW
from hil.daemon_proc import Control, start_sim_daemon, stop_daemon, wait_for

ROOT = Path(__file__).resolve().parents[1]
TRAINED = ROOT / "models" / "pick-place-policy.onnx"
DECISION_HZ = 20.0  # configs/sim.toml control.decision_hz


def candidate(directory: Path) -> tuple[Path, str]:
    import hashlib

    import onnx

    model = onnx.load(str(TRAINED))
    model.doc_string = "bench_trial_rollback candidate"
    out = directory / "candidate.onnx"
    out.write_bytes(model.SerializeToString())
    sha = hashlib.sha256(out.read_bytes()).hexdigest()
    card = json.loads(TRAINED.with_name(TRAINED.stem + ".card.json").read_text())
    card.update(sha256=sha, version="bench-slow")
    card.pop("signature", None)
    out.with_name("candidate.card.json").write_text(json.dumps(card))
    return out, sha


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def summary(name: str, xs: list[float], unit: str = "s") -> str:
    if not xs:
        return f"{name}: no samples"
    return (f"{name}: median {statistics.median(xs):.3f} {unit}, P99 {pct(xs, 0.99):.3f}, "
            f"max {max(xs):.3f} (n={len(xs)})")


def one_round(ctl: Control, path: Path, sha: str, i: int, a: argparse.Namespace
              ) -> dict[str, Any]:
    r = ctl.call("model.update", uri=str(path), sha256=sha, **({"allow_bad": True} if i else {}))
    if not r.get("ok"):
        raise SystemExit(f"model.update refused: {r}")
    started = ctl.call("task.start", task="pick_place")
    if not started.get("ok"):
        raise SystemExit(f"task.start refused: {started}")
    time.sleep(a.inject_at_s)
    r = ctl.call("failure.inject", target="model", mode="slow", latency_ms=a.latency_ms,
                 duration_s=600)
    onset = time.time()
    if not r.get("ok"):
        raise SystemExit(f"failure.inject refused: {r}")
    wait_for(lambda: ctl.status()["model"]["trial"]["state"] == "rolled_back", 60, "rollback")
    t = ctl.status()["model"]["trial"]
    ctl.call("task.cancel")
    wait_for(lambda: ctl.status()["mode"] != "running", 60, "the task's end")
    ev = t["evidence"]
    return {"onset_to_rollback_s": t["ended_wall"] - onset,
            "first_slow_to_rollback_s": t["ended_wall"] - ev["first_slow_wall"],
            "reasons": t["verdict"]["reasons"], "slow": ev["slow"], "worst_ms": ev["worst_ms"],
            "restored": t["restored"]["sha256"] if t.get("restored") else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20, help="rounds (default: %(default)s)")
    ap.add_argument("--latency-ms", type=float, default=8.0,
                    help="the injected extra latency per run (default: %(default)s; the "
                         "trial's budget is inference.trial_latency_ms, 5 ms)")
    ap.add_argument("--inject-at-s", type=float, default=1.0,
                    help="seconds into the task before the injection (default: %(default)s)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-trial-") as tmp:
        state, drop = Path(tmp) / "state", Path(tmp) / "drop"
        state.mkdir()
        drop.mkdir()
        path, sha = candidate(drop)
        proc = start_sim_daemon(state, [
            "mqtt.port=1", "debug.failure_injection=true", f"inference.update_dir={drop}",
            "link.deadman_ms=1000", *(f"executor.l1_timeouts_s.{s}=60" for s in (
                "approach", "grasp", "lift", "transfer", "release", "retreat"))])
        ctl = Control(state)
        rounds: list[dict[str, Any]] = []
        try:
            wait_for(lambda: (ctl.status()["inference"] or {}).get("model"), 90,
                     "the policy model")
            wait_for(lambda: ctl.status()["link_up"], 60, "the link")
            for i in range(a.n):
                r = one_round(ctl, path, sha, i, a)
                rounds.append(r)
                print(f"round {i + 1}: onset -> rollback {r['onset_to_rollback_s']:.3f} s, "
                      f"first slow decision -> rollback {r['first_slow_to_rollback_s']:.3f} s, "
                      f"{r['slow']} slow decisions (worst {r['worst_ms']:.1f} ms)", flush=True)
            reports = sum(json.loads(p.read_text()).get("kind") == "model_rollback"
                          for p in (state / "reports").glob("*.json"))
        finally:
            stop_daemon(proc)
    onset = [r["onset_to_rollback_s"] for r in rounds]
    first = [r["first_slow_to_rollback_s"] for r in rounds]
    floor = (MIN_SLOW - 1) / DECISION_HZ
    print(summary("onset -> rollback", onset))
    print(summary("first slow decision -> rollback", first))
    print(f"floor (the rule's {MIN_SLOW} slow decisions at {DECISION_HZ:g} Hz): {floor:.3f} s; "
          f"median first slow -> rollback / floor: {statistics.median(first) / floor:.2f}x")
    print(f"rolled back {len(rounds)}/{a.n}, each to the trained policy: "
          f"{all(r['restored'] for r in rounds)}; model_rollback reports on disk {reports}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
