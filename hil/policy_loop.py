"""A candidate's whole path to the robot, end to end: gate, sign, shadow, update, trial, commit.

    python -m hil.policy_loop --candidate CAND.onnx [--current CUR.onnx] [--bad BAD.onnx]
        [--episodes 20] [--jobs 2] [--shadow-tasks 3] [--trial-tasks 5] [--out /tmp/policy-loop]

What a release engineer and an operator do, with the project's own commands (docs/MODELS.md):

1. `edge-agent model keygen`; `edge-agent model gate CANDIDATE --current CURRENT` (paired
   lock-step episodes per fault class, latency, the verdict); with `--bad`, the same gate on a
   candidate that must fail, and the classes it fails in.
2. `edge-agent model sign` of the current model (the robot loads only signed models) and of the
   candidate with `--gate RECORD` (the record bound into the signed card).
3. A real `edge-agent run --sim` daemon (a private Mosquitto, the shipped ACL) with the current
   model, `inference.trusted_keys` = the release key, `inference.require_gate = true`, and the
   candidate's directory as `inference.update_dir`.
4. Over MQTT as the `operator` login: `model.shadow` of the candidate, `--shadow-tasks` tasks,
   the shadow's agreement (status.model.shadow), `model.shadow` stop.
5. `model.update` of the candidate: on trial for `--trial-tasks` tasks, then `committed`.

Prints each step's figures and time and writes OUT/summary.json. Exit 0 when the candidate
passed the gate, shadowed, and committed (and `--bad`, if given, was refused by the gate).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from edge_agent.comms.mqtt_common import Topics
from hil.bench_degraded import Daemon, events, status
from hil.daemon_proc import ROOT, stop_daemon, wait_for

sys.path.insert(0, str(ROOT / "tests"))  # the private broker of the daemon tests

from mosquitto import Mosquitto, Probe

DEVICE, DEVICE_PW = "dev1", "dev1-secret-pw"
OPERATOR, OPERATOR_PW = "operator", "operator-pw"
SHIPPED = ROOT / "models" / "pick-place-policy.onnx"


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    res = subprocess.run([sys.executable, "-m", "edge_agent.cli", *args], cwd=ROOT,
                         capture_output=True, text=True, check=False,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if check and res.returncode != 0:
        raise SystemExit(f"edge-agent {' '.join(args[:3])} failed ({res.returncode}):\n"
                         f"{res.stdout}{res.stderr}")
    return res


def copy_model(src: Path, directory: Path, name: str) -> Path:
    """The model and its card (if any) as directory/name.onnx + name.card.json."""
    directory.mkdir(parents=True, exist_ok=True)
    dst = directory / f"{name}.onnx"
    shutil.copyfile(src, dst)
    card = src.with_name(src.stem + ".card.json")
    if card.exists():
        shutil.copyfile(card, dst.with_name(dst.stem + ".card.json"))
    return dst


def gate(candidate: Path, current: Path, out: Path, a: argparse.Namespace) -> dict[str, Any]:
    t0 = time.monotonic()
    res = cli("model", "gate", str(candidate), "--current", str(current), "--episodes",
              str(a.episodes), "--jobs", str(a.jobs), "--priority", "normal", "--out", str(out),
              check=False)
    if res.returncode not in (0, 1) or not out.exists():
        raise SystemExit(f"the gate did not run ({res.returncode}):\n{res.stdout}{res.stderr}")
    rec = json.loads(out.read_text())
    failed = [c["fault"] for c in rec["classes"] if c["verdict"] == "fail"]
    return {"verdict": rec["verdict"], "wall_s": round(time.monotonic() - t0),
            "failed_classes": failed, "reasons": rec["reasons"], "table": res.stdout}


class Operator:
    """The operator's MQTT session: one command, its reply."""

    def __init__(self, broker: Mosquitto) -> None:
        self.probe = Probe(broker, OPERATOR, OPERATOR_PW)
        if self.probe.connect() != 0:
            raise SystemExit("the operator's MQTT login was refused")
        self.topics = Topics(f"edge/{DEVICE}")
        self.probe.subscribe(self.topics.reply_filter)

    def cmd(self, name: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        cid = os.urandom(6).hex()
        self.probe.publish(self.topics.cmd(name), json.dumps({"v": 1, "id": cid, **args}))
        msg = self.probe.expect(lambda m: json.loads(m.payload).get("id") == cid,
                                timeout=timeout)
        return json.loads(msg.payload)  # type: ignore[no-any-return]

    def close(self) -> None:
        self.probe.close()


def run_tasks(d: Daemon, n: int) -> list[str]:
    """`n` pick-and-place tasks one after the other (control socket); their outcomes."""
    out = []
    for _ in range(n):
        t0 = time.time()
        r = d.socket_cmd("task.start", {"task": "pick_place"})
        if not r.get("ok"):
            raise SystemExit(f"task.start refused: {r}")
        tid = r["result"]["task_id"]

        def done(tid: str = tid, t0: float = t0) -> bool:
            return any(e.get("task_id") == tid for e in events(d, "task_done", t0))

        wait_for(done, 180, f"task {tid} done")
        ev = next(e for e in events(d, "task_done", t0) if e.get("task_id") == tid)
        out.append(str(ev["outcome"]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidate", type=Path, required=True)
    ap.add_argument("--current", type=Path, default=SHIPPED)
    ap.add_argument("--bad", type=Path, help="a candidate the gate must refuse")
    ap.add_argument("--episodes", type=int, default=20,
                    help="gate: paired episodes per fault class (the gate's default is 80)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--shadow-tasks", type=int, default=3)
    ap.add_argument("--trial-tasks", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("/tmp/policy-loop"))
    a = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a log file
    if a.out.exists():
        raise SystemExit(f"{a.out} exists: give another --out")
    a.out.mkdir(parents=True)
    summary: dict[str, Any] = {}
    key = a.out / "release.key"
    public = cli("model", "keygen", "--out", str(key)).stdout.splitlines()[0].strip()
    current = copy_model(a.current.resolve(), a.out / "current", "current")
    drop = a.out / "drop"
    candidate = copy_model(a.candidate.resolve(), drop, "candidate")
    os.chmod(drop, 0o755)

    print("1. gate: the candidate against the current model", flush=True)
    good = gate(candidate, current, a.out / "gate-candidate.json", a)
    print(good.pop("table").rstrip())
    summary["gate"] = good
    print(f"   verdict {good['verdict']} in {good['wall_s']} s")
    if a.bad is not None:
        print("1b. gate: the bad candidate")
        bad = gate(copy_model(a.bad.resolve(), a.out / "bad", "bad"), current,
                   a.out / "gate-bad.json", a)
        bad.pop("table")
        summary["gate_bad"] = bad
        print(f"   verdict {bad['verdict']} in {bad['wall_s']} s; failed classes: "
              f"{', '.join(bad['failed_classes']) or '-'}")
    if good["verdict"] != "pass":
        print(f"the candidate failed the gate: {good['reasons']}")
        (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return 1

    print("2. sign: the current model, and the candidate with its gate record")
    cli("model", "sign", str(current), "--key", str(key))
    cli("model", "sign", str(candidate), "--key", str(key), "--gate",
        str(a.out / "gate-candidate.json"))
    sha = cli("model", "verify", str(candidate), "--public-key", public).stdout.strip()
    print(f"   {sha.splitlines()[-1] if sha else ''}")

    state = a.out / "state"
    state.mkdir()
    broker = Mosquitto(a.out / "mosquitto", {DEVICE: DEVICE_PW, OPERATOR: OPERATOR_PW})
    broker.start()
    d: Daemon | None = None
    op: Operator | None = None
    ok = False
    try:
        d = Daemon(state, [f"device.id={DEVICE}", f"mqtt.port={broker.port}",
                           f'mqtt.password="{DEVICE_PW}"', f"inference.model={current}",
                           f'inference.trusted_keys=["{public}"]', "inference.require_gate=true",
                           f"inference.update_dir={drop}",
                           f"inference.trial_tasks={a.trial_tasks}",
                           "inference.shadow_report_after=100000", "link.deadman_ms=1000",
                           *(f"executor.l1_timeouts_s.{s}=60" for s in (
                               "approach", "grasp", "lift", "transfer", "release", "retreat"))])
        dd = d
        wait_for(lambda: status(dd)["link_up"] and status(dd)["mqtt_connected"]
                 and (status(dd).get("inference") or {}).get("model")
                 and (status(dd).get("journal") or {}).get("enabled"), 120,
                 "link, MQTT, the journal and the model up")
        op = Operator(broker)
        cand_sha = json.loads(candidate.with_name("candidate.card.json").read_text())["sha256"]

        print(f"3. shadow: the candidate beside the current model for {a.shadow_tasks} tasks")
        r = op.cmd("model.shadow", uri=str(candidate), sha256=cand_sha)
        if not r.get("ok"):
            raise SystemExit(f"model.shadow refused: {r}")
        outcomes = run_tasks(d, a.shadow_tasks)
        sh = (status(d).get("model") or {}).get("shadow") or {}
        r = op.cmd("model.shadow", stop=True)
        summary["shadow"] = {"tasks": outcomes, "decisions": sh.get("decisions"),
                             "agreement": sh.get("agreement"), "latency": sh.get("latency"),
                             "stopped": r.get("ok")}
        print(f"   tasks {outcomes}; {sh.get('decisions')} decisions, agreement "
              f"{sh.get('agreement')}")

        print(f"4. update: the candidate on trial for {a.trial_tasks} tasks")
        t0 = time.time()
        r = op.cmd("model.update", uri=str(candidate), sha256=cand_sha)
        if not r.get("ok"):
            raise SystemExit(f"model.update refused: {r}")
        outcomes = run_tasks(d, a.trial_tasks)
        wait_for(lambda: bool(events(dd, "model_committed", t0)
                              or events(dd, "model_rolled_back", t0)), 60, "the trial's end")
        model = status(d).get("model") or {}
        committed = bool(events(d, "model_committed", t0))
        summary["trial"] = {"tasks": outcomes, "committed": committed,
                            "current": (model.get("current") or {}).get("sha256"),
                            "s": round(time.time() - t0)}
        print(f"   tasks {outcomes}; {'committed' if committed else 'ROLLED BACK'}; current "
              f"model {(model.get('current') or {}).get('version')}")
        ok = committed and (model.get("current") or {}).get("sha256") == cand_sha
    finally:
        if op is not None:
            op.close()
        if d is not None:
            stop_daemon(d.proc)
        broker.stop()
    bad_refused = a.bad is None or summary["gate_bad"]["verdict"] == "fail"
    (a.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"summary: {a.out / 'summary.json'}")
    return 0 if ok and bad_refused else 1


if __name__ == "__main__":
    raise SystemExit(main())
