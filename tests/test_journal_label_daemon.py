"""Issue 28 items 1 and 2 on a real daemon (`--sim`, the trained model, a private broker with the
shipped ACL): a task's decisions carry its id and steps, its episode record is written, an
operator labels a decision and the episode over MQTT, another device's login cannot, the robot's
own `edge-agent journal label` adds one beside the daemon, and `edge-agent journal labels`
reads them back (the last label wins)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import MQTT_USERS
from daemon_proc import JOURNAL_TASK_SETS, REPO, DaemonProc, wait_ready_for_tasks
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.comms.mqtt_common import Topics
from edge_agent.store.decisions import journal_dir, read_decisions

T1 = Topics("edge/dev1")  # its command and reply topics

SLOW = JOURNAL_TASK_SETS  # about the journal, not L1 nor the deadman (daemon_proc.py)


def _payload(msg: Any) -> dict[str, Any]:
    out = json.loads(msg.payload)
    assert isinstance(out, dict)
    return out


def _journal(state_dir: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    p = subprocess.run([sys.executable, "-m", "edge_agent.cli", "journal", *args,
                        "--state-dir", str(state_dir), "--json"], cwd=REPO, capture_output=True,
                       text=True, timeout=60)
    return p.returncode, [json.loads(line) for line in p.stdout.splitlines()], p.stderr


def _label(op: Probe, cid: str, **args: Any) -> dict[str, Any]:
    op.publish(T1.cmd("journal.label"), json.dumps({"v": 1, "id": cid, **args}))
    return _payload(op.expect(lambda m: m.topic == T1.reply("journal.label")
                              and _payload(m).get("id") == cid, timeout=30))


def test_a_task_is_an_episode_and_a_person_labels_it_over_mqtt(
        tmp_path: Path, broker: Mosquitto) -> None:
    op = Probe(broker, "operator", MQTT_USERS["operator"])
    assert op.connect() == 0
    op.subscribe("edge/dev1/#")
    d = DaemonProc(tmp_path, broker, extra=SLOW).start()
    try:
        d.wait_ready()
        wait_ready_for_tasks(d)
        op.publish(T1.cmd("task.start"), json.dumps({"v": 1, "id": "job-1"}))
        assert _payload(op.expect(T1.reply("task.start"), timeout=30))["ok"]
        done = _payload(op.expect(lambda m: m.topic == "edge/dev1/event"
                                  and _payload(m).get("type") == "task_done", timeout=90))
        assert done["task_id"] == "job-1" and done["outcome"] == "success", done

        # the episode record, once the journal's writer has it on disk
        sd = d.state_dir
        wait_until(lambda: any(e["task_id"] == "job-1" for e in _journal(sd, "episodes")[1]),
                   30, "the episode record")
        ep = next(e for e in _journal(sd, "episodes")[1] if e["task_id"] == "job-1")
        assert ep["outcome"] == "success" and ep["l3"] is False and ep["stops"] == []
        assert ep["attempts"] >= 6 and ep["l1"] == ep["l2"] == 0, ep
        assert ep["decisions"] > 0 and sum(ep["backends"].values()) == ep["decisions"], ep
        assert ep["model"] and len(ep["model"]["sha256"]) == 64, ep
        mine = [x for x in read_decisions(journal_dir(sd)) if x.task_id == "job-1"]
        assert [x.step for x in mine] == list(range(ep["decisions"]))
        assert {x.backend for x in mine} == set(ep["backends"])

        # labels over MQTT: a decision, then the whole episode; refusals say why
        r = _label(op, "l-1", task_id="job-1", verdict="wrong", step=1, note="grasped late")
        assert r["ok"] and r["result"]["label"]["step"] == 1, r
        r = _label(op, "l-2", task_id="job-1", verdict="correct")
        assert r["ok"] and r["result"]["label"]["by"] == "mqtt", r
        r = _label(op, "l-3", task_id="job-404", verdict="correct")
        assert not r["ok"] and r["error"]["code"] == "bad_args", r
        assert "unknown task_id 'job-404'" in r["error"]["message"]
        r = _label(op, "l-4", task_id="job-1", verdict="correct", step=ep["decisions"])
        assert not r["ok"] and "out of range" in r["error"]["message"], r
        r = _label(op, "l-5", task_id="job-1", verdict="meh")
        assert not r["ok"] and r["error"]["code"] == "bad_args", r

        # another device may not command this one (the shipped ACL): its label never lands
        dev2 = Probe(broker, "dev2", MQTT_USERS["dev2"])
        assert dev2.connect() == 0
        dev2.publish(T1.cmd("journal.label"), json.dumps(
            {"v": 1, "id": "intruder", "task_id": "job-1", "verdict": "wrong"}))
        dev2.close()

        # the robot's own CLI, while the daemon runs: the last label of step 1 wins
        rc, out, err = _journal(sd, "label", "job-1", "needs_work", "--step", "1",
                                "--note", "grip ok, slow")
        assert rc == 0 and out[0]["by"] == "cli", err
        rc, _, err = _journal(sd, "label", "job-404", "wrong")
        assert rc == 1 and "unknown task_id" in err
        r = _label(op, "l-6", task_id="job-1", verdict="correct", step=0)  # after the intruder
        assert r["ok"], r

        rc, labels, err = _journal(sd, "labels", "--task-id", "job-1")
        assert rc == 0, err
        got = {lab["step"]: (lab["verdict"], lab["note"], lab["by"]) for lab in labels}
        assert got == {1: ("needs_work", "grip ok, slow", "cli"), None: ("correct", None, "mqtt"),
                       0: ("correct", None, "mqtt")}, labels
        assert "intruder" not in json.dumps(d.lines[-200:])
    finally:
        d.stop()
        op.close()
