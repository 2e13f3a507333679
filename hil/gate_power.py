"""The gate's power, measured: how many paired episodes per class catch a true success drop.

    python -m hil.gate_power [--fault sensor:joint_encoders:noise] [--pool 100] [--drop 0.10]
        [--n 10,20,30,50,80,100] [--resamples 2000] [--jobs 2] [--out power.json]

1. A pool of `--pool` seeded episodes of one fault class (seeds 7e6 + ..., a class where the
   current model succeeds), run through the real harness (hil/policy_eval.py) twice: the
   current model, and a *sabotaged* candidate — the same model, except that on an exactly
   `--drop` fraction of the seeds (a seeded choice) every decision is `abort`
   (policy_eval.SabotagedPolicy). The pool's paired outcomes carry a true drop of `--drop`
   (less where the current model failed a sabotaged seed anyway: printed).
2. For each n, `--resamples` draws of n pairs (with replacement, seeded) go through the gate's
   own class rule (hil/gate_rules.class_verdict at --alpha, --margin): the detection rate is
   the fraction of draws the class fails. Beside it, the rate the binomial model predicts for
   the realized drop (b ~ Binomial(n, drop), c = 0), as a check of the measurement.

Minutes on a 2-core machine at the defaults (two x --pool episodes).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edge_agent.inference.gate_record import GATE_DEFAULTS
from hil import gate_rules

POWER_SEED_BASE = 7_000_000


def binomial_power(n: int, drop: float, rule: gate_rules.Rule) -> float:
    """P(the class fails) when b ~ Binomial(n, drop) and c = 0."""
    total = 0.0
    for b in range(n + 1):
        p = gate_rules.sign_test_p(b, 0)
        if p < rule.alpha and 100.0 * b / n >= rule.margin_points:
            total += math.comb(n, b) * drop ** b * (1 - drop) ** (n - b)
    return total


def measure(fault: str, pool: int, drop: float, ns: Sequence[int], resamples: int, jobs: int,
            rule: gate_rules.Rule, model: Path, seed: int = 0) -> dict[str, Any]:
    from hil.policy_eval import class_jobs, fault_class, run_jobs

    ci, fc = fault_class(fault)
    data = model.read_bytes()
    k = round(drop * pool)
    sabotaged = frozenset(random.Random(seed).sample(range(pool), k))
    t0 = time.monotonic()
    js = class_jobs(ci, fc, data, pool, POWER_SEED_BASE) + \
        class_jobs(ci, fc, data, pool, POWER_SEED_BASE, sabotaged)
    recs = run_jobs(js, jobs)
    wall = time.monotonic() - t0
    pairs = [(a.success, b.success) for a, b in zip(recs[:pool], recs[pool:], strict=True)]
    cur_ok = sum(a for a, _ in pairs)
    realized = sum(1 for a, b in pairs if a and not b) - sum(1 for a, b in pairs if b and not a)
    rng = random.Random(seed + 1)
    rows = []
    for n in ns:
        hits = sum(gate_rules.class_verdict(fault, rng.choices(pairs, k=n), rule)["verdict"]
                   == "fail" for _ in range(resamples))
        rows.append({"n": n, "detection_rate": round(hits / resamples, 4),
                     "binomial": round(binomial_power(n, realized / pool, rule), 4)})
    return {"fault": fault, "pool": pool, "sabotaged": k, "current_success_in_pool": cur_ok,
            "realized_drop_points": round(100.0 * realized / pool, 1),
            "resamples": resamples, "rule": rule.describe(),
            "min_worse_pairs_to_fail_with_no_better": gate_rules.min_discordant_to_fail(
                rule.alpha), "episodes_wall_s": round(wall, 1), "jobs": jobs,
            "model_sha256": _sha(data), "seed_base": POWER_SEED_BASE, "rows": rows}


def _sha(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


def main(argv: Sequence[str] | None = None) -> int:
    repo = Path(__file__).resolve().parents[1]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fault", default="sensor:joint_encoders:noise")
    ap.add_argument("--model", type=Path, default=repo / "models" / "pick-place-policy.onnx")
    ap.add_argument("--pool", type=int, default=100)
    ap.add_argument("--drop", type=float, default=0.10)
    ap.add_argument("--n", default="10,20,30,50,80,100")
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--alpha", type=float, default=GATE_DEFAULTS["alpha"])
    ap.add_argument("--margin", type=float, default=GATE_DEFAULTS["margin_points"])
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    try:
        ns = [int(x) for x in a.n.split(",") if x.strip()]
    except ValueError:
        ap.error("--n: comma-separated integers")
    if not 0 < a.drop < 1 or a.pool < 1 or any(n < 1 for n in ns):
        ap.error("--drop in (0, 1), --pool and every n >= 1")
    rule = gate_rules.Rule(alpha=a.alpha, margin_points=a.margin)
    try:
        r = measure(a.fault, a.pool, a.drop, ns, a.resamples, a.jobs, rule, a.model)
    except KeyError as exc:
        print(f"error: {exc.args[0]}", file=sys.stderr)
        return 2
    print(f"gate power, {r['fault']}: pool {r['pool']} paired episodes ({r['episodes_wall_s']:.0f}"
          f" s, {r['jobs']} jobs), current succeeded in {r['current_success_in_pool']}, "
          f"{r['sabotaged']} sabotaged -> realized drop {r['realized_drop_points']} points; "
          f"alpha {rule.alpha:g}, margin {rule.margin_points:g} points, "
          f"{r['resamples']} resamples per n")
    print(f"{'n pairs':>8s} {'detected':>9s} {'binomial':>9s}")
    for row in r["rows"]:
        print(f"{row['n']:8d} {100 * row['detection_rate']:8.1f}% {100 * row['binomial']:8.1f}%")
    if a.out:
        a.out.write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
