"""`edge-agent fleet status|estop|rollout` on five real daemons (one rig process serving five
ptys, no-spin fleet profile) behind a private Mosquitto with the documented ACL, as the operator.

In order, on one fleet (module fixture): status lists all five with their model; a rollout of
candidate A commits everywhere (canary 1, then one wave; the rollout drives one task per trial:
`inference.trial_tasks=1`); a rollout of candidate B whose wave fails on two of four robots (a
latency regression injected at the ONNX seam as each of them starts its trial: `failure.inject
model slow`, 40 ms against a trial budget of 15 ms) is aborted at 50 %, its two committed
robots are put back on A by `model.update` of `--previous`, the two failed ones are back on A
by their own trials, the canary keeps B; a rollout whose sha256 the robots refuse stops at the
canary; the fleet e-stop is confirmed by all five (and a repeated one by their latched
states). Heavy: 2 minutes at a load average of 5, nearly 4 at 25, on this 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edge_agent.comms.mqtt_common import Topics, to_payload
from hil.candidate_model import candidate
from hil.fleet_proc import ROOT, Fleet, wait

pytestmark = pytest.mark.slow
N = 5
TRAINED = ROOT / "models" / "pick-place-policy.onnx"


def _candidate(directory: Path, name: str) -> tuple[Path, str]:
    """The trained policy with another doc string: the same decisions, another sha256."""
    return candidate(directory, name, version=f"1.0.1-{name}", source=TRAINED)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("fleet")
    drop = tmp / "models"
    drop.mkdir(mode=0o755)
    a, sha_a = _candidate(drop, "cand-a")
    b, sha_b = _candidate(drop, "cand-b")
    with Fleet(tmp, n=N) as f:
        f.start_brokers()
        f.start_rig(fifo=40)  # the robots' firmware: not starved by the host under test
        f.start_daemons([f"inference.update_dir={drop}", "inference.trial_tasks=1",
                         "inference.trial_s=20", "debug.failure_injection=true",
                         # a loaded 2-core machine must not fail a good candidate's trial
                         "inference.trial_latency_ms=15"])
        yield {"fleet": f, "a": (a, sha_a), "b": (b, sha_b), "tmp": tmp}


def fleet_cli(f: Fleet, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", "fleet", *args,
                           *f.operator_args()], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout)


def status_rows(f: Fleet) -> dict[str, dict[str, Any]]:
    r = fleet_cli(f, "status", "--json")
    assert r.returncode == 0, r.stderr
    return {row["robot"]: row for row in json.loads(r.stdout)}


def current(row: dict[str, Any]) -> str | None:
    return ((row.get("model") or {}).get("current") or {}).get("sha256")


def reset_latched(f: Fleet) -> None:
    """Reset every robot whose state shows a stop (an overloaded machine can trip a protective
    stop: the link's deadman) until none does; resets are rate-limited, so retry."""
    c = f.client(0, "fleet-test-reset")
    try:
        for attempt in range(40):
            latched = [d for d, row in status_rows(f).items() if row["stop"]]
            if not latched:
                return
            for d in latched:
                c.publish(Topics(f"edge/{d}").cmd("reset"),
                          to_payload({"id": f"reset-{attempt}-{d}", "reason": "test"}), qos=1)
            time.sleep(1.2)
        raise AssertionError(f"still latched: {latched}")
    finally:
        c.loop_stop()
        c.disconnect()


def test_status_lists_every_robot(fleet: dict[str, Any]) -> None:
    f = fleet["fleet"]
    wait(lambda: all(current(r) for r in status_rows(f).values()), 120, "every model loaded")
    reset_latched(f)
    rows = status_rows(f)
    assert sorted(rows) == f.devices
    assert all(r["online"] and r["mode"] == "idle" and r["stop"] is None
               for r in rows.values()), rows
    text = fleet_cli(f, "status")
    assert text.returncode == 0
    lines = text.stdout.splitlines()
    assert lines[0].endswith(f"{N} robots: {N} online, 0 stopped, 0 degraded, 0 on trial"), lines
    assert sum(line.startswith("robot0") for line in lines) == N
    assert "pick-place-policy@1.0.0" in text.stdout


def test_rollout_commits_in_waves(fleet: dict[str, Any]) -> None:
    f, (a, sha_a) = fleet["fleet"], fleet["a"]
    reset_latched(f)
    report = fleet["tmp"] / "rollout-a"
    r = fleet_cli(f, "rollout", str(a), "--canary", "1", "--wave", "100%", "--abort-at", "50%",
                  "--drive-task", "pick_place", "--trial-timeout-s", "120",
                  "--report", str(report))
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    data = json.loads(report.with_suffix(".json").read_text())
    assert data["result"] == "completed"
    assert [len(w["robots"]) for w in data["waves"]] == [1, N - 1]
    assert all(rb["outcome"] == "committed" for w in data["waves"] for rb in w["robots"])
    assert all(rb["tasks_started"] >= 1 for w in data["waves"] for rb in w["robots"])
    assert "# Rollout of cand-a.onnx" in report.with_suffix(".md").read_text()
    assert all(current(row) == sha_a for row in status_rows(f).values())


def _inject_on_trial(f: Fleet, devices: set[str], sha: str) -> threading.Event:
    """As each of `devices` starts its trial of `sha`: a latency regression at the ONNX seam
    (40 ms, over the test's 15 ms trial budget) and a task, so that its decisions show it."""
    done = threading.Event()
    c = f.client(0, "fleet-test-injector")
    hit: set[str] = set()

    def on_message(client: Any, u: Any, m: Any) -> None:
        device = m.topic.split("/")[1]
        ev = json.loads(m.payload)
        if (device in devices and ev.get("type") == "model_trial_started"
                and ev.get("sha256") == sha):
            for name, body in (("failure.inject", {"target": "model", "mode": "slow",
                                                    "latency_ms": 40, "duration_s": 60}),
                               ("task.start", {"task": "pick_place"})):
                client.publish(Topics(f"edge/{device}").cmd(name),
                               to_payload({"id": f"inj-{device}-{name}", **body}), qos=1)
            hit.add(device)
            if hit == devices:
                done.set()

    c.on_message = on_message
    c.subscribe(Topics("edge/+").event, 1)
    return done


def test_rollout_aborted_wave_rolls_back(fleet: dict[str, Any]) -> None:
    f, (a, sha_a), (b, sha_b) = fleet["fleet"], fleet["a"], fleet["b"]
    reset_latched(f)
    failing = {"robot03", "robot04"}
    injected = _inject_on_trial(f, failing, sha_b)
    report = fleet["tmp"] / "rollout-b"
    # --drive-task: the canary and the good robots commit after their one trial task
    # (trial_tasks=1), not after waiting out inference.trial_s (20 s) twice
    r = fleet_cli(f, "rollout", str(b), "--canary", "1", "--wave", "100%", "--abort-at", "50%",
                  "--previous", str(a), "--drive-task", "pick_place", "--trial-timeout-s", "120",
                  "--report", str(report))
    print(r.stdout)
    assert injected.is_set()
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(report.with_suffix(".json").read_text())
    assert data["result"] == "aborted" and data["aborted_at_wave"] == 1, r.stdout
    runs = {rb["device"]: rb for w in data["waves"] for rb in w["robots"]}
    assert runs["robot00"]["outcome"] == "committed" and runs["robot00"]["rollback"] is None
    for d in ("robot01", "robot02"):
        assert runs[d]["outcome"] == "committed" and runs[d]["rollback"] == "restored", runs[d]
    for d in failing:
        assert runs[d]["outcome"] == "rolled_back", runs[d]
        assert runs[d]["rollback"] == "already_back"
    rows = status_rows(f)
    assert current(rows["robot00"]) == sha_b
    assert all(current(rows[d]) == sha_a for d in ("robot01", "robot02", *failing)), rows
    assert "ABORTED" in report.with_suffix(".md").read_text()


def test_rollout_refused_by_the_robots_aborts_at_the_canary(fleet: dict[str, Any]) -> None:
    """The daemons' own checks decide: bytes that are not the sha256 given are refused by the
    canary, the rollout stops there and nothing else is touched."""
    f, (a, _) = fleet["fleet"], fleet["a"]
    before = {d: current(row) for d, row in status_rows(f).items()}
    report = fleet["tmp"] / "rollout-refused"
    r = fleet_cli(f, "rollout", str(a), "--sha256", "0" * 64, "--canary", "1", "--wave", "50%",
                  "--abort-at", "50%", "--report", str(report))
    print(r.stdout)
    assert r.returncode == 1, r.stdout + r.stderr
    data = json.loads(report.with_suffix(".json").read_text())
    assert data["result"] == "aborted" and data["aborted_at_wave"] == 0
    canary = data["waves"][0]["robots"][0]
    assert canary["outcome"] == "refused" and canary["rollback"] == "untouched"
    assert "sha256" in canary["reason"], canary
    assert all(w["started"] is None for w in data["waves"][1:])
    assert {d: current(row) for d, row in status_rows(f).items()} == before


def test_fleet_estop_counts_every_robot(fleet: dict[str, Any]) -> None:
    f = fleet["fleet"]
    r = fleet_cli(f, "estop", "--deadline-s", "5")
    print(r.stdout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{N}/{N} robots confirmed the e-stop" in r.stdout
    # a repeated one: the latches hold already (no new message): their retained state answers
    r = fleet_cli(f, "estop", "--deadline-s", "5", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout)
    assert out["stopped"] == f.devices and out["no_answer"] == [] and out["confirmed"]
    assert {a["by"] for a in out["acks"].values()} == {"already_latched"}
    rows = status_rows(f)
    assert all((row["stop"] or {}).get("kind") == "estop" for row in rows.values())
