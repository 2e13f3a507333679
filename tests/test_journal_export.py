"""Issue 28 item 3: `edge-agent journal export` writes a LeRobotDataset v3 directory. The journal is
written by the store's real writers (DecisionJournal with its episode mark, episode records,
LabelFile); the export runs as its own process (the CLI) and is read back with pyarrow against
LeRobot's v3 layout (lerobot/datasets/utils.py: paths, info.json, stats, tasks, episodes)."""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import subprocess
import sys
import threading
import tomllib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from edge_agent.policy_seam import OBS_DIM, OBS_FIELDS  # noqa: E402
from edge_agent.store.decisions import DecisionJournal, journal_dir  # noqa: E402
from edge_agent.store.episodes import EpisodeMark  # noqa: E402
from edge_agent.store.labels import LabelFile  # noqa: E402
from edge_agent.store.statelock import StateDirLock  # noqa: E402
from edge_agent.vocab import EventType  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
ACTS = ["continue", "advance", "retry_alternative", "abort"]
STATS = ("min", "max", "mean", "std", "count", "q01", "q10", "q50", "q90", "q99")
ARROW = {"float32": pa.float32(), "float64": pa.float64(), "int64": pa.int64(),
         "bool": pa.bool_()}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", "journal", *args],
                          capture_output=True, text=True, cwd=REPO, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": str(REPO)})


class Robot:
    """Writes a journal the way the daemon does: the mark stamps each decision's task and step;
    a task's end leaves its episode record."""

    def __init__(self, state_dir: Path, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.dj = DecisionJournal(journal_dir(state_dir))
        self.dj.open()
        self.mark = EpisodeMark()
        self.dj.episode = self.mark
        self.t = 1000.0
        self.written: dict[str, list[dict[str, Any]]] = {}

    def decide(self, task_id: str | None) -> dict[str, Any]:
        self.t += 0.05  # control.decision_hz = 20
        rec = {"t": self.t, "observation": [self.rng.uniform(-2, 2) for _ in range(OBS_DIM)],
               "action": self.rng.choice([*ACTS, None]), "backend": "onnx-cpu",
               "latency_ms": self.rng.uniform(0.1, 2.0), "outcome": "ok", "state": "grasp",
               "accepted": self.rng.random() < 0.8}
        if rec["action"] is None:
            rec["backend"], rec["outcome"] = None, "no_decision"
        assert self.dj.record(rec)
        if task_id is not None:
            self.written.setdefault(task_id, []).append(rec)
        return rec

    def task(self, task_id: str, steps: int, outcome: str | None = "success",
             name: str = "pick_and_place") -> None:
        self.mark.follow({"type": EventType.TASK_STARTED, "task_id": task_id})
        for _ in range(steps):
            self.decide(task_id)
        if outcome is None:  # still running
            return
        self.mark.follow({"type": EventType.TASK_DONE, "task_id": task_id})
        n, backends = self.mark.counts(task_id)
        assert self.dj.flush(10)
        assert self.dj.record_episode({"task_id": task_id, "task": name, "outcome": outcome,
                                       "decisions": n, "backends": backends, "attempts": 1,
                                       "l1": 0, "l2": 0, "l3": False, "model": None})
        assert self.dj.flush(10)


def _journal(state_dir: Path) -> Robot:
    r = Robot(state_dir)
    for _ in range(5):
        r.decide(None)  # outside any task: left out
    r.task("job-0", 30, "success")
    r.task("job-1", 12, "failed")
    r.task("job-2", 25, "aborted", name="stack")
    r.task("job-3", 40, "success")
    r.task("job-4", 7, None)  # running: left out
    r.dj.stop()
    labels = LabelFile(journal_dir(state_dir))
    labels.append({"task_id": "job-1", "verdict": "wrong", "step": 3, "note": "let go"})
    labels.append({"task_id": "job-1", "verdict": "needs_work", "step": 3})  # the last wins
    labels.append({"task_id": "job-3", "verdict": "correct"})
    return r


def _export(state_dir: Path, out: Path, *extra: str) -> dict[str, Any]:
    res = _cli("export", "--state-dir", str(state_dir), "--out", str(out), "--json", *extra)
    assert res.returncode == 0, res.stdout + res.stderr
    return dict(json.loads(res.stdout))


def test_export_reads_back_in_the_lerobot_v3_layout(tmp_path: Path) -> None:
    robot = _journal(tmp_path / "state")
    out = tmp_path / "ds"
    summary = _export(tmp_path / "state", out)
    assert summary["episodes"] == 4 and summary["frames"] == 30 + 12 + 25 + 40
    assert summary["left_out"]["no_task"] == 5 and summary["left_out"]["running"] == 7
    assert summary["fps"] == 20  # measured: the decision rate

    info = json.loads((out / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == 20
    assert info["data_path"] == "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    assert (info["total_episodes"], info["total_frames"], info["total_tasks"]) == (4, 107, 2)
    assert info["chunks_size"] == 1000 and info["data_files_size_in_mb"] == 100
    assert info["splits"] == {"train": "0:4"}
    feats = info["features"]
    assert feats["observation.state"]["names"] == [f.name for f in OBS_FIELDS]
    assert feats["action"]["names"] == ACTS
    assert feats["label.step"]["categories"] == ["correct", "wrong", "needs_work"]

    episodes = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    data = []
    for ep in episodes:  # every episode's file through the path template
        path = out / info["data_path"].format(chunk_index=ep["data/chunk_index"],
                                              file_index=ep["data/file_index"])
        table = pq.read_table(path)
        assert set(table.column_names) == set(feats)  # info.json's features are the schema
        for name, ft in feats.items():
            typ = table.schema.field(name).type
            want = ARROW[ft["dtype"]]
            if ft["shape"] == [1]:
                assert typ == want, name
            else:
                assert typ == pa.list_(want, ft["shape"][0]), name
        data = table.to_pylist()
    assert len(data) == 107 and [r["index"] for r in data] == list(range(107))
    rel = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert rel == ["data/chunk-000/file-000.parquet", "meta/edge_agent.json",
                   "meta/episodes/chunk-000/file-000.parquet", "meta/info.json",
                   "meta/stats.json", "meta/tasks.parquet"]

    # episodes: index ranges cover the rows exactly, in order, each one task's decisions
    assert [e["episode_index"] for e in episodes] == [0, 1, 2, 3]
    assert [e["task_id"] for e in episodes] == ["job-0", "job-1", "job-2", "job-3"]
    assert [e["outcome"] for e in episodes] == ["success", "failed", "aborted", "success"]
    assert episodes[0]["dataset_from_index"] == 0 and episodes[-1]["dataset_to_index"] == 107
    for a, b in itertools.pairwise(episodes):
        assert a["dataset_to_index"] == b["dataset_from_index"]
    tasks = pq.read_table(out / "meta/tasks.parquet")
    task_of = dict(zip(tasks.column("task_index").to_pylist(), tasks.column("task").to_pylist(),
                       strict=True))
    assert sorted(task_of.values()) == ["pick_and_place", "stack"]
    meta = json.loads(tasks.schema.metadata[b"pandas"])
    assert meta["index_columns"] == ["task"]  # LeRobot looks a task up by the index
    for ep in episodes:
        rows = data[ep["dataset_from_index"]:ep["dataset_to_index"]]
        assert len(rows) == ep["length"]
        assert {r["episode_index"] for r in rows} == {ep["episode_index"]}
        assert [r["frame_index"] for r in rows] == list(range(ep["length"]))
        assert [r["next.done"] for r in rows] == [False] * (ep["length"] - 1) + [True]
        assert [task_of[r["task_index"]] for r in rows] == ep["tasks"] * ep["length"]
        assert rows[-1]["next.success"] == (ep["outcome"] == "success")
        np.testing.assert_allclose([r["timestamp"] for r in rows],
                                   np.arange(ep["length"]) / 20, rtol=1e-6)
        written = robot.written[ep["task_id"]]
        np.testing.assert_allclose([r["observation.state"] for r in rows],
                                   [w["observation"] for w in written], rtol=1e-6)
        assert [ACTS[r["action.index"]] if r["action.index"] >= 0 else None
                for r in rows] == [w["action"] for w in written]
        for r, w in zip(rows, written, strict=True):
            assert r["action"] == [float(a == w["action"]) for a in ACTS]
            assert r["decision.accepted"] == int(w["accepted"])
            assert r["decision.t_s"] == pytest.approx(w["t"] - written[0]["t"])
        cat = feats["episode.outcome"]["categories"]
        assert {cat[r["episode.outcome"]] for r in rows} == {ep["outcome"]}
        for stat in STATS:  # per-episode stats
            assert f"stats/observation.state/{stat}" in ep
        obs = np.array([r["observation.state"] for r in rows], dtype=np.float64)
        for stat, want in (("mean", obs.mean(0)), ("std", obs.std(0)), ("min", obs.min(0)),
                           ("q10", np.quantile(obs, 0.1, axis=0)), ("q50", np.median(obs, 0))):
            np.testing.assert_allclose(ep[f"stats/observation.state/{stat}"], want, rtol=1e-9)
        assert ep["stats/next.done/count"] == [ep["length"]]

    verdicts = feats["label.step"]["categories"]
    job1 = data[episodes[1]["dataset_from_index"]:episodes[1]["dataset_to_index"]]
    assert [r["label.step"] for r in job1] == [-1, -1, -1, verdicts.index("needs_work")] + [-1] * 8
    job3 = data[episodes[3]["dataset_from_index"]:episodes[3]["dataset_to_index"]]
    assert {r["label.episode"] for r in job3} == {verdicts.index("correct")}
    assert {r["label.episode"] for r in job1} == {-1}

    stats = json.loads((out / "meta/stats.json").read_text())
    assert set(stats) == set(feats)
    for name, st in stats.items():
        assert set(STATS) <= set(st), name
        assert st["count"] == [107]
        assert len(st["mean"]) == feats[name]["shape"][0]
    obs = np.array([r["observation.state"] for r in data], dtype=np.float64)
    np.testing.assert_allclose(stats["observation.state"]["mean"], obs.mean(0), rtol=1e-9)
    np.testing.assert_allclose(stats["observation.state"]["std"], obs.std(0), rtol=1e-9)
    np.testing.assert_allclose(stats["observation.state"]["q50"], np.median(obs, 0), rtol=1e-9)
    assert stats["next.done"]["mean"] == [pytest.approx(4 / 107)]


def test_export_runs_beside_a_writing_daemon_and_never_takes_its_lock(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    lock = StateDirLock.acquire(state)  # the daemon holds its state dir
    robot = Robot(state, seed=4)
    for k in range(3):
        robot.task(f"done-{k}", 20)
    stop = threading.Event()

    def daemon() -> None:  # decisions keep coming while the export reads
        k = 0
        while not stop.is_set():
            robot.task(f"live-{k}", 15)
            k += 1

    th = threading.Thread(target=daemon, daemon=True)
    th.start()
    try:
        first = _export(state, tmp_path / "a")
        second = _export(state, tmp_path / "b")
    finally:
        stop.set()
        th.join(30)
        lock.release()
    assert first["episodes"] >= 3 and second["episodes"] >= first["episodes"]
    st = robot.dj.stats()
    robot.dj.stop()
    assert st["errors"] == 0 and st["dropped"] == 0 and st["rejected"] == 0 and st["enabled"]


def test_a_torn_tail_is_skipped_and_the_out_dir_is_never_half_written(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _journal(state)
    seg = sorted(journal_dir(state).glob("decisions*"))[-1]
    size = seg.stat().st_size
    with seg.open("ab") as f:  # a record cut by a crash mid-write, as the daemon may leave it
        f.write(b"\x99\x00\x00\x00\x13\x37")
    out = tmp_path / "ds"
    assert _export(state, out)["frames"] == 107
    assert seg.stat().st_size == size + 6  # read-only: the daemon repairs its own tail
    res = _cli("export", "--state-dir", str(state), "--out", str(out))
    assert res.returncode == 2 and "exists" in res.stderr
    again = _export(state, out, "--force", "--fps", "10")
    assert again["fps"] == 10 and json.loads((out / "meta/info.json").read_text())["fps"] == 10
    (tmp_path / "c.toml").write_text("schema_version = 1\n[control]\ndecision_hz = 25.0\n")
    again = _export(state, out, "--force", "--config", str(tmp_path / "c.toml"))
    assert again["fps"] == 25
    prov = json.loads((out / "meta/edge_agent.json").read_text())
    assert prov["fps"] == f"control.decision_hz of {tmp_path / 'c.toml'}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.toml", "ds", "state"]  # no partial


def test_the_card_names_the_columns_and_nothing_to_export_is_an_error(tmp_path: Path) -> None:
    state = tmp_path / "state"
    _journal(state)
    card = json.loads((REPO / "models/pick-place-policy.card.json").read_text())
    card["inputs"][0]["fields"] = [{"name": f"f{i}", "unit": "1"} for i in range(OBS_DIM)]
    (tmp_path / "c.json").write_text(json.dumps(card))
    _export(state, tmp_path / "ds", "--card", str(tmp_path / "c.json"))
    info = json.loads((tmp_path / "ds/meta/info.json").read_text())
    assert info["features"]["observation.state"]["names"] == [f"f{i}" for i in range(OBS_DIM)]
    prov = json.loads((tmp_path / "ds/meta/edge_agent.json").read_text())
    assert prov["card"]["sha256"] == card["sha256"] and prov["left_out"]["running"] == 7

    empty = tmp_path / "empty"
    r = Robot(empty)
    r.decide(None)
    r.dj.stop()
    res = _cli("export", "--state-dir", str(empty), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "no finished episode" in res.stderr
    assert not (tmp_path / "x").exists()
    res = _cli("export", "--state-dir", str(tmp_path / "nothing"), "--out", str(tmp_path / "x"))
    assert res.returncode == 2 and "no decision journal" in res.stderr
    res = _cli("export", "--state-dir", str(state), "--out", str(tmp_path / "x"), "--fps", "0")
    assert res.returncode == 2 and "--fps" in res.stderr and not (tmp_path / "x").exists()


def test_pyarrow_stays_out_of_the_daemon(tmp_path: Path) -> None:
    code = ("import sys; import edge_agent.daemon.app, edge_agent.cli; "
            "assert 'pyarrow' not in sys.modules, 'pyarrow imported'; "
            "sys.modules['pyarrow'] = None; "  # an install without the dataset extra
            f"sys.exit(edge_agent.cli.main(['journal', 'export', '--state-dir', {str(tmp_path)!r},"
            f" '--out', {str(tmp_path / 'o')!r}]))")
    _journal(tmp_path)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=REPO, timeout=60, check=False)
    assert res.returncode == 2, res.stderr
    assert "pip install 'edge-agent[dataset]'" in res.stderr
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    runtime = [re.split(r"[<>=!~;\[ ]", d)[0].lower() for d in project["dependencies"]]
    assert "numpy" in runtime and "pyarrow" not in runtime
    assert any(d.startswith("pyarrow") for d in project["optional-dependencies"]["dataset"])


def _lerobot_python() -> str | None:
    """A Python with lerobot: this one, or $EDGE_AGENT_LEROBOT_PYTHON (lerobot pulls in torch,
    which the project's environment does not carry; docs/FLYWHEEL.md)."""
    import importlib.util

    if importlib.util.find_spec("lerobot") is not None:
        return sys.executable
    return os.environ.get("EDGE_AGENT_LEROBOT_PYTHON") or None


def test_lerobot_loads_the_export(tmp_path: Path) -> None:
    python = _lerobot_python()
    if python is None:
        pytest.skip("lerobot is not installed here (set EDGE_AGENT_LEROBOT_PYTHON to a Python "
                    "that has it; docs/FLYWHEEL.md)")
    _journal(tmp_path / "state")
    _export(tmp_path / "state", tmp_path / "ds")
    res = subprocess.run([python, "-m", "hil.load_lerobot", str(tmp_path / "ds")],
                         capture_output=True, text=True, cwd=REPO, timeout=300, check=False,
                         env={**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1",
                              "HF_HOME": str(tmp_path / "hf")})
    assert res.returncode == 0, res.stdout + res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert (out["frames"], out["episodes"], out["problems"]) == (107, 4, [])
    assert out["tasks"] == ["pick_and_place", "stack"]


def test_a_task_resumed_after_a_restart_and_a_dropped_decision(tmp_path: Path) -> None:
    """A resumed task starts again at step 0 and its record counts the decisions since: the part
    before the restart is left out as incomplete; so is an episode missing a decision."""
    state = tmp_path / "state"
    r = Robot(state)
    r.task("ok-0", 8)
    r.task("job-9", 10, None)  # the daemon dies mid-task
    r.dj.stop()
    r2 = Robot(state, seed=2)  # a new boot: a fresh journal writer and mark; the task resumes
    r2.mark.follow({"type": EventType.TASK_RESUMED, "task_id": "job-9"})
    r2.task("job-9", 6)  # TASK_STARTED of the same id again is what the record path sees
    r2.mark.follow({"type": EventType.TASK_STARTED, "task_id": "gap-1"})
    r2.decide("gap-1")
    r2.mark.take("onnx-cpu")  # a decision the full queue dropped: its step is gone
    for _ in range(3):
        r2.decide("gap-1")
    r2.mark.follow({"type": EventType.TASK_DONE, "task_id": "gap-1"})
    n, _ = r2.mark.counts("gap-1")
    assert n == 5
    assert r2.dj.flush(10) and r2.dj.record_episode({"task_id": "gap-1", "task": "p",
                                                     "outcome": "success", "decisions": n})
    r2.dj.stop()
    summary = _export(state, tmp_path / "ds")
    assert summary["episodes"] == 2 and summary["frames"] == 8 + 6
    assert summary["left_out"]["incomplete"] == 10 + 4 and summary["left_out"]["running"] == 0
    eps = pq.read_table(tmp_path / "ds/meta/episodes/chunk-000/file-000.parquet")
    assert eps.column("task_id").to_pylist() == ["ok-0", "job-9"]
    assert eps.column("length").to_pylist() == [8, 6]
