"""The live Foxglove view: the rate rule, the server over a private tap, and a real daemon's
live view read with a Foxglove protocol client; every message checked against the JSON schema
its channel advertised."""

from __future__ import annotations

import json
import re
import threading
import time
import urllib.request
from pathlib import Path

import jsonschema
import pytest
from daemon_proc import DaemonProc
from mosquitto import free_port, wait_until
from prometheus_client.parser import text_string_to_metric_families

from edge_agent.contract import schema_for
from edge_agent.liveview.rate import RateLimit
from edge_agent.observe import channels
from edge_agent.observe.tap import Tap
from hil.foxglove_client import FoxgloveClient, Received


def check_schemas(client: FoxgloveClient, got: list[Received]) -> None:
    validators = {t: jsonschema.Draft202012Validator(json.loads(c["schema"]))
                  for t, c in client.channels.items()}
    for m in got:
        errors = [e.message for e in validators[m.topic].iter_errors(m.payload)]
        assert not errors, (m.topic, m.payload, errors[:3])
        ts = m.payload["timestamp"]
        assert ts["sec"] * 1_000_000_000 + ts["nsec"] == m.log_time_ns


def test_rate_limit_passes_a_burst_then_the_rate() -> None:
    r = RateLimit(50.0, burst=10)
    assert sum(r.allow("/a", 0.0) for _ in range(100)) == 10  # the burst, at once
    assert r.allow("/b", 0.0)  # per topic
    sent = sum(r.allow("/a", i / 1000) for i in range(1, 2001))  # 1 kHz for 2 s
    assert 95 <= sent <= 101  # 50 Hz, the bucket emptied by the burst
    assert r.limited["/a"] == 90 + 2000 - sent
    with pytest.raises(ValueError):
        RateLimit(0.0)


def test_server_over_a_private_tap() -> None:
    from edge_agent.liveview.server import LiveView
    tap = Tap()
    view = LiveView("127.0.0.1", free_port(), 50.0, tap=tap)
    stop = threading.Event()

    def publish() -> None:
        i = 0
        while not stop.is_set():
            tap.publish(channels.HEALTH, {"kind": "probe", "name": "loop", "n": i})
            tap.publish(channels.LOG, {"level": "info", "event": "hello", "logger": "t", "n": i})
            i += 1
            time.sleep(0.001)

    pub = threading.Thread(target=publish, daemon=True)
    client = FoxgloveClient(f"ws://127.0.0.1:{view.port}")
    try:
        client.open()
        assert client.subprotocol == "foxglove.sdk.v1"
        assert set(client.channels) == set(channels.CHANNELS)
        for topic, c in client.channels.items():
            assert c["encoding"] == "json" and c["schemaEncoding"] == "jsonschema"
            assert json.loads(c["schema"]) == channels.CHANNELS[topic].schema
        pub.start()
        time.sleep(0.3)
        assert not tap.active  # nobody subscribed: the seams pay nothing
        client.subscribe([channels.HEALTH, channels.LOG])
        got = client.receive(3.0)
        check_schemas(client, got)
        by = {t: [m for m in got if m.topic == t] for t in (channels.HEALTH, channels.LOG)}
        for t, msgs in by.items():
            # ~1 kHz published, at most 50 Hz (+ the burst) forwarded
            assert 20 <= len(msgs) <= 50 * 3 + view.limit.burst + 5, (t, len(msgs))
            ns = [m.payload.get("n") for m in msgs if "n" in m.payload]
            assert ns == sorted(ns)
        assert by[channels.LOG][0].payload["level"] == 2  # foxglove.Log INFO
        assert view.limit.limited[channels.HEALTH] > 0
        client.close()
        wait_until(lambda: not tap.active, 10, "the tap released when the client left")
    finally:
        stop.set()
        client.close()
        view.stop()


@pytest.fixture
def daemon(tmp_path: Path):  # type: ignore[no-untyped-def]
    port = free_port()
    d = DaemonProc(tmp_path, None, extra=(f"observe.foxglove_port={port}",
                                          "observe.foxglove_rate_hz=100",
                                          f"observe.metrics_port={free_port()}")).start()
    try:
        d.wait_ready()
        wait_until(lambda: bool(d.events("liveview_listening")), 60, "the live view up")
        d.port = port  # type: ignore[attr-defined]
        yield d
    finally:
        d.stop()


def test_a_real_daemons_live_view(daemon: DaemonProc) -> None:
    client = FoxgloveClient(f"ws://127.0.0.1:{daemon.port}")  # type: ignore[attr-defined]
    try:
        client.open()
        assert set(client.channels) == set(channels.CHANNELS)
        client.subscribe(sorted(client.channels))
        got = client.receive(2.0)
        assert daemon.socket_cmd("estop")["ok"]
        got += client.receive(3.0)
    finally:
        client.close()
    check_schemas(client, got)
    topics = {m.topic for m in got}
    # the robot's 1 kHz STATUS stream, rate-limited to 100 Hz (+ the burst)
    status = [m for m in got if m.topic == channels.LINK_STATUS]
    assert 50 <= len(status) <= 100 * 5 + 40, len(status)
    assert len(status[0].payload["q"]) == 4
    events = [m.payload for m in got if m.topic == channels.EVENTS]
    assert any(e.get("type") == "stop" for e in events), sorted(topics)
    # the metrics endpoint counts what the view sent, by topic
    mport = next(int(a.split("=")[1]) for a in daemon.cmd if a.startswith("observe.metrics_port"))
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=20) as r:
        samples = [s for f in text_string_to_metric_families(r.read().decode())
                   for s in f.samples]
    sent = {s.labels["topic"]: s.value for s in samples
            if s.name == "edge_agent_liveview_messages_total"}
    assert sent.get(channels.LINK_STATUS, 0) >= len(status)
    assert any(s.name == "edge_agent_liveview_cpu_seconds_total" and s.value > 0
               for s in samples)
    # status.observe names all three, valid against the contract's status schema
    st = daemon.socket_cmd("status")["result"]
    jsonschema.validate(st, schema_for("status"))
    obs = st["observe"]
    assert obs["metrics"] == {"host": "127.0.0.1", "port": mport}
    assert obs["live"]["port"] == daemon.port  # type: ignore[attr-defined]
    assert obs["live"]["sent"][channels.LINK_STATUS] >= len(status)
    assert obs["recorder"]["ring_messages"] > 0 and obs["recorder"]["written"] >= 0


def test_the_shipped_foxglove_layout_is_generated_and_names_live_channels() -> None:
    from hil import foxglove_layout
    text = foxglove_layout.OUT.read_text()
    assert text == foxglove_layout.render(), "run python -m hil.foxglove_layout"
    doc = json.loads(text)
    panels: list[dict[str, object]] = []

    paths: list[str] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            if node.get("type") == "panel":
                panels.append(node)
            for k, v in node.items():
                if k in ("value", "topicPath", "topicToRender") and isinstance(v, str):
                    paths.append(v)
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc["content"])
    kinds = {p["panelType"] for p in panels}
    assert kinds == {"Plot", "StateTransitions", "RawMessages", "Log"}, kinds  # no 3D
    named = {re.match(r"/[A-Za-z0-9_/]+", p).group(0) for p in paths}  # type: ignore[union-attr]
    assert named and named <= set(channels.CHANNELS), named - set(channels.CHANNELS)
    plotted = " ".join(paths)
    for needle in (".q[", ".current[", "gripper_force", "latency_ms", "/loop.late_ms"):
        assert needle in plotted, needle
