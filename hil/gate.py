"""`edge-agent model gate CANDIDATE.onnx`: the release gate, before a model reaches a robot.

    edge-agent model gate candidate.onnx [--current PATH | --config CFG] [--episodes 20]
        [--faults LABEL,...] [--journal STATE_DIR ...] [--jobs 2] [--out record.json]

1. Lock-step episodes: candidate and current on the simulated robot (hil/policy_eval.py), the
   same seeds for both (seed_base + class_index * 10000 + i), every fault class: paired
   outcomes per class, judged by hil/gate_rules.py (exact one-sided McNemar at alpha, a margin).
2. Decision latency: both as real onnxruntime sessions on the same observations, interleaved
   (hil/gate_latency.py); the candidate's P99 within budget and below the inference deadline.
3. With `--journal`, a replay of recorded decisions (hil/gate_replay.py): agreement overall and
   per executor state, and where they differ. Informational.

It writes an evaluation record (JSON) that `edge-agent model sign --gate` binds into the signed
card, and with `inference.require_gate` a robot installs only a model whose card holds a
passing one (edge_agent/inference/gate_record.py). Exit 0 pass, 1 fail (or refused to run),
2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hil import gate_rules
from hil.gate_host import HARNESS_VERSION, DaemonBusy, check_daemon, git_commit, lower_priority

REPO = Path(__file__).resolve().parents[1]


class Usage(Exception):
    """Bad arguments: exit 2 with the message."""


@dataclass(frozen=True, slots=True)
class Inputs:
    candidate: Path
    current: Path
    current_from: str
    deadline_ms: float
    intra_op_threads: int
    providers: tuple[str, ...]
    socket: Path | None


def resolve(a: argparse.Namespace) -> Inputs:
    """Which models, which deadline, which daemon (Usage on bad arguments)."""
    cand = Path(a.candidate)
    if not cand.is_file():
        raise Usage(f"candidate {cand}: no such file")
    deadline, threads, socket = 20.0, 1, None
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    current: Path | None = Path(a.current) if a.current else None
    origin = "--current"
    if a.config:
        from edge_agent.config import load_config
        from edge_agent.errors import ConfigError

        try:
            cfg = load_config(a.config, a.set, sim=True)
        except ConfigError as exc:
            raise Usage(f"--config {a.config}: {exc}") from None
        inf = cfg.inference
        deadline, threads, socket = inf.deadline_ms, inf.intra_op_threads, \
            cfg.state_dir / "control.sock"
        providers = tuple(p for p in inf.providers if p == "CPUExecutionProvider") or providers
        if current is None:
            current, origin = _configured_current(inf)
    if current is None:
        raise Usage("no current model to compare with: give --current PATH or --config CFG "
                    "(its model cache's current model, else inference.model)")
    if not current.is_file():
        raise Usage(f"current model {current}: no such file")
    return Inputs(cand, current, origin, deadline, threads, providers, socket)


def _configured_current(inf: Any) -> tuple[Path | None, str]:
    pointer = Path(inf.cache_dir) / "active.json"
    try:
        sha = json.loads(pointer.read_text()).get("current")
    except (OSError, ValueError):
        sha = None
    if isinstance(sha, str) and (Path(inf.cache_dir) / f"{sha}.onnx").is_file():
        return Path(inf.cache_dir) / f"{sha}.onnx", f"the model cache's current ({pointer})"
    if inf.model is not None:
        return Path(inf.model), "inference.model"
    return None, ""


def classes_for(faults: str | None) -> list[tuple[int, Any]]:
    from hil.policy_eval import FAULT_CLASSES, fault_class

    if not faults:
        return list(enumerate(FAULT_CLASSES))
    try:
        return [fault_class(f.strip()) for f in faults.split(",") if f.strip()]
    except KeyError as exc:
        raise Usage(str(exc.args[0])) from None


def _load_check(name: str, data: bytes) -> None:
    """The model loads and answers one observation with one score per action."""
    from edge_agent.policy_seam import OBS_DIM, Action
    from hil.policy_eval import OnnxPolicy

    try:
        out = OnnxPolicy(data).scores([[0.0] * OBS_DIM])
    except Exception as exc:
        raise ValueError(f"the {name} model does not load or run: {exc}") from None
    if out.shape != (1, len(Action)):
        raise ValueError(f"the {name} model answers shape {list(out.shape)}, not "
                         f"[1, {len(Action)}] (one score per action)")


def run_gate(inp: Inputs, *, episodes: int, classes: Sequence[tuple[int, Any]], jobs: int,
             seed_base: int, rule: gate_rules.Rule, journals: Sequence[Path],
             latency_n: int, host: dict[str, Any],
             log: Callable[[str], None]) -> dict[str, Any]:
    from edge_agent.inference.model_card import sha256_bytes
    from hil.policy_eval import CLASS_SEED_STRIDE, class_jobs, run_jobs

    t0 = time.monotonic()
    cur, cand = inp.current.read_bytes(), inp.candidate.read_bytes()
    _load_check("current", cur)
    _load_check("candidate", cand)
    rows, observations = [], []
    for ci, fc in classes:
        host["daemon"] = check_daemon(inp.socket)
        t1 = time.monotonic()
        js = class_jobs(ci, fc, cur, episodes, seed_base) + \
            class_jobs(ci, fc, cand, episodes, seed_base)
        recs = run_jobs(js, jobs)
        pairs = [(a.success, b.success) for a, b in zip(recs[:episodes], recs[episodes:],
                                                        strict=True)]
        row = gate_rules.class_verdict(fc.label, pairs, rule)
        row["outcomes_differ"] = sum(a.outcome != b.outcome for a, b in
                                     zip(recs[:episodes], recs[episodes:], strict=True))
        rows.append(row)
        observations += [v for r in recs[:episodes] for v in r.vectors]
        log(f"  {fc.label:38s} current {row['current_success']:3d}/{episodes}  candidate "
            f"{row['candidate_success']:3d}/{episodes}  {row['verdict']:13s} "
            f"({time.monotonic() - t1:.0f} s)")
    latency: dict[str, Any] | None = None
    lat_ok: bool | None = None
    lat_why = "not measured (no observation)"
    if observations and latency_n > 0:
        from hil.gate_latency import measure

        step = max(1, len(observations) // latency_n)
        latency = measure(cur, cand, observations[::step][:latency_n],
                          intra_op_threads=inp.intra_op_threads, providers=inp.providers)
        lat_ok, budget, lat_why = gate_rules.latency_verdict(
            latency["current"]["p99_ms"], latency["candidate"]["p99_ms"], rule)
        latency.update(budget_ms=round(budget, 4), deadline_ms=rule.deadline_ms,
                       verdict="pass" if lat_ok else "fail", why=lat_why)
    replay = None
    if journals:
        from hil.gate_replay import replay as run_replay

        replay = run_replay(journals, cur, cand)
    verdict, reasons = gate_rules.overall(rows, lat_ok, lat_why)
    card = _card_version(inp.candidate)
    return {
        "kind": "edge-agent gate record", "format": 1,
        "harness": {"version": HARNESS_VERSION, "git": git_commit(REPO)},
        "candidate": {"file": inp.candidate.name, "sha256": sha256_bytes(cand),
                      "version": card},
        "current": {"file": inp.current.name, "sha256": sha256_bytes(cur),
                    "version": _card_version(inp.current), "from": inp.current_from},
        "episodes_per_class": episodes,
        "seeds": {"base": seed_base, "class_stride": CLASS_SEED_STRIDE,
                  "episode": "base + class_index * class_stride + i, i < episodes_per_class; "
                             "the same for candidate and current"},
        "rule": rule.describe(), "classes": rows, "latency": latency, "replay": replay,
        "verdict": verdict, "reasons": reasons, "host": host, "jobs": jobs,
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                 time.gmtime(time.time() - (time.monotonic() - t0))),
        "wall_s": round(time.monotonic() - t0, 1), "cpu_s": _cpu_s()}


def _cpu_s() -> float:
    """CPU seconds of this process and its (joined) workers: the load-independent cost."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), \
        resource.getrusage(resource.RUSAGE_CHILDREN)
    return round(me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime, 1)


def _card_version(model: Path) -> str | None:
    from edge_agent.inference.model_card import ModelCard, ModelError, card_path_for

    try:
        return ModelCard.load(card_path_for(model)).version
    except (ModelError, OSError):
        return None


def format_record(r: dict[str, Any]) -> str:
    lines = [f"gate: candidate {r['candidate']['file']} ({r['candidate']['sha256'][:12]}) vs "
             f"current {r['current']['file']} ({r['current']['sha256'][:12]}), "
             f"{r['episodes_per_class']} paired episodes per class",
             f"{'fault class':38s} {'current':>8s} {'cand.':>8s} {'worse':>6s} {'better':>6s} "
             f"{'p':>8s}  verdict"]
    for c in r["classes"]:
        n = c["episodes"]
        lines.append(f"{c['fault']:38s} {c['current_success']:4d}/{n:<3d} "
                     f"{c['candidate_success']:4d}/{n:<3d} {c['current_only']:6d} "
                     f"{c['candidate_only']:6d} {c['p_value']:8.3g}  {c['verdict']}")
    lat = r["latency"]
    if lat:
        lines.append(f"latency (ms, {lat['observations']} observations x {lat['repeats']} "
                     f"interleaved, best per observation): current "
                     f"P50 {lat['current']['p50_ms']:.3f} P99 {lat['current']['p99_ms']:.3f} "
                     f"max {lat['current']['max_ms']:.3f}; candidate P50 "
                     f"{lat['candidate']['p50_ms']:.3f} P99 {lat['candidate']['p99_ms']:.3f} "
                     f"max {lat['candidate']['max_ms']:.3f}; budget {lat['budget_ms']:.3f}: "
                     f"{lat['verdict']} (raw P99 current {lat['current']['raw']['p99_ms']:.3f}, "
                     f"candidate {lat['candidate']['raw']['p99_ms']:.3f})")
    if r["replay"] is not None:
        from hil.gate_replay import format_replay

        lines += format_replay(r["replay"])
    lines.append(f"verdict: {r['verdict'].upper()} ({r['wall_s']:.0f} s wall, "
                 f"{r['cpu_s']:.0f} s CPU, {r['jobs']} process(es))")
    lines += [f"  - {why}" for why in r["reasons"]]
    return "\n".join(lines)


def main(a: argparse.Namespace) -> int:
    try:
        if a.episodes < 1 or a.jobs < 1:
            raise Usage("--episodes and --jobs must be >= 1")
        if not 0 < a.alpha < 1 or a.margin < 0:
            raise Usage("--alpha must be in (0, 1) and --margin >= 0")
        if a.set and not a.config:
            raise Usage("--set overrides keys of --config: give --config")
        inp = resolve(a)
        classes = classes_for(a.faults)
        journals = [Path(j) for j in a.journal]
        for j in journals:
            if not j.is_dir():
                raise Usage(f"--journal {j}: not a directory (the daemon's state_dir)")
    except Usage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # before anything else (and before idle priority: the answer comes at once)
        first = check_daemon(inp.socket)
    except DaemonBusy as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    idle = a.priority == "idle" or (a.priority == "auto" and a.config is not None)
    host = lower_priority() if idle else {"priority": "normal"}
    host["daemon"] = first
    rule = gate_rules.Rule(alpha=a.alpha, margin_points=a.margin, deadline_ms=inp.deadline_ms)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    log(f"gate: {len(classes)} fault classes x {a.episodes} paired episodes, {a.jobs} "
        f"process(es); priority {host['priority']}; {host['daemon']}")
    try:
        record = run_gate(inp, episodes=a.episodes, classes=classes, jobs=a.jobs,
                          seed_base=a.seed_base, rule=rule, journals=journals,
                          latency_n=a.latency_observations, host=host, log=log)
    except DaemonBusy as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(format_record(record))
    if a.out:
        from edge_agent.store.atomic import write_atomic

        write_atomic(a.out, (json.dumps(record, indent=2) + "\n").encode(), mode=0o644)
        print(f"record: {a.out}")
    return 0 if record["verdict"] == "pass" else 1
