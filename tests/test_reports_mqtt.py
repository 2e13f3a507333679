"""Issue #19: a report on MQTT is delivered when the broker acknowledged it (QoS 1 PUBACK), not
when paho took it. Against a private Mosquitto and the real MqttBridge: a report sent while the
broker is stopped is not marked delivered, and is once the broker is back."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from conftest import MQTT_USERS
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.commands import CommandAPI, Mode
from edge_agent.comms.mqtt_bridge import MqttBridge
from edge_agent.comms.mqtt_settings import MqttSettings
from edge_agent.reports.build import build_report
from edge_agent.reports.outbox import Entry, Outbox
from edge_agent.reports.record import Origin, Report, StopRecord
from edge_agent.reports.sinks import MqttSink, Published

ORIGIN = Origin("dev1", "b00t", "cfg123", None)


def _report(wall: float) -> Report:
    rec = StopRecord("protective_stop", "collision", ("collision",), False, wall, 12.5,
                     "running", "transfer", {"task_id": "job-1", "state": "transfer"}, None)
    return build_report(rec, ORIGIN, [])


class _Counted:
    """Paho's message handle, counting how often the sink asked whether it was acknowledged."""

    def __init__(self, inner: Published) -> None:
        self.inner = inner
        self.polls = 0

    def is_published(self) -> bool:
        self.polls += 1
        return self.inner.is_published()


@pytest.fixture
def bridge(broker: Mosquitto) -> Iterator[MqttBridge]:
    api = CommandAPI(lambda: Mode.IDLE)
    b = MqttBridge(MqttSettings(device_id="dev1", host=broker.host, port=broker.port,
                                password=MQTT_USERS["dev1"], reconnect_min_s=0.05,
                                reconnect_max_s=0.5), api)
    b.start()
    assert b.wait_ready(10), "bridge did not connect and subscribe"
    yield b
    b.stop()


def _outbox(tmp_path: Path, bridge: MqttBridge, handles: list[_Counted]) -> Outbox:
    def publish(payload: Mapping[str, Any]) -> Published | None:
        info = bridge.publish_report(payload)
        if info is None:
            return None
        handles.append(_Counted(info))
        return handles[-1]

    return Outbox(tmp_path / "outbox", [MqttSink(publish, "dev1", ack_timeout_s=60.0)],
                  plot=False, retry_min_s=0.05, retry_max_s=0.2)


def test_a_report_sent_to_a_frozen_broker_waits_for_its_puback(
        tmp_path: Path, broker: Mosquitto, bridge: MqttBridge) -> None:
    operator = Probe(broker, "operator", MQTT_USERS["operator"])
    handles: list[_Counted] = []
    ob = _outbox(tmp_path, bridge, handles)
    try:
        assert not operator.connect().is_failure
        assert not operator.subscribe("edge/dev1/report")[0].is_failure
        ob.start()
        broker.pause()  # the connection stays up: paho takes the message, no PUBACK comes
        try:
            report = _report(time.time())
            ob.submit(lambda: report)
            wait_until(lambda: bool(handles) and handles[0].polls >= 5, 20,
                       "the sink to ask about the PUBACK five times")
            st = ob.status()
            assert st["delivered"]["mqtt"] == 0 and ob.pending_ids() == [report.id]
            assert st["failed_attempts"]["mqtt"] == 0  # waiting is not a failed attempt
        finally:
            broker.resume()
        wait_until(lambda: ob.pending_ids() == [], 20, "the PUBACK")
        assert ob.status()["delivered"]["mqtt"] == 1
        assert len(handles) == 1  # sent once: the acknowledgement came for that send
        got = json.loads(operator.expect("edge/dev1/report").payload)
        assert got["id"] == report.id
    finally:
        ob.stop()
        operator.close()


def test_a_report_made_while_the_broker_is_stopped_is_delivered_when_it_returns(
        tmp_path: Path, broker: Mosquitto, bridge: MqttBridge) -> None:
    handles: list[_Counted] = []
    ob = _outbox(tmp_path, bridge, handles)
    ob.start()
    try:
        broker.stop()
        wait_until(lambda: not bridge.connected, 10, "the bridge to see the broker gone")
        report = _report(time.time())
        ob.submit(lambda: report)
        wait_until(lambda: ob.status()["failed_attempts"]["mqtt"] >= 3, 20, "three tries")
        assert ob.status()["delivered"]["mqtt"] == 0 and ob.pending_ids() == [report.id]
        broker.start()
        wait_until(lambda: ob.pending_ids() == [], 30, "delivery after the broker came back")
        assert ob.status()["delivered"]["mqtt"] == 1
        assert handles and handles[-1].inner.is_published()
    finally:
        ob.stop()


class _Never:
    def is_published(self) -> bool:
        return False


def test_no_puback_within_the_timeout_is_a_failed_attempt_and_sends_again() -> None:
    now = [100.0]
    sent: list[Mapping[str, Any]] = []

    def publish(payload: Mapping[str, Any]) -> Published:
        sent.append(payload)
        return _Never()

    sink = MqttSink(publish, "dev1", ack_timeout_s=5.0, clock=lambda: now[0])
    entry = Entry(_report(1_000.0), "# x", {})
    first = sink.deliver(entry, [], None, {})
    assert (first.ok, first.waiting) == (False, True) and len(sent) == 1
    now[0] += 4.9
    assert sink.deliver(entry, [], None, {}).waiting and len(sent) == 1
    now[0] += 0.1
    late = sink.deliver(entry, [], None, {})
    assert not late.ok and not late.waiting and "no PUBACK" in late.error
    assert sink.deliver(entry, [], None, {}).waiting and len(sent) == 2  # sent again
