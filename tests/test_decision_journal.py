"""The decision journal sink: record format, bounded queue and disk, disk full, kill -9 loops.

EDGE_CRASH_LOOPS scales the kill loop (default: 10 kills here; the store's own journal test
runs the long loop).
"""

from __future__ import annotations

import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_fs import tiny_fs

from edge_agent.inference.backend import DecisionRecord
from edge_agent.store.decisions import (
    DecisionJournal,
    decode_decision,
    encode_decision,
    journal_dir,
    read_decisions,
)
from edge_agent.store.journal import Journal

REPO = Path(__file__).resolve().parents[1]
KILLS = max(3, int(os.environ.get("EDGE_CRASH_LOOPS", "200")) // 20)


def _decision(i: int, action: str | None = "continue") -> dict[str, Any]:
    return {"t": float(i), "observation": [i * 0.5, -1.25, 3.0], "action": action,
            "backend": "onnx-cpu", "latency_ms": 0.75, "outcome": "ok", "state": "approach",
            "accepted": i % 2 == 0}


def test_round_trip_keeps_every_field() -> None:
    d = decode_decision(encode_decision(_decision(4), wall=1234.5))
    assert d is not None
    assert d.t == 4.0 and d.wall == 1234.5 and d.observation == (2.0, -1.25, 3.0)
    assert (d.action, d.backend, d.outcome, d.state, d.accepted) == (
        "continue", "onnx-cpu", "ok", "approach", True)
    assert d.latency_ms == pytest.approx(0.75)


def test_inference_records_and_sparse_dicts_are_accepted() -> None:
    rec = DecisionRecord(7.5, "grasp", (0.1, 0.2), None, None, 0.0123, "no_decision",
                         (("onnx-cpu", "timeout"),))
    d = decode_decision(encode_decision(rec.as_dict()))
    assert d is not None and d.t == 7.5 and d.action is None and d.backend is None
    assert d.latency_ms == pytest.approx(12.3) and d.outcome == "no_decision"
    # the executor's own sink: t, state, observation, action, accepted — no latency, no backend
    d = decode_decision(encode_decision({"t": 1.0, "state": "lift", "observation": (1.0,),
                                         "action": "advance", "accepted": False}))
    assert d is not None and math.isnan(d.latency_ms) and d.accepted is False
    assert d.outcome is None


@settings(deadline=None, max_examples=300)
@given(st.binary(max_size=200))
def test_decoding_garbage_never_raises(data: bytes) -> None:
    decode_decision(data)


@settings(deadline=None, max_examples=100)
@given(st.lists(st.floats(width=32, allow_nan=False), max_size=40),
       st.one_of(st.none(), st.text(max_size=30)))
def test_round_trip_property(obs: list[float], action: str | None) -> None:
    d = decode_decision(encode_decision({"t": 1.0, "observation": obs, "action": action}))
    assert d is not None and list(d.observation) == obs
    assert d.action == (action.encode()[:255].decode("utf-8", "replace") or None
                        if action else None)


def test_sink_writes_in_order_and_rejects_malformed(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    dj = DecisionJournal(journal_dir(tmp_path), on_event=events.append)
    assert dj.record(_decision(0)) is False  # not open yet
    assert dj.open() is not None
    for i in range(500):
        assert dj(_decision(i))
    assert dj.record({"t": 1.0, "observation": ["not a number"]}) is False
    assert dj.flush(10)
    dj.stop()
    dj.stop()  # idempotent
    got = list(read_decisions(journal_dir(tmp_path)))
    assert [d.t for d in got] == [float(i) for i in range(500)]
    assert dj.stats()["written"] == 500 and dj.rejected == 2 and not events


def test_disk_use_is_bounded_and_keeps_the_newest(tmp_path: Path) -> None:
    dj = DecisionJournal(tmp_path / "j", segment_bytes=4096, max_segments=3)
    dj.open()
    for i in range(3000):
        dj.record(_decision(i))
        if i % 200 == 0:
            dj.flush(10)
    dj.stop()
    segs = Journal(tmp_path / "j", "decisions").segments()
    assert len(segs) == 3
    assert sum(s.stat().st_size for s in segs) <= 3 * 4096
    ts = [d.t for d in read_decisions(tmp_path / "j")]
    assert ts == [float(i) for i in range(int(ts[0]), 3000)]  # a contiguous newest suffix
    assert 3000 - len(ts) > 2000


def test_queue_is_bounded_and_every_record_is_accounted_for(tmp_path: Path) -> None:
    dj = DecisionJournal(tmp_path / "j", max_pending=4)
    dj.open()
    accepted = sum(dj.record(_decision(i)) for i in range(5000))
    dj.stop()
    st_ = dj.stats()
    assert accepted == st_["written"] and accepted + dj.rejected == 5000
    assert st_["dropped"] == 5000 - accepted
    assert len(list(read_decisions(tmp_path / "j"))) == accepted


def test_unusable_directory_turns_the_journal_off_with_an_event(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    events: list[dict[str, Any]] = []
    dj = DecisionJournal(blocker / "j", on_event=events.append)
    assert dj.open() is None and not dj.enabled
    assert dj.record(_decision(0)) is False
    assert [e["type"] for e in events] == ["journal_disabled"]
    assert events[0]["cause"] == "io_error"
    dj.stop()


_FULL_CHILD = textwrap.dedent("""
    import json, resource, signal, sys
    from edge_agent.store.decisions import DecisionJournal
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), resource.RLIM_INFINITY))
    events = []
    dj = DecisionJournal(sys.argv[1], on_event=events.append)
    dj.open()
    accepted = 0
    for i in range(2000):
        accepted += dj.record({"t": float(i), "observation": [0.0] * 16, "action": "continue"})
        if i % 50 == 0:
            dj.flush(10)
    dj.flush(10)
    after = dj.record({"t": -1.0, "observation": [], "action": "abort"})
    dj.stop()
    print(json.dumps({"events": events, "accepted": accepted, "after": after,
                      "stats": dj.stats()}))
""")


def test_full_disk_turns_the_journal_off_once_and_keeps_a_valid_prefix(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", _FULL_CHILD, str(tmp_path / "j"), "20000"],
                         capture_output=True, text=True, cwd=REPO, timeout=60, check=True)
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert [e["type"] for e in res["events"]] == ["journal_disabled"]
    assert res["events"][0]["cause"] == "disk_full"
    assert res["after"] is False and res["stats"]["enabled"] is False
    ts = [d.t for d in read_decisions(tmp_path / "j")]
    assert ts == [float(i) for i in range(len(ts))] and 50 < len(ts) < 2000


def test_real_enospc_is_disk_full(tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "64k") as fs:
        events: list[dict[str, Any]] = []
        dj = DecisionJournal(fs / "j", segment_bytes=1 << 20, on_event=events.append)
        dj.open()
        for i in range(5000):
            dj.record(_decision(i))
            if i % 100 == 0:
                dj.flush(10)
        dj.stop()
        assert [(e["type"], e["cause"]) for e in events] == [("journal_disabled", "disk_full")]
        ts = [d.t for d in read_decisions(fs / "j")]
        assert ts == [float(i) for i in range(len(ts))] and len(ts) > 100


def test_storage_low_sheds_then_takes_back_a_journal_the_full_disk_turned_off(
        tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "64k") as fs:
        events: list[dict[str, Any]] = []
        (fs / "fill").write_bytes(b"\0" * (40 << 10))  # another writer's
        dj = DecisionJournal(fs / "j", segment_bytes=1 << 20, on_event=events.append)
        dj.open()
        for k in range(2000):
            dj.record(_decision(k))
        dj.flush(10)
        assert dj.disabled == "disk_full" and len(events) == 1
        written = dj.stats()["written"]
        dj.set_shedding(True)  # storage_low entered
        assert dj.record(_decision(3000)) is False and dj.stats()["shed"] == 1
        dj.set_shedding(False)  # left while the disk is still full: back, and off again
        assert dj.disabled is None
        for k in range(2000):
            dj.record(_decision(3000 + k))
        dj.flush(10)
        assert dj.disabled == "disk_full" and len(events) == 2
        written = dj.stats()["written"]
        dj.set_shedding(True)
        (fs / "fill").unlink()  # the other writer lets go
        dj.set_shedding(False)
        assert dj.disabled is None and dj.stats()["enabled"], dj.stats()
        assert dj.record(_decision(9000)) and dj.flush(10)
        assert dj.stats()["written"] == written + 1
        dj.stop()
        assert [d.t for d in read_decisions(fs / "j")][-1] == 9000.0


# --------------------------------------------------------------------------- kill -9 loop

_WRITER_CHILD = textwrap.dedent("""
    import sys
    from edge_agent.logsetup import configure_logging
    configure_logging("info", "json", stream=sys.stderr)  # stdout carries the acks
    from edge_agent.store.decisions import DecisionJournal, read_decisions
    d = sys.argv[1]
    start = sum(1 for _ in read_decisions(d))
    dj = DecisionJournal(d, segment_bytes=1 << 16, max_segments=1000)
    dj.open()
    i = start
    while True:
        for _ in range(20):
            dj.record({"t": float(i), "observation": [float(i)] * 8, "action": "continue"})
            i += 1
        dj.flush(10)
        sys.stdout.write(f"{i}\\n")
        sys.stdout.flush()
""")


def test_kill9_loop_leaves_a_valid_prefix_with_every_acknowledged_record(tmp_path: Path) -> None:
    rng = random.Random(11)
    d = tmp_path / "j"
    acked = 0
    for _ in range(KILLS):
        p = subprocess.Popen([sys.executable, "-c", _WRITER_CHILD, str(d)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
        assert p.stdout is not None
        first = p.stdout.readline()  # it is writing
        assert first, "writer died"
        # then a random instant: 0-300 ms of appends and fsyncs
        select.select([], [], [], rng.uniform(0.0, 0.3))
        p.send_signal(signal.SIGKILL)
        rest = p.stdout.read()
        p.wait()
        acks = [int(x) for x in (first + rest).split()]
        acked = max(acked, *acks)
        ts = [x.t for x in read_decisions(d)]
        assert ts == [float(i) for i in range(len(ts))], "not a valid prefix"
        assert len(ts) >= acked, "an acknowledged (fsynced) record was lost"
