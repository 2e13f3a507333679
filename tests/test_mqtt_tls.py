"""docs/mosquitto/mosquitto.conf is a working config, and the bridge and `send_command` speak TLS
to its TLS listener with a CA from their arguments (and refuse a server they cannot verify)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import MQTT_USERS
from mosquitto import Mosquitto
from pki import shipped_tls_broker

from edge_agent.commands import CommandAPI, Mode
from edge_agent.comms.client import MqttTarget, send_command
from edge_agent.comms.mqtt_bridge import MqttBridge
from edge_agent.comms.mqtt_common import TlsOptions
from edge_agent.comms.mqtt_settings import MqttSettings
from edge_agent.log import capture_logs


@pytest.fixture
def tls_broker(tmp_path: Path) -> Iterator[tuple[Mosquitto, int, Path]]:
    with shipped_tls_broker(tmp_path) as running:
        yield running


def test_bridge_and_client_over_tls(tls_broker: tuple[Mosquitto, int, Path]) -> None:
    broker, port, pki = tls_broker
    api = CommandAPI(lambda: Mode.IDLE)
    api.register("status", lambda a, c: {"tls": True})
    tls = TlsOptions(ca_file=str(pki / "ca.crt"))
    bridge = MqttBridge(MqttSettings(device_id="dev1", host="127.0.0.1", port=port,
                                     password=MQTT_USERS["dev1"], tls=tls), api)
    bridge.start()
    try:
        assert bridge.wait_ready(15), broker.log()
        target = MqttTarget(device_id="dev1", host="127.0.0.1", port=port, username="operator",
                            password=MQTT_USERS["operator"], tls=tls)
        reply = send_command("status", {"id": "over-tls"}, mqtt=target, timeout=10)
        assert reply["ok"] and reply["result"] == {"tls": True}
    finally:
        bridge.stop()


def test_an_unverifiable_server_is_refused(tls_broker: tuple[Mosquitto, int, Path]) -> None:
    _broker, port, _pki = tls_broker
    api = CommandAPI(lambda: Mode.IDLE)
    with capture_logs() as logs:
        bridge = MqttBridge(MqttSettings(device_id="dev1", host="127.0.0.1", port=port,
                                         password=MQTT_USERS["dev1"],
                                         tls=TlsOptions(),  # system CAs only
                                         reconnect_min_s=0.05, reconnect_max_s=0.2), api)
        bridge.start()
        try:
            assert not bridge.wait_ready(2)
        finally:
            bridge.stop()
    failed = [e for e in logs if e["event"] == "mqtt_connect_failed"]
    # the reason is logged: OpenSSL's verify message, not just "failed"
    assert failed and all("certificate" in e["error"] for e in failed), failed
