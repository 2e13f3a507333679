"""Issue 28 item 3 on a real daemon (`--sim`, the trained model, a private broker): two tasks run,
a person labels one, and `edge-agent journal export` writes the LeRobotDataset while the daemon
keeps running — the daemon's journal stays on, its status answers, and the dataset holds both
episodes with the daemon's real observations, backends, outcomes and the label (and LeRobot
loads it where lerobot is installed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import MQTT_USERS
from daemon_proc import JOURNAL_TASK_SETS, REPO, DaemonProc, wait_ready_for_tasks
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.comms.mqtt_common import Topics
from edge_agent.store.decisions import journal_dir, read_decisions

T1 = Topics("edge/dev1")  # its command and reply topics

pq = pytest.importorskip("pyarrow.parquet")

SLOW = JOURNAL_TASK_SETS  # about the journal, not L1 nor the deadman (daemon_proc.py)


def _payload(msg: Any) -> dict[str, Any]:
    out = json.loads(msg.payload)
    assert isinstance(out, dict)
    return out


def _journal(state_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", "journal", *args,
                           "--state-dir", str(state_dir), "--json"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def _lerobot_python() -> str | None:
    """A Python with lerobot (test_journal_export.py's rule: this one or
    $EDGE_AGENT_LEROBOT_PYTHON)."""
    import importlib.util

    if importlib.util.find_spec("lerobot") is not None:
        return sys.executable
    return os.environ.get("EDGE_AGENT_LEROBOT_PYTHON") or None


def test_export_beside_a_running_sim_daemon(tmp_path: Path, broker: Mosquitto) -> None:
    op = Probe(broker, "operator", MQTT_USERS["operator"])
    assert op.connect() == 0
    op.subscribe("edge/dev1/#")
    d = DaemonProc(tmp_path, broker, extra=SLOW).start()
    try:
        d.wait_ready()
        wait_ready_for_tasks(d)
        sd = d.state_dir
        outcomes = {}
        for job in ("job-1", "job-2"):
            op.publish(T1.cmd("task.start"), json.dumps({"v": 1, "id": job}))
            assert _payload(op.expect(T1.reply("task.start"), timeout=30))["ok"]
            done = _payload(op.expect(lambda m: m.topic == "edge/dev1/event"
                                      and _payload(m).get("type") == "task_done", timeout=90))
            assert done["task_id"] == job, done
            outcomes[job] = done["outcome"]

            def recorded(job: str = job) -> bool:
                res = _journal(sd, "episodes")
                return any(json.loads(x)["task_id"] == job for x in res.stdout.splitlines())

            wait_until(recorded, 30, f"{job}'s episode record")
        assert _journal(sd, "label", "job-2", "wrong", "--step", "2").returncode == 0

        res = _journal(sd, "export", "--out", str(tmp_path / "ds"),  # the daemon still runs
                       "--config", str(REPO / "configs/sim.toml"))
        assert res.returncode == 0, res.stderr
        summary = json.loads(res.stdout)
        st = d.socket_cmd("status")["result"]
        assert st["journal"]["enabled"] and st["journal"]["errors"] == 0, st["journal"]
        assert summary["episodes"] == 2 and summary["fps"] == 20, summary  # control.decision_hz
        mine = [x for x in read_decisions(journal_dir(sd)) if x.task_id in ("job-1", "job-2")]
        assert summary["frames"] == len(mine)

        out = tmp_path / "ds"
        info = json.loads((out / "meta/info.json").read_text())
        card = json.loads((REPO / "models/pick-place-policy.card.json").read_text())
        assert info["features"]["observation.state"]["names"] == [
            f["name"] for f in card["inputs"][0]["fields"]]
        assert info["features"]["action"]["names"] == card["outputs"][0]["labels"]
        eps = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
        assert [e["task_id"] for e in eps] == ["job-1", "job-2"]
        assert [e["outcome"] for e in eps] == [outcomes["job-1"], outcomes["job-2"]]
        rec = json.loads(eps[0]["edge_agent_record"])
        assert rec["model"]["sha256"] == card["sha256"]
        data = pq.read_table(out / "data/chunk-000/file-000.parquet").to_pylist()
        job2 = data[eps[1]["dataset_from_index"]:eps[1]["dataset_to_index"]]
        cat = info["features"]["label.step"]["categories"]
        assert [r["label.step"] for r in job2[:4]] == [-1, -1, cat.index("wrong"), -1]
        backends = info["features"]["decision.backend"]["categories"]
        assert {backends[r["decision.backend"]] for r in data} == {
            b for e in eps for b in json.loads(e["edge_agent_record"])["backends"]}
        np.testing.assert_allclose([r["observation.state"] for r in data],
                                   [x.observation for x in mine], rtol=1e-6)
        python = _lerobot_python()
        if python is not None:  # where lerobot is installed, LeRobot itself loads it
            res = subprocess.run([python, "-m", "hil.load_lerobot", str(out)], cwd=REPO,
                                 capture_output=True, text=True, timeout=300,
                                 env={**os.environ, "PYTHONPATH": str(REPO),
                                      "HF_HOME": str(tmp_path / "hf")})
            assert res.returncode == 0, res.stdout + res.stderr[-3000:]
            assert json.loads(res.stdout.splitlines()[-1])["frames"] == len(mine)
    finally:
        d.stop()
        op.close()
