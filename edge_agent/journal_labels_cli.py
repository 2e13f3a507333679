"""`edge-agent journal episodes|label|labels`: the tasks' episode records and a person's labels.

    edge-agent journal episodes --state-dir D [--last 20]
    edge-agent journal label    --state-dir D TASK_ID correct|wrong|needs_work [--step N]
                                [--note TEXT]
    edge-agent journal labels   --state-dir D [--task-id T]

`label` is the robot-side twin of the MQTT `journal.label` command: the same checks (the task
must have an episode record in the journal, `--step` must be one of its decisions, the note is
bounded) and the same label file (store/labels.py: appended under a file lock, so it is safe
while the daemon runs and labels too). `labels` prints the label in force for each decision or
episode — the last one written wins. Exit 0: done; 1: refused (unknown task, bad step);
2: usage.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edge_agent.store.labels import MAX_NOTE, VERDICTS

EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


def add_parsers(jsub: Any) -> tuple[argparse.ArgumentParser, ...]:
    """Register the three actions on `journal`'s subparsers; returned for the shared options."""
    eps = jsub.add_parser("episodes", help="the tasks' episode records (outcome, L1/L2/L3, "
                                           "stops, degradation modes, model, backends)")
    eps.add_argument("--last", type=int, default=20, metavar="N",
                     help="the newest N episodes (default: %(default)s; 0: all)")
    lab = jsub.add_parser("label", help="label one decision (--step) or a whole episode")
    lab.add_argument("task_id", help="the task (episode) id: task.start's reply task_id")
    lab.add_argument("verdict", choices=VERDICTS)
    lab.add_argument("--step", type=int, default=None, metavar="N",
                     help="the decision's step in the episode (a report's decision table "
                          "shows it); without it the label is for the whole episode")
    lab.add_argument("--note", default=None, metavar="TEXT",
                     help=f"a short note (at most {MAX_NOTE} characters)")
    labs = jsub.add_parser("labels", help="the label in force per decision and episode")
    labs.add_argument("--task-id", default=None, metavar="T", help="only this task's labels")
    return eps, lab, labs


def run(a: argparse.Namespace, directory: Path, as_json: bool) -> int:
    from edge_agent.store.episodes import EpisodeLookup, read_episodes
    from edge_agent.store.labels import LabelError, LabelFile, latest_labels

    if a.journal_command == "label":
        if not directory.is_dir():
            print(f"error: no decision journal in {directory}", file=sys.stderr)
            return EXIT_USAGE
        try:
            rec = LabelFile(directory).append(
                {"task_id": a.task_id, "verdict": a.verdict, "note": a.note, "step": a.step,
                 "by": "cli"}, known=EpisodeLookup(directory).steps)
        except LabelError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_REFUSED
        _out(rec, as_json, f"labelled {_target(rec)} {rec['verdict']}")
        return EXIT_OK
    if a.journal_command == "episodes":
        eps = list(read_episodes(directory))
        if a.last > 0:
            eps = eps[-a.last:]
        for ep in eps:
            _out(ep, as_json, f"{ep['task_id']}: {ep.get('outcome')} "
                              f"({ep.get('decisions')} decisions, {ep.get('attempts')} attempts)")
        return EXIT_OK
    labels = [rec for (task_id, _), rec in latest_labels(directory).items()
              if a.task_id is None or task_id == a.task_id]
    for rec in labels:
        _out(rec, as_json, f"{_target(rec)}: {rec['verdict']}"
                           + (f" - {rec['note']}" if rec.get("note") else ""))
    return EXIT_OK


def _target(rec: dict[str, Any]) -> str:
    step = rec.get("step")
    return f"task {rec['task_id']}" + (f" step {step}" if step is not None else " (episode)")


def _out(rec: dict[str, Any], as_json: bool, line: str) -> None:
    print(json.dumps(rec) if as_json else line)
