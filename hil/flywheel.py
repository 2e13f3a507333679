"""The data flywheel end to end: a real --sim daemon's tasks, labels over MQTT, export, fine-tune.

    python -m hil.flywheel [--tasks 200] [--label 30] [--faults mixed] [--out /tmp/flywheel]
        [--eval-episodes 4] [--epochs 30] [--seed 1] [--parent MODEL.onnx]

1. One real `edge-agent run --sim` daemon (hil/daemon_proc.py; the trained model decides) with a
   private Mosquitto (tests/mosquitto.py, the shipped ACL) runs `--tasks` pick-and-place tasks
   through hil.bench_degraded's `Bench` (a seeded cube pose, `task.start`, a fault injected with
   `failure.inject` while the task runs, the task's `task_done`). `--faults mixed`: each task draws
   one of `MIXED` (a third of them no fault); `none`: no fault.
2. An operator script labels `--label` episodes over MQTT (`journal.label`, the `operator` login):
   the failed episodes first, then seeded picks. It reads the episode's decisions from the
   journal (read-only) and asks the reference expert about each observation: a decision the
   expert would not have made is labelled `wrong` (its step); an episode with none is labelled
   `correct` when it succeeded, else `needs_work` (the decisions matched the expert: the failure
   is the fault's, not the policy's — nothing to relabel, and the fine-tune leaves it out).
3. `edge-agent journal export` (its own process, while the daemon still runs) writes the dataset;
   then the daemon stops.
4. models/finetune_policy.py fine-tunes the daemon's model on it; the candidate's card holds the
   held-out lock-step evaluation, parent vs candidate per fault class; the daemon's card checks
   (sha256, the session's signature, the observation layout) are run on the candidate.

Prints the dataset's size and export time, the fine-tune's time and the evaluation table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from edge_agent.comms.mqtt_common import Topics
from edge_agent.errors import EdgeAgentError
from hil.bench_degraded import Bench, Daemon, events, status
from hil.daemon_proc import ROOT, SIM_CONFIG, Control, stop_daemon, wait_for
from hil.degraded_faults import Fault
from hil.degraded_tally import Run

sys.path.insert(0, str(ROOT / "tests"))  # the private broker of the daemon tests

from mosquitto import Mosquitto, Probe

DEVICE, DEVICE_PW = "dev1", "dev1-secret-pw"
OPERATOR, OPERATOR_PW = "operator", "operator-pw"
PARENT = ROOT / "models" / "pick-place-policy.onnx"

# (fault, seconds after task.start it is injected); rig faults the daemon's failure.inject takes
MIXED: tuple[tuple[Fault, float], ...] = (
    (Fault("weak_close recoverable", "gripper", "weak_close", 8.0, severity=0.55), 0.5),
    (Fault("weak_close unrecoverable", "gripper", "weak_close", 8.0, severity=0.9), 0.5),
    (Fault("slip", "gripper", "slip", 0.3), 4.0),
    (Fault("wrist_force noise", "sensor:wrist_force", "noise", 6.0, severity=0.5), 0.5),
    (Fault("wrist_force spikes", "sensor:wrist_force", "spikes", 2.0, severity=1.0), 1.0),
    (Fault("camera dropout", "sensor:object_pose", "dropout", 0.5), 1.0),
    (Fault("gripper_position noise", "sensor:gripper_position", "noise", 6.0, severity=0.5),
     0.5),
)


class Unfreezer(threading.Thread):
    """The operator's part after a protective stop that froze a task (the deadman, on a loaded
    VM): reset, then resume the task, as hil.bench_degraded does for the stops it expects. Reads
    the daemon's log on its own (its own offset) and talks over fresh control connections."""

    def __init__(self, state_dir: Path) -> None:
        super().__init__(daemon=True)
        self.log, self.ctl, self.done = state_dir / "daemon.log", Control(state_dir), False
        self.resumed = 0

    def run(self) -> None:
        offset = 0
        while not self.done:
            time.sleep(0.2)
            with open(self.log, "rb") as f:
                f.seek(offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            offset += end
            for line in chunk[:end].splitlines():
                if b'"type": "task_frozen"' not in line:
                    continue
                with contextlib.suppress(ValueError, OSError, EdgeAgentError, SystemExit):
                    task_id = json.loads(line)["task_id"]
                    wait_for(lambda: self.ctl.call("reset")["ok"], 20, "reset")
                    if self.ctl.call("resume", task_id=task_id).get("ok"):
                        self.resumed += 1


def run_tasks(d: Daemon, broker: Mosquitto, a: argparse.Namespace) -> list[dict[str, Any]]:
    """`--tasks` tasks, each with its fault; one row per task (task_id, fault, outcome)."""
    rng = random.Random(a.seed)
    ns = argparse.Namespace(seed=a.seed, inject_at_s=1.0, timeout_s=60.0)
    bench = Bench(d, broker, ns)
    unfreeze = Unfreezer(d.dir)
    unfreeze.start()
    rows = []
    for i in range(a.tasks):
        pick = None
        if a.faults == "mixed" and rng.random() >= 1 / 3:
            pick = MIXED[rng.randrange(len(MIXED))]
        bench.settle()
        t0 = time.time()
        if pick is not None:
            ns.inject_at_s = pick[1]
        run = Run([], [], [], [], {}, {}, {})
        bench.task(pick[0] if pick else None, run)
        started = events(d, "task_started", t0)  # a timed-out task's task_done comes later
        rows.append({"task_id": started[0]["task_id"] if started else None,
                     "fault": pick[0].name if pick else "none", "outcome": run.outcomes[-1]})
        print(f"  task {i}: {rows[-1]['fault']}: {rows[-1]['outcome']}", flush=True)
    unfreeze.done = True
    print(f"tasks frozen by a protective stop, then reset and resumed: {unfreeze.resumed}")
    return rows


def label_over_mqtt(broker: Mosquitto, state_dir: Path, rows: list[dict[str, Any]],
                    n_episodes: int, seed: int) -> dict[str, int]:
    """The operator script: `n_episodes` episodes labelled with `journal.label` over MQTT."""
    from edge_agent.executor.policy import ExpertPolicy
    from edge_agent.policy_seam import Observation
    from edge_agent.store.decisions import journal_dir, read_decisions
    from edge_agent.vocab import State

    done = [r for r in rows if r["task_id"]]
    failed = [r for r in done if r["outcome"] != "success"]
    rest = [r for r in done if r["outcome"] == "success"]
    random.Random(seed).shuffle(rest)
    chosen = (failed + rest)[:n_episodes]
    wanted = {r["task_id"] for r in chosen}
    decisions: dict[str, list[Any]] = {t: [] for t in wanted}
    for dec in read_decisions(journal_dir(state_dir)):
        if dec.task_id is not None and dec.task_id in wanted:
            decisions[dec.task_id].append(dec)
    expert = ExpertPolicy()
    states = {s.value: s for s in State}
    op = Probe(broker, OPERATOR, OPERATOR_PW)
    if op.connect() != 0:
        raise SystemExit("the operator's MQTT login was refused")
    topics = Topics(f"edge/{DEVICE}")
    op.subscribe(topics.reply("journal.label"))
    counts = {"correct": 0, "wrong": 0, "needs_work": 0, "refused": 0}

    def label(**args: Any) -> None:
        cid = os.urandom(6).hex()
        op.publish(topics.cmd("journal.label"), json.dumps({"v": 1, "id": cid, **args}))
        reply = json.loads(op.expect(lambda m: json.loads(m.payload).get("id") == cid,
                                     timeout=30).payload)
        counts[args["verdict"] if reply.get("ok") else "refused"] += 1

    try:
        for r in chosen:
            wrong = []
            for dec in decisions[r["task_id"]]:
                if dec.action is None or dec.state not in states:
                    continue
                want = expert.decide(Observation(states[dec.state], dec.observation))
                if want is not None and want.name.lower() != dec.action:
                    wrong.append(dec.step)
            for step in wrong:
                label(task_id=r["task_id"], verdict="wrong", step=step,
                      note="the expert disagrees")
            if not wrong:
                label(task_id=r["task_id"],
                      verdict="correct" if r["outcome"] == "success" else "needs_work",
                      note=f"fault: {r['fault']}")
    finally:
        op.close()
    return counts


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                         check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(args[:3])} failed:\n{res.stdout}{res.stderr}")
    return res


def accepted_by_daemon_checks(model: Path) -> list[str]:
    """The daemon's card checks on the candidate: sha256, the session's signature, the layout."""
    import onnxruntime as ort

    from edge_agent.inference.model_card import (
        ModelCard,
        card_path_for,
        meaning_problems,
        sha256_file,
        signature_problems,
    )
    from edge_agent.policy_seam import OBS_FIELDS, Action

    card = ModelCard.load(card_path_for(model))
    problems = [] if sha256_file(model) == card.sha256 else ["sha256 differs from the card"]
    sess = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    problems += signature_problems(card, sess)
    problems += meaning_problems(card, [(f.name, f.unit) for f in OBS_FIELDS],
                                 [a.name.lower() for a in Action])
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--label", type=int, default=30, help="episodes the operator labels")
    ap.add_argument("--faults", choices=("mixed", "none"), default="mixed")
    ap.add_argument("--out", type=Path, default=Path("/tmp/flywheel"))
    ap.add_argument("--eval-episodes", type=int, default=4,
                    help="held-out lock-step episodes per fault class and model")
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--parent", type=Path, default=PARENT,
                    help="the model the daemon runs and the fine-tune starts from (default: the "
                         "shipped one; e.g. a weaker one from models/train_policy.py "
                         "--skip-class)")
    a = ap.parse_args(argv)
    a.parent = a.parent.resolve()
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a log file
    if a.out.exists():
        raise SystemExit(f"{a.out} exists: give another --out")
    state = a.out / "state"
    state.mkdir(parents=True)
    broker = Mosquitto(a.out / "mosquitto", {DEVICE: DEVICE_PW, OPERATOR: OPERATOR_PW})
    broker.start()
    d: Daemon | None = None
    t0 = time.monotonic()
    try:
        # a 1 s deadman, as tests/test_journal_label_daemon.py: on this loaded 2-core VM the
        # default tripped mid-approach (a protective stop; the task frozen to its timeout)
        d = Daemon(state, [f"device.id={DEVICE}", f"mqtt.port={broker.port}",
                           f'mqtt.password="{DEVICE_PW}"', f"inference.model={a.parent}",
                           "link.deadman_ms=1000"])
        dd = d
        wait_for(lambda: status(dd)["link_up"] and status(dd)["mqtt_connected"]
                 and (status(dd).get("inference") or {}).get("model"), 90,
                 "link, MQTT and the model up")
        rows = run_tasks(d, broker, a)
        t_tasks = time.monotonic() - t0
        ok = sum(r["outcome"] == "success" for r in rows)
        print(f"{len(rows)} tasks in {t_tasks:.0f} s ({ok} succeeded)")
        wait_for(lambda: (status(dd).get("journal") or {}).get("enabled"), 10, "the journal")
        time.sleep(1.0)  # the journal's writer thread: the last episode record on disk
        labels = label_over_mqtt(broker, state, rows, a.label, a.seed)
        print(f"labels over MQTT: {labels}")
        t1 = time.monotonic()
        exp = json.loads(cli("-m", "edge_agent.cli", "journal", "export", "--state-dir",
                             str(state), "--out", str(a.out / "dataset"), "--config",
                             str(SIM_CONFIG), "--json").stdout)
        t_export = time.monotonic() - t1
    finally:
        if d is not None:
            stop_daemon(d.proc)
        broker.stop()
    print(f"dataset: {exp['episodes']} episodes, {exp['frames']} frames, {exp['bytes']} bytes, "
          f"left out {exp['left_out']}; export {t_export:.1f} s (the daemon running)")
    t2 = time.monotonic()
    cand = a.out / "candidate.onnx"
    res = cli("models/finetune_policy.py", "--parent", str(a.parent), "--dataset",
              str(a.out / "dataset"), "--out", str(cand), "--seed", str(a.seed), "--epochs",
              str(a.epochs), "--eval-episodes", str(a.eval_episodes))
    t_train = time.monotonic() - t2
    card = json.loads(cand.with_name("candidate.card.json").read_text())
    tr = card["training"]
    ev = tr.pop("evaluation")
    print(res.stdout.rstrip())
    problems = accepted_by_daemon_checks(cand)
    print(f"fine-tune + evaluation {t_train:.0f} s; candidate {card['version']} "
          f"(unsigned); the daemon's card checks: {problems or 'accepted'}")
    from edge_agent.inference.model_card import sha256_file

    summary = {"parent": {"path": str(a.parent), "sha256": sha256_file(a.parent)},
               "tasks": len(rows), "succeeded": ok, "tasks_s": round(t_tasks),
               "labels": labels, "dataset": {k: exp[k] for k in ("episodes", "frames", "bytes")},
               "export_s": round(t_export, 1), "finetune_s": round(t_train),
               "targets": tr["targets"], "evaluation": ev, "card_problems": problems}
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    with contextlib.suppress(OSError):
        print(f"total {time.monotonic() - t0:.0f} s; {a.out / 'summary.json'}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
