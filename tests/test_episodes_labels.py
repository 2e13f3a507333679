"""Issue 28 items 1 and 2, the store side: decisions carry their episode, every task leaves an
episode record, old journals still read, and labels are appended beside the journal (checked,
bounded, last one wins, a torn tail repaired, two processes appending at once)."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from config_helpers import load

from edge_agent.commands import CommandAPI, ErrorCode, Mode
from edge_agent.daemon.comms_hub import CommsHub
from edge_agent.daemon.episodes import Episodes
from edge_agent.store.decisions import (
    DecisionJournal,
    decode_decision,
    encode_decision,
    journal_dir,
    read_decisions,
)
from edge_agent.store.episodes import (
    EpisodeLookup,
    EpisodeMark,
    encode_episode,
    episode_index,
    episodes_journal,
    read_episodes,
)
from edge_agent.store.journal import Journal
from edge_agent.store.labels import (
    LABELS_NAME,
    MAX_NOTE,
    LabelError,
    LabelFile,
    latest_labels,
    read_labels,
)
from edge_agent.vocab import EventType

REPO = Path(__file__).resolve().parents[1]


def _decision(i: int, backend: str | None = "local") -> dict[str, Any]:
    return {"t": float(i), "observation": [i * 0.5, 1.0], "action": "continue",
            "backend": backend, "latency_ms": 0.5, "outcome": "ok", "state": "grasp",
            "accepted": True}


def _format1(i: int) -> bytes:
    """A record exactly as the journal wrote it before episodes (format 1, written out by hand
    from its documented layout, not by today's encoder)."""
    text = b"".join(bytes((len(s),)) + s for s in (b"grasp", b"advance", b"rule", b"ok"))
    return struct.pack("<BBHddf2f", 1, 3, 2, float(i), 1000.0 + i, 0.25, i, -1.0) + text


def test_a_format_1_journal_still_reads_without_episode_fields(tmp_path: Path) -> None:
    j = Journal(tmp_path, "decisions")
    j.open()
    for i in range(3):
        j.append(_format1(i))
    j.append(encode_decision(_decision(3), task_id="t-1", step=0))
    j.close()
    out = list(read_decisions(tmp_path))
    assert [d.t for d in out] == [0.0, 1.0, 2.0, 3.0]
    old = out[1]
    assert (old.action, old.backend, old.state, old.accepted, old.wall) == (
        "advance", "rule", "grasp", True, 1001.0)
    assert old.task_id is None and old.step is None and old.observation == (1.0, -1.0)
    assert (out[3].task_id, out[3].step) == ("t-1", 0)


def test_episode_fields_round_trip_and_garbage_never_raises() -> None:
    payload = encode_decision(_decision(1), wall=5.0, task_id="job-7", step=41)
    d = decode_decision(payload)
    assert d is not None and (d.task_id, d.step, d.wall, d.backend) == ("job-7", 41, 5.0, "local")
    for cut in range(len(payload)):
        assert decode_decision(payload[:cut]) is None
    assert decode_decision(payload + b"x") is None
    assert decode_decision(b"\x03" + payload[1:]) is None  # an unknown format


def test_the_mark_stamps_each_decision_of_a_task_with_its_step(tmp_path: Path) -> None:
    dj = DecisionJournal(tmp_path)
    mark = EpisodeMark()
    dj.episode = mark
    assert dj.open() is not None
    try:
        dj.record(_decision(0))  # before any task: no episode
        mark.follow({"type": EventType.TASK_STARTED, "task_id": "a"})
        for i in range(1, 4):
            dj.record(_decision(i, "local" if i < 3 else None))
        mark.follow({"type": EventType.TASK_FROZEN, "task_id": "a"})
        mark.follow({"type": EventType.TASK_RESUMED, "task_id": "a"})  # the same episode
        dj.record(_decision(4, "cached"))
        mark.follow({"type": EventType.TASK_DONE, "task_id": "a"})
        dj.record(_decision(5))  # between tasks
        mark.follow({"type": EventType.TASK_STARTED, "task_id": "b"})
        dj.record(_decision(6))
        assert dj.flush(5.0)
    finally:
        dj.stop()
    got = [(d.task_id, d.step) for d in read_decisions(tmp_path)]
    assert got == [(None, None), ("a", 0), ("a", 1), ("a", 2), ("a", 3), (None, None), ("b", 0)]
    assert mark.counts("a") == (4, {"local": 2, "none": 1, "cached": 1})
    assert mark.counts("b") == (0, {})  # not ended yet


def test_episode_records_are_journaled_beside_the_decisions(tmp_path: Path) -> None:
    dj = DecisionJournal(tmp_path)
    assert dj.open() is not None
    try:
        for i in range(3):
            assert dj.record_episode({"task_id": f"t-{i}", "outcome": "success",
                                      "decisions": 10 + i, "backends": {"local": 10 + i},
                                      "stops": [], "degraded": ["cpu_inference"]})
        assert not dj.record_episode({"task_id": "bad", "x": math.nan})  # not JSON: refused
        assert dj.flush(5.0)
    finally:
        dj.stop()
    eps = list(read_episodes(tmp_path))
    assert [e["task_id"] for e in eps] == ["t-0", "t-1", "t-2"]
    assert eps[2]["degraded"] == ["cpu_inference"] and eps[2]["v"] == 1
    assert episode_index(tmp_path) == {"t-0": 10, "t-1": 11, "t-2": 12}
    assert list(read_decisions(tmp_path)) == []  # the decisions journal holds none of them


def test_labels_are_checked_and_the_last_one_wins(tmp_path: Path) -> None:
    known = {"job-1": 5, "job-2": 0}.get
    labels = LabelFile(tmp_path)
    labels.append({"task_id": "job-1", "verdict": "wrong", "step": 3, "note": "late"}, known)
    labels.append({"task_id": "job-1", "verdict": "correct", "by": "mqtt"}, known)
    labels.append({"task_id": "job-1", "verdict": "needs_work", "step": 3}, known)
    refused = {
        "unknown task_id 'job-9'": {"task_id": "job-9", "verdict": "correct"},
        "step 5 out of range": {"task_id": "job-1", "verdict": "correct", "step": 5},
        "verdict: expected one of": {"task_id": "job-1", "verdict": "fine"},
        f"at most {MAX_NOTE}": {"task_id": "job-1", "verdict": "wrong", "note": "n" * 281},
        "step: expected an integer": {"task_id": "job-1", "verdict": "wrong", "step": -1},
    }
    for why, label in refused.items():
        with pytest.raises(LabelError, match=why):
            labels.append(label, known)
    assert len(list(read_labels(tmp_path))) == 3  # the refused ones left nothing
    latest = latest_labels(tmp_path)
    assert set(latest) == {("job-1", 3), ("job-1", None)}
    assert latest[("job-1", 3)]["verdict"] == "needs_work"  # the last label of step 3
    assert latest[("job-1", None)]["verdict"] == "correct"
    assert latest[("job-1", None)]["by"] == "mqtt"


def test_a_torn_label_tail_is_cut_and_earlier_labels_survive(tmp_path: Path) -> None:
    labels = LabelFile(tmp_path)
    labels.append({"task_id": "t", "verdict": "correct"})
    seg = Journal(tmp_path, LABELS_NAME).segments()[-1]
    whole = seg.read_bytes()
    for into in (1, 8, -1):  # a crash mid-append: 1 or 8 bytes in, or 1 byte short
        labels.append({"task_id": "t", "verdict": "wrong", "note": "x" * 100})
        full = seg.stat().st_size  # (the record's length varies with its wall time)
        with open(seg, "r+b") as f:
            f.truncate(len(whole) + into if into > 0 else full + into)
        assert [r["verdict"] for r in read_labels(tmp_path)] == ["correct"]
        labels.append({"task_id": "t", "verdict": "needs_work"})  # repairs, then appends
        assert [r["verdict"] for r in read_labels(tmp_path)] == ["correct", "needs_work"]
        with open(seg, "r+b") as f:  # back to one label for the next cut
            f.truncate(len(whole))


def test_two_processes_labelling_at_once_lose_nothing(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO)!r})
        from edge_agent.store.labels import LabelFile
        f = LabelFile({str(tmp_path)!r})
        for i in range(60):
            f.append({{"task_id": "t-" + sys.argv[1], "verdict": "correct", "step": i}})
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(n)]) for n in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    recs = list(read_labels(tmp_path))
    assert len(recs) == 120
    for n in range(2):
        assert [r["step"] for r in recs if r["task_id"] == f"t-{n}"] == list(range(60))
    j = Journal(tmp_path, LABELS_NAME)
    assert len(list(j.iter_records())) == 120 and j.corrupt_skipped == 0


def test_the_daemon_folds_a_tasks_events_into_its_episode_record(tmp_path: Path) -> None:
    """`Episodes` (daemon/episodes.py) with the real CommsHub's listeners and CommandAPI: the
    events of a task with a retry, a stop, a resume and the L3 verdict, degradation modes
    entered before and during it, and the labels it then takes."""
    cfg = load(tmp_path, {"": {"state_dir": json.dumps(str(tmp_path / "state"))}})
    comms = CommsHub(cfg, "boot-1", on_estop=lambda c: None, state=dict, telemetry=dict,
                     spawn=lambda *a, **k: None)
    model = {"model": {"name": "policy", "version": "1.2.0", "sha256": "ab" * 32},
             "backend_in_use": "local"}
    api = CommandAPI(lambda: Mode.IDLE)
    eps = Episodes(cfg, comms, "boot-1")
    control = SimpleNamespace(episode=None)
    eps.attach(control, lambda: model, api)  # type: ignore[arg-type]
    assert control.episode is eps.mark and eps.decisions is not None
    assert eps.decisions.open() is not None

    def executor(ev: dict[str, Any]) -> None:  # what the control path, then the main thread do
        eps.mark.follow(ev)
        comms.event(ev)

    try:
        comms.event({"type": EventType.DEGRADED, "mode": "cpu_inference"})
        executor({"type": EventType.TASK_STARTED, "task_id": "job-1", "task": "pick_place"})
        for i in range(3):
            eps.decisions.record(_decision(i, "local"))
        executor({"type": EventType.ATTEMPT_FAILED, "task_id": "job-1", "verdict": "retry",
                  "l3_count": 1})
        executor({"type": EventType.TASK_FROZEN, "task_id": "job-1", "stop": "protective_stop",
                  "cause": "collision", "state": "grasp"})
        comms.event({"type": EventType.RECOVERED, "mode": "cpu_inference"})
        comms.event({"type": EventType.DEGRADED, "mode": "sensor_predicted"})
        executor({"type": EventType.TASK_RESUMED, "task_id": "job-1", "state": "grasp"})
        eps.decisions.record(_decision(3, "rule"))
        executor({"type": EventType.ATTEMPT_FAILED, "task_id": "job-1",
                  "verdict": "diagnostic", "l3_count": 5})
        executor({"type": EventType.TASK_DONE, "task_id": "job-1", "outcome": "failed",
                  "message": "5 failed attempts in a row: diagnostic", "attempts": 4,
                  "duration_s": 7.5})
        executor({"type": EventType.TASK_STARTED, "task_id": "job-2", "task": "pick_place"})
        executor({"type": EventType.TASK_DONE, "task_id": "job-2", "outcome": "success",
                  "attempts": 6, "duration_s": 3.0})
        assert eps.decisions.flush(5.0)
        (ep, ep2) = list(read_episodes(journal_dir(cfg.state_dir)))
        assert {k: ep[k] for k in ("task_id", "outcome", "l1", "l2", "l3", "l3_count",
                                   "stop_cause", "attempts", "decisions", "backends",
                                   "degraded", "policy", "boot_id", "resumed")} == {
            "task_id": "job-1", "outcome": "failed", "l1": 2, "l2": 1, "l3": True,
            "l3_count": 5, "stop_cause": "collision", "attempts": 4, "decisions": 4,
            "backends": {"local": 3, "rule": 1}, "degraded": ["cpu_inference",
                                                                "sensor_predicted"],
            "policy": "local", "boot_id": "boot-1", "resumed": False}
        assert ep["stops"] == [{"stop": "protective_stop", "cause": "collision",
                                "state": "grasp"}]
        assert ep["model"] == model["model"] and ep["duration_s"] == 7.5
        assert (ep2["task_id"], ep2["decisions"], ep2["degraded"], ep2["l3"]) == (
            "job-2", 0, ["sensor_predicted"], False)

        def label(**args: Any) -> Any:
            return api.handle("journal.label", {"v": 1, "id": f"l-{len(args)}-{args}",
                                                **args}, source="test")

        assert label(task_id="job-1", verdict="wrong", step=3).ok
        r = label(task_id="job-1", verdict="wrong", step=4)
        assert not r.ok and r.error.code is ErrorCode.BAD_ARGS and "out of range" in \
            r.error.message
        r = label(task_id="job-3", verdict="correct")
        assert not r.ok and "unknown task_id 'job-3'" in r.error.message
    finally:
        eps.decisions.stop()
    # the next boot knows the episodes on disk (read once, on its first label)
    again = Episodes(cfg, comms, "boot-2")
    api2 = CommandAPI(lambda: Mode.RUNNING)  # admitted in every mode
    again.attach(SimpleNamespace(episode=None), lambda: None, api2)  # type: ignore[arg-type]
    assert again.known("job-2") == 0 and again.known("job-9") is None
    r = api2.handle("journal.label", {"v": 1, "id": "n-1", "task_id": "job-2",
                                      "verdict": "correct", "note": "clean"}, source="mqtt")
    assert r.ok and r.result["label"]["by"] == "mqtt"
    assert latest_labels(journal_dir(cfg.state_dir))[("job-2", None)]["note"] == "clean"


def test_the_label_check_reads_the_newest_segments_first_and_each_once(tmp_path: Path) -> None:
    j = episodes_journal(tmp_path)
    j.open()
    for i in range(1500):  # several 256 KiB segments
        j.append(encode_episode({"task_id": f"t-{i}", "decisions": i % 7,
                                 "pad": "p" * 400}), sync=False)
    j.close()
    segs = Journal(tmp_path, "episodes").segments()
    assert len(segs) >= 3
    lookup = EpisodeLookup(tmp_path)
    assert lookup.steps("t-1499") == 1499 % 7
    assert len(lookup._read) == 1  # a recent task: the newest segment only
    assert lookup.steps("t-0") == 0 and lookup.steps("t-nope") is None
    assert len(lookup._read) == len(segs)
    segs[0].unlink()  # pruned (the journal is bounded): its episodes are gone for labels too
    assert lookup.steps("t-0") is None and lookup.steps("t-1499") == 1499 % 7
