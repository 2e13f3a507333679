"""Journal replay for the gate: candidate and current decide on every recorded observation.

Reads the daemon's decision journal (`<state_dir>/journal`, edge_agent/store/decisions.py;
read-only, safe while the daemon writes) — the most recent `max_decisions` decisions whose
observation has the policy's length, leaving out shadow decisions (a backend named `shadow...`:
a candidate's own, never acted on) — and runs both models on each observation (one batched
onnxruntime run per model). Reported: agreement overall and per executor state, how often the
current model agrees with what the journal recorded (the journal may come from another model),
and where the two differ: (state, current's action, candidate's action) with counts and a few
task_id/step examples. Informational: the replay has no pass/fail rule of its own (the journal
holds no outcome for a decision the robot did not take).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

MAX_DECISIONS = 200_000
MAX_DIFF_ROWS = 20
EXAMPLES = 3


def replay(state_dirs: Sequence[Path], current: bytes, candidate: bytes, *,
           max_decisions: int = MAX_DECISIONS) -> dict[str, Any]:
    import numpy as np

    from edge_agent.policy_seam import OBS_DIM, Action, action_from_scores
    from edge_agent.store.decisions import journal_dir, read_decisions
    from hil.policy_eval import OnnxPolicy

    kept: deque[Any] = deque(maxlen=max_decisions)
    skipped = {"shadow": 0, "obs_dim": 0, "undecodable": 0, "older_than_the_cap": 0}
    seen = 0
    for sd in state_dirs:
        d = journal_dir(sd)
        if not d.is_dir():
            raise FileNotFoundError(f"{sd}: no decision journal there ({d} is missing)")
        bad = [0]
        for dec in read_decisions(d, skipped=bad):
            if (dec.backend or "").startswith("shadow"):
                skipped["shadow"] += 1
            elif len(dec.observation) != OBS_DIM:
                skipped["obs_dim"] += 1
            else:
                seen += 1
                kept.append(dec)
        skipped["undecodable"] += bad[0]
    skipped["older_than_the_cap"] = seen - len(kept)
    out: dict[str, Any] = {"state_dirs": [str(s) for s in state_dirs], "decisions": len(kept),
                           "left_out": skipped}
    if not kept:
        return {**out, "agreement": None, "by_state": {}, "differences": []}
    x = np.asarray([d.observation for d in kept], dtype=np.float32)
    names = [a.name.lower() for a in Action]

    def actions(model: bytes) -> list[str | None]:
        scores = OnnxPolicy(model).scores(x)
        acts = [action_from_scores([float(s) for s in row]) for row in scores]
        return [names[int(a)] if a is not None else None for a in acts]

    cur, cand = actions(current), actions(candidate)
    per_state: dict[str, list[int]] = {}
    recorded = [0, 0]
    diffs: Counter[tuple[str, str | None, str | None]] = Counter()
    examples: dict[tuple[str, str | None, str | None], list[dict[str, Any]]] = {}
    for dec, a, b in zip(kept, cur, cand, strict=True):
        state = dec.state or "?"
        row = per_state.setdefault(state, [0, 0])
        row[0] += 1
        row[1] += int(a == b)
        if dec.action is not None:
            recorded[0] += 1
            recorded[1] += int(dec.action == a)
        if a != b:
            key = (state, a, b)
            diffs[key] += 1
            ex = examples.setdefault(key, [])
            if len(ex) < EXAMPLES:
                ex.append({"task_id": dec.task_id, "step": dec.step,
                           "recorded": dec.action})
    agree = sum(r[1] for r in per_state.values())
    return {**out, "agreement": round(agree / len(kept), 5),
            "current_vs_recorded": round(recorded[1] / recorded[0], 5) if recorded[0] else None,
            "by_state": {s: {"decisions": n, "agreement": round(k / n, 5)}
                         for s, (n, k) in sorted(per_state.items())},
            "differences": [{"state": s, "current": a, "candidate": b, "count": n,
                             "examples": examples[(s, a, b)]}
                            for (s, a, b), n in diffs.most_common(MAX_DIFF_ROWS)],
            "difference_kinds": len(diffs)}


def format_replay(r: dict[str, Any]) -> list[str]:
    if r["agreement"] is None:
        return [f"journal replay: no usable decision in {', '.join(r['state_dirs'])} "
                f"(left out: {r['left_out']})"]
    lines = [f"journal replay: {r['decisions']} recorded decisions, candidate agrees with "
             f"current on {100 * r['agreement']:.2f} %"
             + (f" (current vs recorded {100 * r['current_vs_recorded']:.2f} %)"
                if r.get("current_vs_recorded") is not None else "")]
    lines += [f"  {s:10s} {v['decisions']:7d} decisions  agreement {100 * v['agreement']:6.2f} %"
              for s, v in r["by_state"].items()]
    for d in r["differences"][:8]:
        ex = ", ".join(f"{e['task_id']}#{e['step']}" for e in d["examples"])
        lines.append(f"  differ in {d['state']}: current {d['current']} -> candidate "
                     f"{d['candidate']}: {d['count']} (e.g. {ex})")
    return lines
