"""The model trial on the running daemon (--sim, the trained policy configured, a private broker;
commands over the control socket): after `model.update` the new model is on trial; a good one
commits after `inference.trial_tasks` tasks; a latency regression injected at the ONNX seam
(`failure.inject model slow`) rolls it back within its trial with a report and the bad mark, and
a later model.update of it is refused (unless `allow_bad`); kill -9 during a trial ends in a
rollback at the restart, with a report. The time from the regression's onset to the rollback is
printed (not asserted: a loaded machine)."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from daemon_proc import JOURNAL_TASK_SETS, REPO, DaemonProc, wait_ready_for_tasks
from mosquitto import Mosquitto, wait_until
from test_asyncapi import validator

TRAINED = REPO / "models" / "pick-place-policy.onnx"


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def same_policy_new_bytes(directory: Path, version: str) -> Path:
    """The trained policy with another doc string: the same decisions, another sha256 (a good
    candidate), with the trained card re-addressed to it."""
    import onnx

    model = onnx.load(str(TRAINED))
    model.doc_string = f"trial candidate {version}"
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"candidate-{version}.onnx"
    out.write_bytes(model.SerializeToString())
    card = json.loads(TRAINED.with_name(TRAINED.stem + ".card.json").read_text())
    card.update(sha256=_sha(out), version=version)
    card.pop("signature", None)
    out.with_name(out.stem + ".card.json").write_text(json.dumps(card))
    return out


def always_abort(directory: Path, version: str) -> Path:
    """A policy that proposes `abort` at every decision (the executor always accepts it): every
    task it decides ends aborted by the policy. Same inputs, outputs and card meaning."""
    from inference_models import policy_tool
    from onnx import numpy_helper

    tool = policy_tool()
    model = tool.build_mlp(seed=3)
    for init in model.graph.initializer:
        if init.name in ("W3", "b3"):
            zero = numpy_helper.to_array(init) * 0
            if init.name == "b3":
                zero[3] = 10.0  # Action.ABORT
            init.CopyFrom(numpy_helper.from_array(zero.astype("float32"), init.name))
    directory.mkdir(parents=True, exist_ok=True)
    out = directory / f"aborter-{version}.onnx"
    out.write_bytes(model.SerializeToString())
    card = tool.card_for(_sha(out), name="aborter", version=version, seed=3, hidden=64,
                         nan=False)
    out.with_name(out.stem + ".card.json").write_text(json.dumps(card))
    return out


def _model(d: DaemonProc) -> dict[str, Any]:
    """status.model, checked against docs/asyncapi.yaml's ModelStatus."""
    m = dict(d.socket_cmd("status")["result"]["model"])
    validator("#/components/schemas/ModelStatus").validate(m)
    return m


def _events(d: DaemonProc, kind: str) -> list[dict[str, Any]]:
    return [e for e in d.events("event") if e.get("type") == kind]


def _event(d: DaemonProc, kind: str) -> dict[str, Any]:
    """The first `kind` event in the daemon's log (waited for: the log is read on a thread)."""
    wait_until(lambda: bool(_events(d, kind)), 30, f"a {kind} event")
    return _events(d, kind)[0]


def _run_task(d: DaemonProc, timeout: float = 90) -> str:
    r = d.socket_cmd("task.start", {"task": "pick_place"})
    assert r["ok"], r
    task_id = r["result"]["task_id"]
    wait_until(lambda: any(e.get("task_id") == task_id for e in _events(d, "task_done")),
               timeout, f"task {task_id} done")
    done = next(e for e in _events(d, "task_done") if e.get("task_id") == task_id)
    return str(done["outcome"])


def _daemon(tmp_path: Path, broker: Mosquitto, drop: Path, *sets: str) -> DaemonProc:
    return DaemonProc(tmp_path, broker, extra=(f"inference.update_dir={drop}", *JOURNAL_TASK_SETS,
                                             "debug.failure_injection=true", *sets))


def _update(d: DaemonProc, path: Path, **extra: Any) -> dict[str, Any]:
    return d.socket_cmd("model.update", {"uri": str(path), "sha256": _sha(path), **extra},
                        timeout=60)


def _reports(d: DaemonProc, kind: str) -> list[dict[str, Any]]:
    out = []
    for p in (d.state_dir / "reports").glob("*.json"):
        rec = json.loads(p.read_text())
        if rec.get("kind") == kind:
            out.append(rec)
    return out


def test_a_good_model_commits_after_its_trial_tasks(
        tmp_path: Path, broker: Mosquitto) -> None:
    drop = tmp_path / "drop"
    good = same_policy_new_bytes(drop, "1.0.1-trial")
    d = _daemon(tmp_path, broker, drop, "inference.trial_tasks=2").start()
    try:
        d.wait_ready()
        wait_ready_for_tasks(d)
        m = _model(d)
        assert m["current"]["sha256"] == _sha(TRAINED) and m["trial"] is None, m
        assert m["shadow"] is None and m["bad"] == []
        ok = _update(d, good)
        assert ok["ok"], ok
        m = _model(d)
        t = m["trial"]
        assert m["current"] == {"name": "pick-place-policy", "version": "1.0.1-trial",
                                "sha256": _sha(good)}, m
        assert m["previous"]["sha256"] == _sha(TRAINED)
        assert t["state"] == "on_trial" and t["tasks_done"] == 0 and t["tasks_required"] == 2
        assert t["deadline_wall"] > time.time() and t["verdict"]["state"] == "on_trial", t
        assert _event(d, "model_trial_started")["sha256"] == _sha(good)
        # a second update while the trial runs is refused, saying why
        again = _update(d, good)
        assert not again["ok"] and "is on trial" in again["error"]["message"], again
        outcomes = [_run_task(d) for _ in range(2)]
        wait_until(lambda: _model(d)["trial"]["state"] == "committed", 30, "committed")
        t = _model(d)["trial"]
        assert t["verdict"]["by"] == "tasks" and t["evidence"]["tasks"] == 2, t
        assert t["evidence"]["successes"] == outcomes.count("success")
        assert t["evidence"]["attempts"] > 0  # the candidate's decisions were watched
        assert _event(d, "model_committed")["sha256"] == _sha(good)
        assert _model(d)["current"]["sha256"] == _sha(good)
        assert _reports(d, "model_rollback") == []
        # `edge-agent model status` finds the daemon as `edge-agent status` does
        cli = subprocess.run([sys.executable, "-m", "edge_agent.cli", "model", "status",
                              "--device", "dev1", "--json"], capture_output=True, text=True,
                             env=d.env, cwd=REPO, timeout=60, check=False)
        assert cli.returncode == 0, cli.stdout + cli.stderr
        printed = json.loads(cli.stdout)
        assert printed["trial"]["state"] == "committed" and printed["current"]["sha256"] == \
            _sha(good), printed
    finally:
        assert d.stop() == 0


def test_a_latency_regression_rolls_back_with_a_report_and_the_bad_mark(
        tmp_path: Path, broker: Mosquitto) -> None:
    drop = tmp_path / "drop"
    good = same_policy_new_bytes(drop, "1.0.2-slow")
    # 8 ms per decision: over the 5 ms budget, inside the 20 ms deadline (the router keeps
    # using the candidate's answers: only the trial sees it)
    d = _daemon(tmp_path, broker, drop, "inference.trial_tasks=20").start()
    try:
        d.wait_ready()
        wait_ready_for_tasks(d)
        assert _update(d, good)["ok"]
        r = d.socket_cmd("failure.inject", {"target": "model", "mode": "slow",
                                            "latency_ms": 8, "duration_s": 300})
        assert r["ok"], r
        onset = time.time()
        started = d.socket_cmd("task.start", {"task": "pick_place"})
        assert started["ok"], started
        wait_until(lambda: _model(d)["trial"]["state"] == "rolled_back", 60, "rolled back")
        m = _model(d)
        t = m["trial"]
        print(f"\nlatency regression (8 ms over a 5 ms budget) onset -> rollback: "
              f"{t['ended_wall'] - onset:.3f} s; first slow decision -> rollback "
              f"{_event(d, 'model_rolled_back')['first_slow_to_rollback_s']} s; verdict -> "
              f"rollback {_event(d, 'model_rolled_back')['verdict_to_rollback_ms']} ms")
        assert any("decision latency" in r for r in t["verdict"]["reasons"]), t
        assert t["evidence"]["slow"] >= 5 and t["evidence"]["worst_ms"] > 5.0, t
        assert m["current"]["sha256"] == _sha(TRAINED) and m["previous"] is None, m
        assert [b["sha256"] for b in m["bad"]] == [_sha(good)]
        assert t["restored"]["sha256"] == _sha(TRAINED)
        wait_until(lambda: bool(_reports(d, "model_rollback")), 30, "the rollback report")
        rep = _reports(d, "model_rollback")[0]
        assert "decision latency" in rep["title"] and rep["details"]["candidate"]["sha256"] \
            == _sha(good), rep
        md = next((d.state_dir / "reports").glob(f"{rep['id']}.md")).read_text()
        assert "allow_bad" in md
        d.socket_cmd("task.cancel")  # model.update is refused mid-task (busy)
        wait_until(lambda: any(e.get("task_id") == started["result"]["task_id"]
                               for e in _events(d, "task_done")), 60, "the task ended")
        refused = _update(d, good)
        assert not refused["ok"] and refused["error"]["code"] == "refused", refused
        assert "marked bad" in refused["error"]["message"] and "allow_bad" in \
            refused["error"]["message"], refused
        assert _model(d)["current"]["sha256"] == _sha(TRAINED)
        forced = _update(d, good, allow_bad=True)  # the operator's explicit override
        assert forced["ok"], forced
        t = _model(d)["trial"]
        assert t["state"] == "on_trial" and t["allow_bad"] is True and t["sha256"] == _sha(good)
    finally:
        assert d.stop() == 0


def test_kill_9_during_a_trial_rolls_back_at_the_restart(
        tmp_path: Path, broker: Mosquitto) -> None:
    drop = tmp_path / "drop"
    good = same_policy_new_bytes(drop, "1.0.3-crash")
    d = _daemon(tmp_path, broker, drop).start()
    try:
        d.wait_ready()
        wait_ready_for_tasks(d)
        assert _update(d, good)["ok"]
        assert _model(d)["trial"]["state"] == "on_trial"
        saved = json.loads((d.state_dir / "model_trial.json").read_text())
        assert saved["state"] == "on_trial" and saved["sha256"] == _sha(good)
    finally:
        d.stop(signal.SIGKILL)
    again = _daemon(tmp_path, broker, drop).start()
    try:
        again.wait_ready()
        wait_until(lambda: (again.socket_cmd("status")["result"]["inference"] or {}).get(
            "model") is not None, 60, "policy loaded")
        # (the rollback runs on the start-up thread before the sessions load: status may show
        # it `rolling_back` for a moment)
        wait_until(lambda: _model(again)["trial"]["state"] == "rolled_back", 30, "rolled back")
        m = _model(again)
        t = m["trial"]
        assert t["evidence"]["unclean_restarts"] == 1, t
        assert any("died during the trial" in r for r in t["verdict"]["reasons"]), t
        assert m["current"]["sha256"] == _sha(TRAINED), m
        assert (again.socket_cmd("status")["result"]["inference"]["model"]["sha256"]
                == _sha(TRAINED))
        assert [b["sha256"] for b in m["bad"]] == [_sha(good)]
        ev = _event(again, "model_rolled_back")
        assert ev["at_start"] is True and ev["to"]["sha256"] == _sha(TRAINED)
        wait_until(lambda: bool(_reports(again, "model_rollback")), 30, "the rollback report")
        assert "died during the trial" in _reports(again, "model_rollback")[0]["title"]
    finally:
        assert again.stop() == 0


def test_a_worse_success_rate_rolls_back_against_the_previous_models_record(
        tmp_path: Path, broker: Mosquitto) -> None:
    """The success rule end to end: five tasks of the trained policy are its record in the
    episode journal; a candidate that aborts every task is rolled back by the binomial test
    (p0 5/5, p_ref 0.90, level 0.05 / 10: after its third task, P = 0.001)."""
    from edge_agent.store.episodes import read_episodes

    drop = tmp_path / "drop"
    worse = always_abort(drop, "0.9.0-aborts")
    d = _daemon(tmp_path, broker, drop, "inference.trial_tasks=10").start()
    try:
        d.wait_ready()
        wait_ready_for_tasks(d)
        base = [_run_task(d) for _ in range(5)]
        assert base.count("success") >= 4, base  # the trained policy on the simulated robot
        wait_until(lambda: len(list(read_episodes(d.state_dir / "journal"))) >= 5, 30,
                   "the five episodes on disk")
        assert _update(d, worse)["ok"]
        t = _model(d)["trial"]
        assert t["baseline"] == {"episodes": 5, "successes": base.count("success")}, t
        outcomes: list[str] = []

        def judging() -> bool:  # the trial counted every task so far and its verdict is open
            wait_until(lambda: _model(d)["trial"]["tasks_done"] >= len(outcomes)
                       or _model(d)["trial"]["state"] != "on_trial", 30, "the task counted")
            t = _model(d)["trial"]
            return bool(t["state"] == "on_trial" and t["verdict"]["state"] == "on_trial")

        while judging():
            assert len(outcomes) < 10, outcomes
            outcomes.append(_run_task(d))
        wait_until(lambda: _model(d)["trial"]["state"] == "rolled_back", 30, "rolled back")
        m = _model(d)
        t = m["trial"]
        assert all(o == "aborted" for o in outcomes), outcomes
        assert any("task success 0/" in r for r in t["verdict"]["reasons"]), t
        s = t["verdict"]["success"]
        assert s["reject"] and s["p_value"] < s["level"] and s["n"] == len(outcomes), s
        assert m["current"]["sha256"] == _sha(TRAINED)
        wait_until(lambda: bool(_reports(d, "model_rollback")), 30, "the rollback report")
        print(f"\nsuccess rule: rolled back after {len(outcomes)} aborted tasks "
              f"(P = {s['p_value']:.4g} < {s['level']:.4g}); baseline {base}")
    finally:
        assert d.stop() == 0
