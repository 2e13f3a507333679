"""The tap and the flight recorder on their own: drop-oldest counting, the ring's bounds, the
files' caps and rotation, every channel's encoder against its own schema."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from mcap_check import read_checked
from mosquitto import wait_until

from edge_agent.link.messages import (
    Command,
    Mode,
    Status,
    StatusFlag,
    Stop,
    StopCategory,
    StopReason,
)
from edge_agent.observe import channels as ch
from edge_agent.observe.recorder import (
    RING_MARGIN_S,
    TAP_RATE_HZ,
    Recorder,
    RecorderSettings,
    tap_maxlen,
)
from edge_agent.observe.ring import Frames
from edge_agent.observe.tap import Tap

STATUS = Status(12345, StatusFlag(0), 7, (0.1, -0.2, 0.3), (0.0,) * 3, (1.5, float("nan"), 0.0),
                float("inf"), 0.2, 3.0)


def test_a_full_queue_drops_the_oldest_and_counts_it() -> None:
    tap = Tap()
    tap.publish(ch.EVENTS, {"type": "x"})  # nobody listens: nothing kept anywhere
    sub = tap.subscribe("t", maxlen=3)
    only = tap.subscribe("logs", maxlen=10, topics=frozenset({ch.LOG}))
    for i in range(5):
        tap.publish(ch.EVENTS, {"type": "x", "i": i}, t_ns=i)
    assert [p["i"] for _, _, p in sub.drain()] == [2, 3, 4]
    assert sub.dropped == 2 and sub.received == 3
    assert only.drain() == []
    tap.unsubscribe(sub)
    tap.publish(ch.EVENTS, {"type": "x"})
    assert sub.drain() == []
    with pytest.raises(ValueError, match="maxlen"):
        tap.subscribe("bad", maxlen=0)


@pytest.mark.parametrize(("topic", "payload"), [
    (ch.LINK_STATUS, STATUS),
    (ch.LINK_TX, Command(Mode.HOLD, (0.0, 1.0))),
    (ch.LINK_TX, Stop(StopCategory.CAT0, StopReason.ESTOP_INPUT)),
    (ch.EVENTS, {"type": "estop_input", "pressed": True, "ts": 1.0, "mono": 2.0,
                 "boot_id": "b"}),
    (ch.EXECUTOR, {"type": "task_started", "task_id": "t-1", "task": "pick_place",
                   "object": [0.1, 0.2, 0.0], "place": [0.3, 0.1, 0.0], "t": 5.0}),
    (ch.DECISIONS, ({"mono": 1.0, "state": "grasp", "observation": [0.1], "action": "close",
                     "backend": "local", "latency_ms": 0.4, "outcome": "ok",
                     "attempts": [["local", "ok"]]}, False)),
    (ch.COMMANDS, {"command": "status", "id": "c1", "source": "socket", "reply": {"ok": True}}),
    (ch.HEALTH, {"kind": "mode", "name": "cpu_inference", "entered": True}),
    (ch.RECORDER, {"reason": "estop", "report_id": "r", "kind": "estop",
                   "trigger": ch.stamp(5)}),
    (ch.LOG, {"event": "ready", "level": "warning", "logger": "edge_agent.x", "n": 1}),
])
def test_every_channel_encodes_to_its_own_schema(topic: str, payload: object) -> None:
    obj = json.loads(ch.encode(topic, payload, 1_700_000_000_123_456_789))
    schema = ch.channel(topic).schema
    jsonschema.validators.validator_for(schema).check_schema(schema)
    jsonschema.validate(obj, schema)
    assert obj["timestamp"] == {"sec": 1_700_000_000, "nsec": 123_456_789}


def test_the_event_channels_use_the_typed_contract() -> None:
    """/events and /executor: edge_agent/contract's schema (one rule per event type)."""
    for topic, extra in ((ch.EVENTS, {"ts": 1.0, "mono": 2.0, "boot_id": "b"}),
                         (ch.EXECUTOR, {})):
        schema = ch.channel(topic).schema
        ok = ch.to_obj(topic, {"type": "estop_input", "pressed": True, **extra}, 0)
        jsonschema.validate(ok, schema)
        for bad in ({"type": "estop_input", **extra}, {"type": "no_such_event", **extra}):
            with pytest.raises(jsonschema.ValidationError):
                jsonschema.validate(ch.to_obj(topic, bad, 0), schema)


def test_the_log_channel_is_foxglove_log() -> None:
    c = ch.channel(ch.LOG)
    assert c.schema_name == "foxglove.Log"
    obj = ch.to_obj(ch.LOG, {"event": "boom", "level": "error", "logger": "a.b"}, 0)
    assert obj["level"] == 4 and obj["name"] == "a.b" and obj["message"] == "boom"
    assert set(c.schema["required"]) == {"timestamp", "level", "message", "name", "file", "line"}


def _status_at(fw_time_us: int) -> Status:
    return dataclasses.replace(STATUS, fw_time_us=fw_time_us)


def _feed(tap: Tap, seconds: float, hz: float = 500.0) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        tap.publish(ch.LINK_STATUS, STATUS)
        time.sleep(1.0 / hz)


def test_report_triggers_write_finished_files_capped_and_rotated(tmp_path: Path) -> None:
    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=0.5, post_s=0.2, max_files=2,
                                              ring_bytes=1 << 20), tap=tap)
    rec.start()
    try:
        _feed(tap, 0.8)
        paths = []
        for i in range(3):
            paths.append(rec.trigger("estop", report_id=f"r{i}", kind="estop"))
            _feed(tap, 0.4)
        wait_until(lambda: rec.status()["written"] == 3, 30, "three files")
    finally:
        rec.stop()
    assert not paths[0].exists()  # rotated: max_files=2
    assert [p.exists() for p in paths[1:]] == [True, True]
    assert rec.status()["rotated"] == 1
    got = read_checked(paths[2])
    assert got["counts"]["/link/status"] > 100 and got["marks"][0]["report_id"] == "r2"


def test_a_capture_has_each_message_once(tmp_path: Path) -> None:
    """Messages that arrive in the recorder cycle that begins a capture are in its file once
    (the capture takes them from the ring; they were also added as new ones: every recording of
    the 12-07 soak had one cycle's messages twice). A long period puts them in that cycle."""
    from collections import Counter

    from mcap.reader import make_reader

    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=5.0, post_s=0.1, period_s=0.5), tap=tap)
    rec.start()
    paths = []
    try:
        for k in range(3):
            for i in range(40):
                tap.publish(ch.LINK_STATUS, _status_at(k * 1000 + i))
                tap.publish(ch.EVENTS, {"type": "tick", "k": k, "i": i})
            paths.append(rec.trigger("manual", report_id=f"r{k}", kind="estop"))
            wait_until(lambda k=k: rec.status()["written"] == k + 1, 30, f"file {k}")
    finally:
        rec.stop()
    for path in paths:
        with path.open("rb") as f:
            seen = Counter((c.topic, m.log_time, m.data)
                           for _, c, m in make_reader(f).iter_messages())
        assert sum(n for key, n in seen.items() if key[0] == ch.LINK_STATUS) >= 40
        assert max(seen.values()) == 1, [k[:2] for k, n in seen.items() if n > 1][:5]


def test_a_captures_backlog_is_a_long_lived_deque_reused(tmp_path: Path) -> None:
    """A trigger's backlog (pre_s of ring items) goes into one of the recorder's own deques,
    emptied and put back when the file is finished: a new container holding tens of thousands
    of items made each young-generation collection traverse them all (hil.gc_pauses)."""
    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=0.5, post_s=0.2, ring_bytes=1 << 20),
                   tap=tap)
    pool = {id(d) for d in rec._backlogs}
    rec.start()
    try:
        _feed(tap, 0.8)
        for i in range(3):
            rec.trigger("estop", report_id=f"r{i}", kind="estop")
            _feed(tap, 0.4)
        wait_until(lambda: rec.status()["written"] == 3, 30, "three files")
    finally:
        rec.stop()
    assert {id(d) for d in rec._backlogs} == pool
    assert not any(rec._backlogs)


def test_the_ring_is_bounded_in_bytes(tmp_path: Path) -> None:
    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=60.0, ring_bytes=1 << 20), tap=tap)
    rec.start()
    try:
        for _ in range(8000):  # ~400 bytes each: ~3 MiB offered
            tap.publish(ch.LINK_STATUS, STATUS)
        wait_until(lambda: rec.status()["ring_messages"] > 0 and not tap.stats()["recorder"][
            "queued"], 30, "drained")
    finally:
        rec.stop()
    st = rec.status()  # the thread is done: a settled figure
    assert 0 < st["ring_bytes"] <= 1 << 20
    assert st["ring_messages"] < 8000


def test_a_starved_recorder_queues_at_most_the_rings_span_of_raw_items(tmp_path: Path) -> None:
    """The tap queue of a recorder that does not run (here: its first cycle is 60 s away) stops
    at the ring's span at TAP_RATE_HZ; the oldest go, counted. It was 200,000 raw items
    (~1 KB each): a starved recorder kept ~64 MB."""
    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=2.0, period_s=60.0), tap=tap)
    bound = tap_maxlen(2.0)
    assert bound == int(TAP_RATE_HZ * (2.0 + RING_MARGIN_S)) < 200_000
    rec.start()
    try:
        for _ in range(bound + 500):
            tap.publish(ch.LINK_STATUS, STATUS)
        q = tap.stats()["recorder"]
        assert (q["maxlen"], q["queued"], q["dropped"]) == (bound, bound, 500)
        assert rec.status()["dropped"] == 500
    finally:
        rec.stop()


def _through_the_ring(tmp_path: Path, published: list[tuple[str, object]]) -> dict[str, Any]:
    """Publish each (topic, payload) to a recorder's tap; check that each waits in the ring as
    bytes inside a block (not as Python objects); capture them; each topic's message in the file
    (its last), timestamp left out."""
    from mcap.reader import make_reader

    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=5.0, post_s=0.1), tap=tap)
    rec.start()
    try:
        for topic, payload in published:
            tap.publish(topic, payload)
        wait_until(lambda: rec.status()["ring_messages"] == len(published), 30, "in the ring")
        kept = rec._ring.backlog(0)
        assert {type(item[2]) for item in kept} == {Frames}
        assert {type(x[2]) for item in kept if isinstance(item[2], Frames)
                for x in item[2].items()} == {bytes}
        path = rec.trigger("manual")
        wait_until(lambda: rec.status()["written"] == 1, 30, "written")
    finally:
        rec.stop()
    assert rec.status()["encode_errors"] == 0
    got = {}
    with path.open("rb") as f:
        for _, channel, msg in make_reader(f).iter_messages():
            got[channel.topic] = {k: v for k, v in json.loads(msg.data).items()
                                  if k != "timestamp"}
    return got


def _as_encoded(topic: str, payload: object) -> dict[str, Any]:
    return {k: v for k, v in json.loads(ch.encode(topic, payload, 0)).items() if k != "timestamp"}


def test_link_frames_wait_packed_and_are_written_as_on_the_wire(tmp_path: Path) -> None:
    """/link/status, /link/rx and /link/tx frames wait in the ring as their wire body (memory:
    hil.footprint); the file holds what the wire carried, field for field."""
    from edge_agent.link.bodies import pack_body, parse_body
    from edge_agent.link.messages import GState

    wire = parse_body(STATUS.TYPE, pack_body(STATUS))  # as the link reader decodes it
    gstate = parse_body(GState.TYPE, pack_body(GState(True, False, False, True,
                                                      StopReason.ESTOP_INPUT, 0)))
    sent = Command(Mode.HOLD, (0.1, 1.0))  # sent: f64, packed as f32
    got = _through_the_ring(tmp_path, [(ch.LINK_STATUS, wire), (ch.LINK_RX, gstate),
                                       (ch.LINK_TX, sent)])
    on_wire = parse_body(sent.TYPE, pack_body(sent))  # what the guardian got: 0.1 as f32
    assert on_wire != sent
    for topic, frame in ((ch.LINK_STATUS, wire), (ch.LINK_RX, gstate), (ch.LINK_TX, on_wire)):
        assert got[topic] == _as_encoded(topic, frame), topic


def test_loop_ticks_and_sensor_snapshots_wait_as_bytes_and_are_written_as_published(
        tmp_path: Path) -> None:
    """/loop ticks wait packed (three numbers) and /sensors snapshots as their JSON, both in the
    ring's blocks, not as Python objects (the young generation every collection scanned); the
    file holds what each was when published."""
    from edge_agent.robot import load_robot
    from edge_agent.sensors.hub import SensorHub

    robot = load_robot(Path(__file__).resolve().parents[1] / "configs" / "robot" /
                       "edge-arm-4.toml")
    snap = (SensorHub(robot).snapshot(now=1.0), frozenset({"wrist_force"}))
    tick = (41, 0.000125, 0.0031)
    got = _through_the_ring(tmp_path, [(ch.SENSORS, snap), (ch.LOOP, tick)])
    for topic, payload in ((ch.SENSORS, snap), (ch.LOOP, tick)):
        assert got[topic] == _as_encoded(topic, payload), topic
    assert got[ch.LOOP]["index"] == 41 and got[ch.SENSORS]["channels"]


def test_the_byte_cap_rotates_too(tmp_path: Path) -> None:
    (tmp_path / "20000101T000000Z-old-0001.mcap").write_bytes(b"x" * 600_000)
    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=0.2, post_s=0.1, max_bytes=500_000),
                   tap=tap)
    rec.start()
    try:
        _feed(tap, 0.3)
        new = rec.trigger("manual")
        wait_until(lambda: rec.status()["written"] == 1, 30, "written")
    finally:
        rec.stop()
    assert new.exists() and not (tmp_path / "20000101T000000Z-old-0001.mcap").exists()


def test_the_daemon_imports_no_mcap_before_the_recorder_starts(tmp_path: Path) -> None:
    """Building the daemon (everything before READY) and the tap seams import neither mcap nor
    lz4; `Recorder.start` (after READY) does."""
    import subprocess
    import sys

    code = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from edge_agent.config import load_config\n"
        "from edge_agent.daemon.app import Daemon\n"
        "from edge_agent.observe.recorder import Recorder, RecorderSettings\n"
        f"cfg = load_config('configs/sim.toml', [{f'state_dir={tmp_path}'!r}], sim=True)\n"
        "d = Daemon(cfg, sim=True)\n"
        "before = [m for m in ('mcap', 'lz4') if m in sys.modules]\n"
        f"r = Recorder(Path({str(tmp_path / 'rec')!r}), RecorderSettings())\n"
        "r.start(); r.stop()\n"
        "print(json.dumps([before, 'mcap' in sys.modules]))\n")
    repo = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                         timeout=120, check=True)
    before, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert before == [] and after


def test_every_report_kind_through_the_outbox_names_a_finished_recording(
        tmp_path: Path) -> None:
    """The outbox's link hook (daemon/recording.py) is applied to every report whatever its
    kind: each persisted report names its file, which is finished and readable."""
    import dataclasses

    from test_reports import _stop_report

    from edge_agent.commands.api import CommandAPI
    from edge_agent.config import load_config
    from edge_agent.daemon.recording import DaemonRecording
    from edge_agent.reports.outbox import Outbox
    from edge_agent.reports.record import ReportKind
    from edge_agent.reports.sinks import DiskSink

    repo = Path(__file__).resolve().parents[1]
    cfg = load_config(repo / "configs" / "sim.toml", [
        f"state_dir={tmp_path}", "observe.record_pre_s=0.3", "observe.record_post_s=3"],
        sim=True)
    api = CommandAPI(lambda: "idle")
    rec = DaemonRecording(cfg, api)
    assert rec.recorder is not None
    rec.recorder = Recorder(rec.recorder.dir, rec.recorder.s, tap=Tap())  # a private tap
    ob = Outbox(tmp_path / "outbox", [DiskSink(tmp_path / "reports", 50)], plot=False)
    ob.link = rec.link
    rec.start()
    ob.start()
    base = _stop_report()
    try:
        for i, kind in enumerate(ReportKind):
            r = dataclasses.replace(base, id=f"{base.id[:-2]}{i:02d}", kind=kind)
            ob.submit(lambda r=r: r)
        wait_until(lambda: len(list((tmp_path / "reports").glob("*.json"))) == len(ReportKind),
                   30, "every kind on disk")
        r0 = rec.recorder
        wait_until(lambda: r0.status()["written"] + r0.status()["merged"] == len(ReportKind)
                   and not r0.status()["open"], 30, "every recording finished")
    finally:
        ob.stop()
        rec.stop()
    for p in (tmp_path / "reports").glob("*.json"):
        d = json.loads(p.read_text())
        got = read_checked(Path(d["recording"]))
        assert {"report_id": d["id"], "kind": d["kind"]}.items() <= next(
            m for m in got["marks"] if m["report_id"] == d["id"]).items()
    assert r0.status()["merged"] == len(ReportKind) - 4  # at once: 4 files, the rest joined


def test_a_stop_with_a_backlog_finishes_the_file_within_its_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A starved recorder at a daemon stop: the backlog is cut after FINAL_S and the file is
    finished (footer, indexes), so the seeking reader opens it; never a torn file."""
    from edge_agent.observe import recorder as recorder_mod

    monkeypatch.setattr(recorder_mod, "FINAL_S", 0.05)
    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=60.0, ring_bytes=256 << 20), tap=tap)
    rec.start()
    for _ in range(60_000):  # far more than 0.05 s of encoding (the tap queue holds 65,536)
        tap.publish(ch.LINK_STATUS, STATUS)
    wait_until(lambda: rec.status()["ring_messages"] >= 60_000, 60, "the ring filled")
    path = rec.start_capture("backlog")
    t0 = time.monotonic()
    rec.stop()
    assert time.monotonic() - t0 < 5.0  # inside stop()'s join
    got = read_checked(path)  # make_reader: needs the footer and summary
    assert 0 < got["counts"]["/link/status"] < 60_000


def test_a_capture_that_falls_behind_sheds_its_oldest_unwritten_items(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A starved recorder's backlog is bounded (MAX_PENDING): the oldest unwritten items go,
    counted in `backlog_dropped`; the file is still finished and readable."""
    from edge_agent.observe import recorder as recorder_mod

    monkeypatch.setattr(recorder_mod, "MAX_PENDING", 1_000)
    monkeypatch.setattr(recorder_mod, "WRITE_BATCH", 10)  # 200 messages/s: far behind
    tap = Tap()
    rec = Recorder(tmp_path, RecorderSettings(pre_s=0.5), tap=tap)
    rec.start()
    try:
        path = rec.start_capture("behind")
        assert path is not None
        for _ in range(20):
            for _ in range(1_000):
                tap.publish(ch.LINK_STATUS, STATUS)
            time.sleep(0.02)
        wait_until(lambda: rec.status()["backlog_dropped"] > 0, 30, "the backlog shed")
        assert rec.stop_capture() == path
        wait_until(lambda: rec.status()["written"] == 1, 60, "the file finished")
    finally:
        rec.stop()
    got = read_checked(path)
    assert 0 < got["counts"]["/link/status"] < 20_000
