"""`edge-agent journal`: the decision journal as a training dataset, and action-distribution drift.

    edge-agent journal export   --state-dir D --out DIR [--card C] [--config C | --fps N]
    edge-agent journal drift    --state-dir D [--window N] [--threshold 0.15]
    edge-agent journal episodes --state-dir D [--last N]
    edge-agent journal label    --state-dir D TASK_ID VERDICT [--step N] [--note TEXT]
    edge-agent journal labels   --state-dir D [--task-id T]

`episodes`, `label` and `labels` are journal_labels_cli.py's (episodes and a person's labels).
export and drift read the journal without repairing it, so they are safe while the daemon runs (a
torn last record is skipped). They run in their own process: dataset work never runs inside the
daemon.

`export` writes a LeRobotDataset v3 directory: one episode per finished task, one frame per
decision (edge_agent/dataset/, docs/FLYWHEEL.md). It needs pyarrow (the `dataset` extra), which
only this process imports.

`drift` compares the action distribution of the newest `window` decisions with the `window`
before them: KL(current ‖ reference) in nats, with add-½ (Jeffreys) smoothing so an action
unseen in one window gives a finite divergence. Exit 0: below the threshold; 1: drift; 2: usage
or too few decisions.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the parser is built by every `edge-agent` call: keep its imports light
    from edge_agent.store.decisions import Decision

ACTIONS = ("continue", "advance", "retry_alternative", "abort")
NO_DECISION = "none"
EXIT_OK, EXIT_DRIFT, EXIT_USAGE = 0, 1, 2
MIN_WINDOW = 20


def add_parser(sub: Any) -> None:
    """Register `journal export|drift` on the main parser's subparsers."""
    p = sub.add_parser("journal", help="decision journal: export a dataset, check for drift, "
                                       "episodes and labels",
                       description=__doc__.splitlines()[0])
    jsub = p.add_subparsers(dest="journal_command", metavar="ACTION", required=True)
    exp = jsub.add_parser("export", help="write the finished episodes as a LeRobotDataset v3 "
                                          "directory (needs pyarrow)")
    drift = jsub.add_parser("drift", help="KL divergence of the action distribution between the "
                                          "newest window and the one before it")
    from edge_agent.journal_labels_cli import add_parsers

    for q in (exp, drift, *add_parsers(jsub)):
        q.add_argument("--state-dir", required=True, metavar="D",
                       help="the daemon's state_dir (the journal is D/journal)")
        q.add_argument("--json", action="store_true",
                       help="print the result as JSON (the default when stdout is not a "
                            "terminal)")
    exp.add_argument("--out", required=True, metavar="DIR",
                     help="the LeRobotDataset v3 directory to write (must not exist)")
    exp.add_argument("--card", metavar="PATH",
                     help="the model card naming the observation fields and actions (default: "
                          "the executor's observation layout, which every card must match)")
    exp.add_argument("--fps", type=int, metavar="N",
                     help="the decision rate (default: --config's control.decision_hz, else "
                          "measured from the journal)")
    exp.add_argument("--config", metavar="PATH",
                     help="the daemon's config, read for control.decision_hz only")
    exp.add_argument("--force", action="store_true", help="replace DIR when it exists")
    drift.add_argument("--window", type=int, default=1000, metavar="N",
                       help="decisions per window (default: %(default)s)")
    drift.add_argument("--threshold", type=float, default=0.15, metavar="KL",
                       help="flag drift above this KL divergence, nats (default: %(default)s)")


def run(a: argparse.Namespace) -> int:
    """Entry point for the `journal` subcommand."""
    from edge_agent.store.decisions import journal_dir, read_decisions

    directory = journal_dir(a.state_dir)
    if a.journal_command in ("episodes", "label", "labels"):
        from edge_agent.journal_labels_cli import run as run_labels

        return run_labels(a, directory, a.json or not sys.stdout.isatty())
    if not directory.is_dir():
        print(f"error: no decision journal in {directory}", file=sys.stderr)
        return EXIT_USAGE
    as_json = a.json or not sys.stdout.isatty()
    if a.journal_command == "export":
        return _export(a, directory, as_json)
    return _drift(list(read_decisions(directory)), a.window, a.threshold, as_json)


def _show(rec: Mapping[str, Any], head: str, as_json: bool) -> None:
    """JSON for scripts; for a person a head line and the fields, one per line."""
    if as_json:
        print(json.dumps(rec))
        return
    print(head)
    for k, v in rec.items():
        print(f"  {k}: {v}")


# --------------------------------------------------------------------------- export


def _export(a: argparse.Namespace, directory: Path, as_json: bool) -> int:
    """The journal as a LeRobotDataset v3 directory (edge_agent/dataset/, docs/FLYWHEEL.md)."""
    import time

    try:
        import pyarrow  # noqa: F401  (the `dataset` extra: never the daemon's)
    except ImportError:
        print("error: journal export needs pyarrow: pip install 'edge-agent[dataset]'",
              file=sys.stderr)
        return EXIT_USAGE
    from edge_agent.dataset.episodes import config_fps, gather, measured_fps
    from edge_agent.dataset.lerobot import write_dataset

    if a.fps is not None and a.fps < 1:
        print("error: --fps must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    t0 = time.monotonic()
    obs_names: tuple[str, ...] | None = None
    action_names: tuple[str, ...] = ()
    cards: list[dict[str, Any]] = []
    if a.card is not None:
        from edge_agent.inference.model_card import ModelCard, ModelError

        try:
            card = ModelCard.load(Path(a.card))
        except ModelError as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_USAGE
        obs_names = tuple(n for n, _ in card.inputs[0].fields) or None
        action_names = card.outputs[0].labels
        cards.append({"name": card.name, "version": card.version, "sha256": card.sha256})
    g = gather(directory, obs_names, action_names)
    if not g.episodes:
        print(f"error: the journal holds no finished episode (decisions left out: "
              f"{g.left_out})", file=sys.stderr)
        return EXIT_USAGE
    fps, fps_from = a.fps, "given"
    if fps is None and a.config is not None:
        try:
            fps, fps_from = config_fps(Path(a.config)), f"control.decision_hz of {a.config}"
        except (OSError, ValueError) as e:
            print(f"error: --config {a.config}: {e}", file=sys.stderr)
            return EXIT_USAGE
    if fps is None:
        fps, fps_from = measured_fps(g), "measured"
    models = {json.dumps(e.record.get("model"), sort_keys=True) for e in g.episodes}
    provenance = {"state_dir": str(a.state_dir), "exported_wall": round(time.time(), 3),
                  "card": cards[0] if cards else None,
                  "models": [json.loads(m) for m in sorted(models)],
                  "fps": fps_from}
    try:
        rec = write_dataset(g, Path(a.out), fps, provenance, force=a.force)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    rec["seconds"] = round(time.monotonic() - t0, 3)
    _show(rec, f"wrote {rec['episodes']} episodes ({rec['frames']} decisions) to {a.out}",
          as_json)
    return EXIT_OK


# --------------------------------------------------------------------------- drift


def action_distribution(actions: Sequence[str | None], labels: Sequence[str],
                        alpha: float = 0.5) -> dict[str, float]:
    """Smoothed probabilities of `labels` (None counts as NO_DECISION)."""
    counts = Counter(a if a is not None else NO_DECISION for a in actions)
    total = len(actions) + alpha * len(labels)
    return {k: (counts.get(k, 0) + alpha) / total for k in labels}


def kl_divergence(p: Mapping[str, float], q: Mapping[str, float]) -> float:
    """KL(p ‖ q) in nats over p's labels (q must be > 0 wherever p is)."""
    return sum(pv * math.log(pv / q[k]) for k, pv in p.items() if pv > 0)


def drift_report(decisions: Sequence[Decision], window: int,
                 threshold: float) -> dict[str, Any] | None:
    """Compare the newest `window` actions with the `window` before (halves when fewer
    decisions exist); None when a window would hold fewer than MIN_WINDOW decisions."""
    acts = [d.action for d in decisions]
    w = min(window, len(acts) // 2)
    if w < MIN_WINDOW:
        return None
    ref, cur = acts[-2 * w : -w], acts[-w:]
    labels = sorted({*ACTIONS, NO_DECISION, *(a for a in ref + cur if a is not None)})
    p, q = action_distribution(cur, labels), action_distribution(ref, labels)
    kl = kl_divergence(p, q)
    return {"kl": round(kl, 6), "threshold": threshold, "drift": kl > threshold,
            "window": w, "records": len(acts),
            "reference": {k: round(v, 4) for k, v in q.items()},
            "current": {k: round(v, 4) for k, v in p.items()}}


def _drift(decisions: Sequence[Decision], window: int, threshold: float,
           as_json: bool) -> int:
    if window < MIN_WINDOW or not threshold > 0:
        print(f"error: --window must be >= {MIN_WINDOW} and --threshold > 0", file=sys.stderr)
        return EXIT_USAGE
    rep = drift_report(decisions, window, threshold)
    if rep is None:
        print(f"error: {len(decisions)} decisions: need at least {2 * MIN_WINDOW} for two "
              "windows", file=sys.stderr)
        return EXIT_USAGE
    verdict = "DRIFT" if rep["drift"] else "no drift"
    _show(rep, f"{verdict}: KL {rep['kl']:g} nats (threshold {threshold:g}) over the last "
               f"{rep['window']} decisions against the {rep['window']} before", as_json)
    return EXIT_DRIFT if rep["drift"] else EXIT_OK
