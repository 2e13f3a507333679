"""The MQTT bridge against a private Mosquitto (password file + ACL): commands, replies, expiry,
e-stop, dedup, malformed payloads, ACLs, publish helpers, round-trip figures."""

from __future__ import annotations

import json
import os
import socket
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import MQTT_USERS
from mosquitto import Mosquitto, Probe, wait_until
from tcp_proxy import TcpProxy

from edge_agent.clock import ManualClock
from edge_agent.commands import CommandAPI, CommandContext, Freshness, Mode
from edge_agent.comms.inbox import CommandInbox, InboundCommand
from edge_agent.comms.mqtt_bridge import MqttBridge
from edge_agent.comms.mqtt_common import Topics
from edge_agent.comms.mqtt_settings import MqttSettings
from edge_agent.errors import ConfigError
from edge_agent.log import capture_logs

T1 = Topics("edge/dev1")  # its command and reply topics
T2 = Topics("edge/dev2")


class Device:
    """A CommandAPI with recording handlers plus the bridge under test."""

    def __init__(self, broker: Mosquitto, **kwargs: Any) -> None:
        self.clock = kwargs.pop("clock", None) or ManualClock(1000.0)
        self.freshness = Freshness()
        port = kwargs.pop("port", broker.port)
        self.api = CommandAPI(lambda: Mode.IDLE, clock=self.clock, freshness=self.freshness)
        self.ran: list[tuple[str, str]] = []
        self.estops: list[str] = []
        self.gate = threading.Event()
        self.gate.set()
        self.entered = threading.Event()
        for name in ("status", "task.start", "estop", "reset"):
            self.api.register(name, self._record)
        settings = MqttSettings(device_id="dev1", host=broker.host, port=port,
                                password=MQTT_USERS["dev1"], reconnect_min_s=0.05,
                                reconnect_max_s=0.5, **kwargs)
        self.bridge = MqttBridge(settings, self.api, on_estop=self.estops.append,
                                 clock=self.clock)

    def _record(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        self.ran.append((ctx.command, ctx.id))
        self.entered.set()
        assert self.gate.wait(20)
        return {"command": ctx.command}

    def start(self) -> Device:
        self.bridge.start()
        assert self.bridge.wait_ready(10), "bridge did not connect and subscribe"
        return self

    def ids(self) -> list[str]:
        return [cid for _, cid in self.ran]


@pytest.fixture
def operator(broker: Mosquitto) -> Iterator[Probe]:
    p = Probe(broker, "operator", MQTT_USERS["operator"])
    assert not p.connect().is_failure
    assert not p.subscribe(T1.reply_filter)[0].is_failure
    yield p
    p.close()


@pytest.fixture
def device(broker: Mosquitto) -> Iterator[Device]:
    d = Device(broker).start()
    yield d
    d.gate.set()
    d.bridge.stop()


def body(cid: str, **args: Any) -> bytes:
    return json.dumps({"v": 1, "id": cid, **args}).encode()


def reply_for(probe: Probe, cid: str | None, timeout: float = 10.0) -> dict[str, Any]:
    msg = probe.expect(lambda m: json.loads(m.payload).get("id") == cid, timeout)
    data: dict[str, Any] = json.loads(msg.payload)
    data["_topic"] = msg.topic
    return data


def test_anonymous_and_wrong_password_are_refused(broker: Mosquitto) -> None:
    for user, pw in [(None, None), ("dev1", "wrong"), ("nobody", "x")]:
        p = Probe(broker, user, pw)
        try:
            rc = p.connect()
            assert rc.is_failure and rc.getName() in ("Not authorized", "Bad user name or password")
        finally:
            p.close()


def test_a_device_cannot_read_or_write_another_devices_topics(broker: Mosquitto,
                                                              operator: Probe) -> None:
    dev2 = Probe(broker, "dev2", MQTT_USERS["dev2"], client_id="dev2")
    try:
        assert not dev2.connect().is_failure
        dev2.subscribe(T1.cmd_filter)  # granted by mosquitto 2.0, but never delivered
        dev2.subscribe(T2.cmd_filter)
        operator.subscribe("edge/dev1/#")
        operator.publish(T1.cmd("status"), body("for-dev1"))
        dev2.publish(T1.cmd("estop"), body("spoofed"))  # write denied by the ACL
        dev2.publish("edge/dev1/status", b'{"state": "online"}')
        operator.publish(T2.cmd("status"), body("for-dev2"))
        got = dev2.expect(lambda m: T2.command_name(m.topic) is not None)
        assert json.loads(got.payload)["id"] == "for-dev2"
        assert all(not m.topic.startswith("edge/dev1/") for m in dev2.drain())
        operator.publish(T1.cmd("marker"), body("marker"))
        operator.expect(T1.cmd("marker"))
        seen = [json.loads(m.payload).get("id") for m in operator.drain()]
        assert "spoofed" not in seen
        assert not [m for m in operator.drain() if m.topic == "edge/dev1/status"]
    finally:
        dev2.close()


def test_command_gets_its_reply(device: Device, operator: Probe) -> None:
    operator.publish(T1.cmd("status"), body("s-1"))
    reply = reply_for(operator, "s-1")
    assert reply == {"v": 1, "id": "s-1", "ok": True, "result": {"command": "status"},
                     "_topic": T1.reply("status")}
    sock = device.bridge._client.socket()  # TCP_NODELAY was set on paho's socket
    assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0


def test_response_topic_and_correlation_data_are_honoured(device: Device,
                                                          operator: Probe) -> None:
    private = f"{T1.reply('status')}/abc"  # under the device's reply topics: honoured
    operator.publish(T1.cmd("status"), body("rr-1"), response_topic=private,
                     correlation=b"corr-7")
    msg = operator.expect(private)
    assert msg.properties.CorrelationData == b"corr-7"
    assert json.loads(msg.payload)["id"] == "rr-1"


def test_duplicate_command_runs_once_and_is_answered_twice(device: Device,
                                                           operator: Probe) -> None:
    operator.publish(T1.cmd("task.start"), body("dup-1"))
    operator.publish(T1.cmd("task.start"), body("dup-1"))
    first, second = reply_for(operator, "dup-1"), reply_for(operator, "dup-1")
    assert first == second and first["ok"]
    assert device.ids().count("dup-1") == 1


def test_dotted_alias_topics_are_served_and_answered_on_their_own_reply_topic(
        device: Device, operator: Probe) -> None:
    operator.publish(T1.cmd("task.start"), body("new-1"))
    assert reply_for(operator, "new-1")["_topic"] == "edge/dev1/reply/task/start"
    with capture_logs() as logs:
        operator.publish(T1.legacy_cmd("task.start"), body("old-1"))  # cmd/task.start
        reply = reply_for(operator, "old-1")
    assert reply["ok"] and reply["_topic"] == "edge/dev1/reply/task.start", reply
    assert device.ran == [("task.start", "new-1"), ("task.start", "old-1")]
    assert device.bridge.counters["legacy_topic"] == 1
    served = [e for e in logs if e["event"] == "mqtt_legacy_topic_served"]
    assert served and served[0]["use"] == "edge/dev1/cmd/task/start", served


def test_dotted_alias_topics_are_ignored_when_turned_off(broker: Mosquitto,
                                                         operator: Probe) -> None:
    dev = Device(broker, legacy_topics=False).start()
    try:
        with capture_logs() as logs:
            operator.publish(T1.legacy_cmd("task.start"), body("old-2"))
            operator.publish(T1.cmd("status"), body("marker-2"))
            assert reply_for(operator, "marker-2")["ok"]
        assert "old-2" not in dev.ids()
        assert not [m for m in operator.drain() if b"old-2" in m.payload]  # and no reply
        assert dev.bridge.counters["ignored"] == 1 and dev.bridge.counters["legacy_topic"] == 0
        assert [e["key"] for e in logs if e["event"] == "mqtt_legacy_topic_ignored"] == [
            "mqtt.legacy_topics"]
    finally:
        dev.bridge.stop()


@pytest.mark.parametrize(("cid", "payload", "code"), [
    ("m-json", b'{"id": "m-json", "v": 1,', "bad_json"),
    ("m-deep", b'{"id": "m-deep", "v": 1, "x": ' + b"[" * 12 + b"]" * 12 + b"}", "too_deep"),
    ("m-type", b'{"id": "m-type", "v": 1, "params": {"object": [1, "a", 3]}}', "bad_args"),
    ("m-ver", b'{"id": "m-ver", "v": 3}', "bad_version"),
    ("m-big", b'{"id": "m-big", "v": 1, "pad": "' + b"x" * 70000 + b'"}', "too_large"),
])
def test_malformed_payloads_get_error_replies(device: Device, operator: Probe, cid: str,
                                              payload: bytes, code: str) -> None:
    operator.publish(T1.cmd("task.start"), payload)
    reply = reply_for(operator, cid)
    assert reply["ok"] is False and reply["error"]["code"] == code
    assert cid not in device.ids()


def test_unknown_command_and_missing_id(device: Device, operator: Probe) -> None:
    operator.publish(T1.cmd("teleport"), body("u-1"))
    reply = reply_for(operator, "u-1")
    assert reply["error"]["code"] == "unknown_command"
    assert reply["_topic"] == T1.reply("teleport")
    with capture_logs() as logs:
        operator.publish(T1.cmd("status"), b'{"v": 1}')  # no id: nothing to reply to
        operator.publish(T1.cmd("status"), b"\xff\xfe")  # not even text
        operator.publish(T1.cmd("status"), body("after"))
        assert reply_for(operator, "after")["ok"]
    codes = [e.get("code") for e in logs if e["event"] == "command_rejected"]
    assert codes == ["missing_id", "bad_json"]
    assert [e for e in logs if e["event"] == "mqtt_reply_unroutable"]


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_nothing_published_during_a_network_blip_is_delivered(broker: Mosquitto, operator: Probe,
                                                             protocol: str) -> None:
    """Every (re)connection is a clean session: the broker queues nothing for the daemon while
    the link is down (before: a persistent session handed it over on reconnect)."""
    proxy = TcpProxy(broker.host, broker.port)
    dev = Device(broker, port=proxy.port, protocol=protocol).start()
    try:
        proxy.cut()
        wait_until(lambda: not dev.bridge.connected, 10, "the bridge to see the link go")
        operator.publish(T1.cmd("task.start"), body(f"blip-{protocol}"), expiry=60)
        proxy.restore()
        assert dev.bridge.wait_ready(20), "no reconnect after the blip"
        assert dev.bridge.counters["connections"] == 2
        operator.publish(T1.cmd("status"), body(f"marker-{protocol}"))
        assert reply_for(operator, f"marker-{protocol}")["ok"]
        assert dev.ids() == [f"marker-{protocol}"]
    finally:
        dev.bridge.stop()
        proxy.close()


def test_a_motion_command_waiting_in_the_inbox_when_a_stop_trips_is_stale(
        broker: Mosquitto, operator: Probe) -> None:
    """A task.start queued behind a slow command while a stop trips and is reset is answered
    `stale`, never run; a status queued beside it still runs."""
    dev = Device(broker).start()
    try:
        dev.gate.clear()
        dev.entered.clear()
        operator.publish(T1.cmd("status"), body("slow"))
        assert dev.entered.wait(10)
        operator.publish(T1.cmd("task.start"), body("queued-start"))
        operator.publish(T1.cmd("status"), body("queued-status"))
        wait_until(lambda: dev.bridge.inbox.depth() == 2, 10, "both to be queued")
        dev.freshness.note_trip()  # what the daemon's latch listener does on a stop ...
        dev.freshness.note_reset()  # ... and on its reset
        dev.gate.set()
        stale = reply_for(operator, "queued-start")
        assert stale["error"]["code"] == "stale" and "before the latest stop" in \
            stale["error"]["message"], stale
        assert reply_for(operator, "queued-status")["ok"]
        assert dev.ids() == ["slow", "queued-status"]
        assert dev.api.counters["stale"] == 1
    finally:
        dev.gate.set()
        dev.bridge.stop()


def test_expired_in_the_inbox_is_refused_but_an_expired_estop_still_stops(
        broker: Mosquitto, operator: Probe) -> None:
    dev = Device(broker).start()
    try:
        dev.gate.clear()
        dev.entered.clear()
        operator.publish(T1.cmd("task.start"), body("blocker"))
        assert dev.entered.wait(10)
        operator.publish(T1.cmd("status"), body("late"), expiry=5)
        wait_until(lambda: dev.bridge.inbox.depth() == 1, 10, "the command to be queued")
        dev.clock.advance(10)  # the worker takes it 10 s after it arrived with 5 s to live
        operator.publish(T1.cmd("estop"), body("stop-late", expires_at=1.0), expiry=1)
        wait_until(lambda: dev.estops == ["mqtt"], 10, "on_estop from paho's thread")
        dev.gate.set()
        late = reply_for(operator, "late")
        assert late["error"]["code"] == "expired"
        assert reply_for(operator, "stop-late")["ok"] is True
        assert "late" not in dev.ids() and "stop-late" in dev.ids()
    finally:
        dev.gate.set()
        dev.bridge.stop()


def test_fleet_estop_and_garbage_estop_trip(device: Device, operator: Probe) -> None:
    operator.publish(T1.fleet_estop, body("fleet-1"))
    assert reply_for(operator, "fleet-1")["ok"]
    operator.publish(T1.cmd("estop"), b"\x00garbage")
    wait_until(lambda: device.estops == ["fleet", "mqtt"], 10, "both e-stops")


def test_retained_commands_are_never_run(broker: Mosquitto, operator: Probe) -> None:
    """A stored retained command: MQTT 5 is not even sent it (retain handling 2); 3.1.1 gets it
    with the flag on subscribing and answers `retained`. A retained command published while
    subscribed: MQTT 5 keeps the flag (retain-as-published) and answers `retained`."""
    operator.publish(T1.cmd("task.start"), body("retained-1"), retain=True)
    for protocol in ("5", "3.1.1"):
        dev = Device(broker, protocol=protocol).start()
        try:
            operator.publish(T1.cmd("status"), body(f"marker-{protocol}"))
            assert reply_for(operator, f"marker-{protocol}")["ok"]
            assert "retained-1" not in dev.ids()
            if protocol == "3.1.1":
                assert reply_for(operator, "retained-1")["error"]["code"] == "retained"
        finally:
            dev.bridge.stop()
    assert not [m for m in operator.drain() if json.loads(m.payload).get("id") == "retained-1"]
    dev = Device(broker).start()
    try:
        operator.publish(T1.cmd("task.start"), body("retained-live"), retain=True)
        refused = reply_for(operator, "retained-live")
        assert refused["error"]["code"] == "retained", refused
        assert dev.ids() == [] and dev.bridge.counters["retained"] == 1
    finally:
        operator.publish(T1.cmd("task.start"), b"", retain=True)
        dev.bridge.stop()


def test_mqtt_311_round_trip(broker: Mosquitto, operator: Probe) -> None:
    dev = Device(broker, protocol="3.1.1").start()
    try:
        operator.publish(T1.cmd("status"), body("v311"))
        assert reply_for(operator, "v311")["ok"]
    finally:
        dev.bridge.stop()


def test_inbox_overflow_is_answered_overloaded(broker: Mosquitto, operator: Probe) -> None:
    dev = Device(broker, inbox_size=1).start()
    try:
        dev.gate.clear()
        operator.publish(T1.cmd("task.start"), body("held"))
        assert dev.entered.wait(10)
        operator.publish(T1.cmd("status"), body("queued"))
        operator.publish(T1.cmd("status"), body("dropped"))
        assert reply_for(operator, "dropped")["error"]["code"] == "overloaded"
        dev.gate.set()
        assert reply_for(operator, "queued")["ok"]
        assert dev.bridge.inbox.overflow == 1
    finally:
        dev.gate.set()
        dev.bridge.stop()


def test_publish_helpers(device: Device, operator: Probe, broker: Mosquitto) -> None:
    operator.subscribe("edge/dev1/#")
    assert device.bridge.publish_state({"mode": "idle", "state": "idle", "degraded": []})
    assert device.bridge.publish_event({"type": "ready", "startup_ms": 12})
    report = {"id": "r1", "kind": "fault", "markdown": "# x"}
    assert device.bridge.publish_report(report) is not None
    assert device.bridge.publish_telemetry({"loop_hz": 200})
    assert not device.bridge.publish_telemetry({"loop_hz": 200})  # rate-limited
    device.clock.advance(1.5)
    assert device.bridge.publish_telemetry({"loop_hz": 199})
    for topic in ("state", "event", "report", "telemetry"):
        assert json.loads(operator.expect(f"edge/dev1/{topic}").payload)["v"] == 1
    late = Probe(broker, "operator", MQTT_USERS["operator"])  # the state is retained
    try:
        late.connect()
        late.subscribe("edge/dev1/state")
        msg = late.expect("edge/dev1/state")
        assert msg.retain and json.loads(msg.payload)["mode"] == "idle"
    finally:
        late.close()


def test_round_trip_figures(broker: Mosquitto, operator: Probe, capsys: Any) -> None:
    """All of N commands answered (functional); prints P50/P99 vs a raw paho echo baseline."""
    n = int(os.environ.get("EDGE_MQTT_BENCH_N", "300"))
    dev = Device(broker, clock=ManualClock(0.0)).start()
    echo = Probe(broker, "operator", MQTT_USERS["operator"])
    try:
        echo.connect()
        echo.subscribe(T1.cmd("echo"))
        echo.client.on_message = lambda c, u, m: c.publish(T1.reply("echo"), m.payload, 1)
        operator.subscribe(T1.reply_filter)

        def run(topic: str) -> list[float]:
            out = []
            for _ in range(n):
                cid = uuid.uuid4().hex
                t0 = time.perf_counter()
                operator.publish(topic, body(cid), timeout=10)
                reply_for(operator, cid)
                out.append((time.perf_counter() - t0) * 1000)
            return sorted(out)

        base, bridge = run(T1.cmd("echo")), run(T1.cmd("status"))
        assert len(bridge) == n and len(dev.ran) == n
        with capsys.disabled():
            for label, xs in (("raw paho echo", base), ("bridge status", bridge)):
                print(f"\n{label}: n={n} P50={statistics.median(xs):.2f} ms "
                      f"P99={xs[int(0.99 * (n - 1))]:.2f} ms max={xs[-1]:.2f} ms")
    finally:
        echo.close()
        dev.bridge.stop()


def test_stop_is_idempotent_and_start_after_stop_is_a_no_op(broker: Mosquitto) -> None:
    dev = Device(broker).start()
    dev.bridge.stop()
    dev.bridge.stop()
    dev.bridge.start()
    assert not dev.bridge.connected
    never = MqttBridge(MqttSettings(device_id="x", host=broker.host, port=broker.port),
                       CommandAPI(lambda: Mode.IDLE))
    never.stop()


def test_inbox_priority_lane_and_bound() -> None:
    done: list[str] = []
    gate, entered = threading.Event(), threading.Event()

    def process(item: InboundCommand) -> None:
        if item.name == "hold":
            entered.set()
            assert gate.wait(10)
        done.append(item.name)

    inbox = CommandInbox(process, maxsize=2)
    inbox.start()
    try:
        assert inbox.offer(InboundCommand("hold", b"", "mqtt", None))
        assert entered.wait(10)
        assert inbox.offer(InboundCommand("a", b"", "mqtt", None))
        assert inbox.offer(InboundCommand("b", b"", "mqtt", None))
        assert not inbox.offer(InboundCommand("c", b"", "mqtt", None))  # full
        assert inbox.offer(InboundCommand("estop", b"", "fleet", None, priority=True))
        gate.set()
        wait_until(inbox.idle, 10, "the inbox to drain")
        assert done == ["hold", "estop", "a", "b"] and inbox.overflow == 1
    finally:
        gate.set()
        inbox.stop()
        inbox.stop()
    assert not inbox.offer(InboundCommand("late", b"", "mqtt", None))


def test_inbox_bounds_the_payload_bytes_it_holds() -> None:
    """256 KiB packets (the most the daemon reads) behind a busy worker: the inbox holds at most
    MAX_QUEUED_BYTES of them and refuses the rest; an e-stop still goes in."""
    from edge_agent.comms.inbox import MAX_QUEUED_BYTES
    from edge_agent.comms.mqtt_bounded import MAX_PACKET_BYTES

    gate, entered = threading.Event(), threading.Event()

    def process(item: InboundCommand) -> None:
        if item.name == "hold":
            entered.set()
            assert gate.wait(10)

    inbox = CommandInbox(process, maxsize=256)
    inbox.start()
    big = b"x" * MAX_PACKET_BYTES
    try:
        assert inbox.offer(InboundCommand("hold", b"", "mqtt", None))
        assert entered.wait(10)
        taken = sum(inbox.offer(InboundCommand("big", big, "mqtt", None)) for _ in range(256))
        assert taken == MAX_QUEUED_BYTES // MAX_PACKET_BYTES and inbox.overflow == 256 - taken
        assert inbox.offer(InboundCommand("estop", big, "fleet", None, priority=True))
        gate.set()
        wait_until(inbox.idle, 10, "the inbox to drain")
        assert inbox.offer(InboundCommand("big", big, "mqtt", None))  # drained: room again
    finally:
        gate.set()
        inbox.stop()


def test_topics_and_device_id_checks() -> None:
    t = Topics("edge/dev1")
    # a dotted name becomes levels (NATS refuses '.' inside a level); the name stays dotted
    assert t.cmd("task.start") == "edge/dev1/cmd/task/start"
    assert t.reply("task.start") == "edge/dev1/reply/task/start"
    assert t.cmd("estop") == t.legacy_cmd("estop") == "edge/dev1/cmd/estop"
    assert t.cmd_filter == "edge/dev1/cmd/#" and t.reply_filter == "edge/dev1/reply/#"
    assert t.command_name("edge/dev1/cmd/task/start") == "task.start"
    assert t.command_name("edge/dev1/cmd/task.start") == "task.start"  # the deprecated alias
    assert t.is_legacy("edge/dev1/cmd/task.start") and not t.is_legacy(t.cmd("task.start"))
    assert t.reply_for("task.start", legacy=True) == "edge/dev1/reply/task.start"
    assert t.command_name("edge/dev1/cmd/a/b") == "a.b"  # answered unknown_command
    for other in ("edge/dev1/cmd", "edge/dev1/cmd/", "edge/dev1/cmd/a//b",
                  "edge/dev1/cmd/task/start.x", "edge/dev2/cmd/status", "edge/dev1/reply/x"):
        assert t.command_name(other) is None, other
    for bad in ("", "a/b", "dev+", "#"):
        with pytest.raises(ConfigError, match=r"device\.id"):
            MqttBridge(MqttSettings(device_id=bad), CommandAPI(lambda: Mode.IDLE))
