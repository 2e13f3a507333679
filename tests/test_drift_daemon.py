"""The drift report on a real --sim daemon (issue #28 item 5): filed on disk and on MQTT.

Run 1 decides with the trained policy (configs/sim.toml) under a long drift period and is
stopped; its counts are saved in <state_dir>/drift.json. Run 2 comes back with a short period —
the saved period has ended while it was down, so it files that period at once (the first one:
no reference) — and decides with an untrained policy (models/make_test_policy.py, seed 0: random
weights that ask to `advance` at nearly every decision), a different `--set inference.model`.
The machine's guard refuses an advance before its sub-goal holds, so the tasks still run, but
the action distribution is not the trained policy's (mostly `continue`). When run 2's period
ends the daemon files a drift report against run 1's period: verdict `drift`, on disk
(Markdown, JSON, the action-bar PNG) and on MQTT `report`; its counts are the journal's own
decisions of that period (read back from disk), and its KL is what they give.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProc
from inference_models import make_policy
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.reports.drift import DRIFT, TOO_FEW, compare, period_summary
from edge_agent.store.decisions import journal_dir, read_decisions

# Run 2's period holds its start-up and its tasks, and the test waits it out twice (run 1's
# period must end before run 2 starts): 12 s (up in ~2.5 s, ~180 decisions in it here, 12-08),
# or longer where run 1 came up slowly (a loaded VM: start-up up to ~15 s).
MIN_RUN2_PERIOD_S = 12.0
EXTRA = ("health.period_s=3600",)  # no broker_lost probing: only the reports counted here


def _up(d: DaemonProc) -> bool:
    st = d.socket_cmd("status")["result"]
    return bool(st["link_up"] and st["mqtt_connected"] and (st["journal"] or {}).get("enabled")
                and (st["inference"] or {}).get("model"))


def _keep_busy(d: DaemonProc, until: Callable[[], bool], timeout: float) -> None:
    """Start tasks back to back (a reset after a stop or a failed task) until `until()`."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, "timed out keeping the daemon busy"
        mode = d.socket_cmd("status")["result"]["mode"]
        if mode == "idle":
            d.socket_cmd("task.start", {})
        elif mode not in ("running", "starting"):
            d.socket_cmd("reset")
        wait_until(lambda: until() or d.socket_cmd("status")["result"]["mode"] != "running",
                   120, "the task to end")


def _drift_reports(d: DaemonProc) -> list[dict[str, Any]]:
    out = []
    for p in (d.state_dir / "reports").glob("*.json"):
        r = json.loads(p.read_text())
        if r.get("kind") == "drift":
            out.append(r)
    return sorted(out, key=lambda r: r["wall"])


def _journal_counts(state_dir: Path, start: float, end: float) -> dict[str, Any]:
    actions: dict[str, dict[str, int]] = {}
    for x in read_decisions(journal_dir(state_dir)):
        if start <= x.wall < end:
            row = actions.setdefault(x.state or "none", {})
            row[x.action or "none"] = row.get(x.action or "none", 0) + 1
    return {"actions": actions}


def test_a_shifted_policy_gives_a_drift_report_on_disk_and_mqtt(
        tmp_path: Path, broker: Mosquitto) -> None:
    operator = Probe(broker, "operator", "operator-pw")
    operator.connect()
    operator.subscribe("edge/dev1/report")
    t0 = time.monotonic()
    d1 = DaemonProc(tmp_path, broker, extra=(*EXTRA, "journal.drift_period_s=3600")).start()
    try:
        d1.wait_ready()
        wait_until(lambda: _up(d1), 90, "link, MQTT, journal and model up")
        run2_period_s = round(max(MIN_RUN2_PERIOD_S, 4 * (time.monotonic() - t0)), 1)
        _keep_busy(d1, lambda: sum(1 for _ in read_decisions(journal_dir(d1.state_dir))) >= 60,
                   300)
    finally:
        d1.stop()
    t1 = time.monotonic()
    saved = json.loads((d1.state_dir / "drift.json").read_text())
    run1 = sum(sum(r.values()) for r in saved["counts"]["actions"].values())
    assert run1 >= 60, saved  # the stop saved what run 1 counted
    # the saved period has ended by the time run 2 loads it (it is down across the boundary)
    wait_until(lambda: time.time() > saved["start"] + run2_period_s + 1, run2_period_s + 5,
               "run 1's period to be over")
    model = make_policy(tmp_path, "untrained", seed=0)
    d2 = DaemonProc(tmp_path, broker, extra=(
        *EXTRA, f"journal.drift_period_s={run2_period_s}", f'inference.model="{model}"')).start()
    try:
        d2.wait_ready()
        wait_until(lambda: len(_drift_reports(d2)) >= 1, 60, "run 1's period filed on return")
        first = _drift_reports(d2)[0]["details"]
        assert first["verdict"] == TOO_FEW and first["last"] is None  # no reference yet
        assert abs(first["this"]["start"] - saved["start"]) < 1e-3
        assert first["this"]["decisions"] == run1
        wait_until(lambda: _up(d2), 90, "link, MQTT, journal and the untrained model up")
        _keep_busy(d2, lambda: len(_drift_reports(d2)) >= 2, run2_period_s + 120)
        wait_until(lambda: d2.socket_cmd("status")["result"]["reports"]["delivered"].get(
            "mqtt", 0) >= 2, 60, "both drift reports on MQTT")
    finally:
        d2.stop()
    rep = _drift_reports(d2)[1]
    det = rep["details"]
    this, last = det["this"], det["last"]
    assert last == first["this"]  # run 1's period is the reference
    print(f"run 1: {run1} decisions in {t1 - t0:.1f} s; run 2: {this['decisions']} in "
          f"{this['end'] - this['start']:.1f} s")
    assert this["decisions"] >= 20, this  # run 2 decided in its period
    assert det["verdict"] == DRIFT and det["kl"] > det["threshold"], det
    # the counts are the journal's decisions of the period (a decision journaled in the
    # instant of the boundary may count in either period), and give the same KL
    journal = period_summary(_journal_counts(d2.state_dir, this["start"], this["end"]),
                             this["start"], this["end"], None)
    assert abs(journal["decisions"] - this["decisions"]) <= 3, (journal, this)
    again = compare(journal, last, det["threshold"])
    assert again["verdict"] == DRIFT and abs(again["kl"] - det["kl"]) < 0.05 * det["kl"] + 0.01
    # on disk: the Markdown states the figures, the plot is there
    md = (d2.state_dir / "reports" / f"{rep['id']}.md").read_text()
    assert "**drift**" in md and "| success rate |" in md and "| state | KL nats |" in md
    assert (d2.state_dir / "reports" / f"{rep['id']}.png").read_bytes()[:4] == b"\x89PNG"
    # on MQTT: the drift report with its plot (QoS 1: it was acknowledged, so it is here)
    msg = json.loads(operator.expect(lambda m: m.topic == "edge/dev1/report"
                                     and json.loads(m.payload)["id"] == rep["id"]).payload)
    assert msg["kind"] == "drift" and msg["plot"]["file"] == f"{rep['id']}.png"
    assert "**drift**" in msg["markdown"]
    assert all(f"| {s} |" in msg["markdown"] for s in det["drifted_states"])
