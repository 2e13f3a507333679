"""Issue 16, items 2, 5 and 6 on the MQTT side, against a private Mosquitto with the shipped config
and ACL, openssl-made certificates and real daemon processes:

- another device's login cannot knock a robot off the broker (use_username_as_clientid);
- `check-config` loads the TLS files as the daemon will (bad pair, encrypted key, bad CA);
- a daemon whose TLS files fail at start-up keeps retrying, says why in `status`, and connects
  once the files are fixed — without a restart;
- an MQTT 5 response topic outside `<prefix>/reply/` is not honoured (no fleet e-stop by reply).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from conftest import MQTT_USERS
from daemon_proc import REPO, DaemonProc
from mosquitto import Mosquitto, Probe, wait_until
from paho.mqtt.enums import CallbackAPIVersion
from pki import EC_KEY, make_pki, openssl, shipped_tls_broker

from edge_agent.commands import CommandAPI, Mode
from edge_agent.comms.mqtt_bridge import MqttBridge
from edge_agent.comms.mqtt_common import Topics
from edge_agent.comms.mqtt_settings import MqttSettings

T1 = Topics("edge/dev1")  # its command and reply topics
T2 = Topics("edge/dev2")


@pytest.fixture
def shipped(tmp_path: Path) -> Iterator[tuple[Mosquitto, int, Path]]:
    """docs/mosquitto/mosquitto.conf + docs/mosquitto/acl: plain on broker.port, TLS on the int."""
    with shipped_tls_broker(tmp_path) as running:
        yield running


def _intrude(port: int, ca: Path | None, times: int) -> None:
    """Log in as dev1 asking for client id `dev2`, `times` times (each waits for its CONNACK)."""
    connacks: list[Any] = []
    for i in range(times):
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id="dev2",
                        protocol=paho.MQTTv311)
        c.username_pw_set("dev1", MQTT_USERS["dev1"])
        if ca is not None:
            c.tls_set(ca_certs=str(ca))
        c.on_connect = lambda cl, u, f, rc, p: connacks.append(rc)
        c.connect("127.0.0.1", port, keepalive=10)
        c.loop_start()
        wait_until(lambda n=i + 1: len(connacks) >= n, 10,  # type: ignore[misc]
                   "the intruder's CONNACK")
        c.disconnect()
        c.loop_stop()


def test_another_devices_login_cannot_knock_a_robot_off(
        tmp_path: Path, shipped: tuple[Mosquitto, int, Path]) -> None:
    broker, tls_port, pki = shipped
    d = DaemonProc(tmp_path, broker, device="dev2", password=MQTT_USERS["dev2"]).start()
    operator = Probe(broker, "operator", MQTT_USERS["operator"], client_id="ops-test")
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["mqtt_connected"], 30,
                   "dev2 connected and subscribed")
        _intrude(broker.port, None, 5)  # the plain listener
        _intrude(tls_port, pki / "ca.crt", 5)  # and the TLS one
        # a command round trip after the intrusions: the broker has handled every CONNECT
        operator.connect()
        operator.subscribe(T2.reply_filter)
        operator.publish(T2.cmd("status"), json.dumps({"v": 1, "id": "after"}))
        reply = json.loads(operator.expect(T2.reply("status"), timeout=15).payload)
        assert reply["ok"] and reply["id"] == "after"
        mqtt = d.socket_cmd("status")["result"]["mqtt"]
        assert mqtt["connected"] and mqtt["connections"] == 1, mqtt  # never knocked off
        assert not d.events("mqtt_disconnected"), d.events("mqtt_disconnected")
        assert "already connected, closing old connection" not in broker.log()
    finally:
        operator.close()
        d.stop()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edge_agent.cli", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def _client_pki(pki: Path) -> None:
    """A client certificate for dev1 (signed by the CA), a foreign key, an encrypted key."""
    openssl("req", *EC_KEY, "-keyout", "dev1.key", "-out", "dev1.csr", "-subj", "/CN=dev1",
            cwd=pki)
    openssl("x509", "-req", "-in", "dev1.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "dev1.crt", "-days", "2", cwd=pki)
    openssl("genpkey", "-algorithm", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-out", "other.key", cwd=pki)
    openssl("pkey", "-in", "dev1.key", "-aes256", "-passout", "pass:s3cret", "-out",
            "dev1.enc.key", cwd=pki)
    for k in ("dev1.key", "other.key", "dev1.enc.key"):
        (pki / k).chmod(0o600)


def _tls_sets(pki: Path, key: str, port: int) -> tuple[str, ...]:
    return (f"mqtt.port={port}", f"mqtt.tls.ca_file={pki / 'ca.crt'}",
            f"mqtt.tls.cert_file={pki / 'dev1.crt'}", f"mqtt.tls.key_file={pki / key}")


@pytest.mark.parametrize(("key", "ca", "bad_key", "why"), [
    ("other.key", "ca.crt", "mqtt.tls.key_file", "does not belong to mqtt.tls.cert_file"),
    ("dev1.enc.key", "ca.crt", "mqtt.tls.key_file", "protected by a passphrase"),
    ("dev1.key", "dev1.csr", "mqtt.tls.ca_file", "cannot be loaded as CA certificates"),
    ("dev1.key", "ca.crt", "", ""),
])
def test_check_config_loads_the_tls_files_as_the_daemon_will(
        tmp_path: Path, key: str, ca: str, bad_key: str, why: str) -> None:
    pki = tmp_path / "certs"
    make_pki(pki)
    _client_pki(pki)
    sets = [*_tls_sets(pki, key, 8883), f"mqtt.tls.ca_file={pki / ca}"]
    args = ["check-config", str(REPO / "configs" / "sim.toml"), "--sim"]
    for s in sets:
        args += ["--set", s]
    r = _cli(*args)
    if not bad_key:
        assert r.returncode == 0, r.stderr
        return
    assert r.returncode == 1, r.stdout
    assert f"{bad_key} = " in r.stderr and why in r.stderr, r.stderr
    assert "s3cret" not in r.stderr and "Traceback" not in r.stderr


def test_a_tls_failure_at_start_up_is_retried_visible_and_recovers(
        tmp_path: Path, shipped: tuple[Mosquitto, int, Path]) -> None:
    broker, tls_port, pki = shipped
    _client_pki(pki)
    live_key = tmp_path / "live.key"  # the key the daemon is configured with: wrong at first
    shutil.copyfile(pki / "other.key", live_key)
    live_key.chmod(0o600)
    sets = (*_tls_sets(pki, "dev1.key", tls_port), f"mqtt.tls.key_file={live_key}")
    d = DaemonProc(tmp_path, broker, extra=sets).start()
    try:
        d.wait_ready()  # READY without MQTT: local e-stop and the robot do not wait for it
        wait_until(lambda: (d.socket_cmd("status")["result"]["mqtt"]["error"] or "").startswith(
            "mqtt.tls.key_file"), 20, "the bridge's failure in status")
        status = d.socket_cmd("status")["result"]
        assert status["mqtt_connected"] is False and status["mqtt"]["connected"] is False
        assert "does not belong to mqtt.tls.cert_file" in status["mqtt"]["error"]
        wait_until(lambda: d.socket_cmd("status")["result"]["mqtt"].get("attempts", 0) >= 2,
                   20, "a second attempt")  # it retries, it did not give up after one
        failures = d.events("mqtt_bridge_failed")
        assert failures and "mqtt.tls.key_file" in failures[0]["error"], failures
        shutil.copyfile(pki / "dev1.key", live_key)  # the operator fixes the key
        wait_until(lambda: d.socket_cmd("status")["result"]["mqtt_connected"], 30,
                   "connected once the key is fixed, without a restart")
        assert d.socket_cmd("status")["result"]["mqtt"]["error"] is None
    finally:
        d.stop()


def test_a_response_topic_outside_reply_is_not_honoured(broker: Mosquitto) -> None:
    # No ACL keeps the device in its own topics here: the daemon itself must.
    open_broker = broker
    open_broker.stop()
    (open_broker.dir / "acl").write_text("pattern readwrite #\nuser operator\ntopic readwrite #\n")
    open_broker.start()
    api = CommandAPI(lambda: Mode.IDLE)
    api.register("status", lambda a, c: {"ok": True})
    estops: list[str] = []
    bridge = MqttBridge(MqttSettings(device_id="dev1", host="127.0.0.1", port=open_broker.port,
                                     password=MQTT_USERS["dev1"]), api, on_estop=estops.append)
    watcher = Probe(open_broker, "operator", MQTT_USERS["operator"], client_id="watcher")
    bridge.start()
    try:
        assert bridge.wait_ready(15), open_broker.log()
        watcher.connect()
        watcher.subscribe("edge/#")
        for i, topic in enumerate((T1.fleet_estop, T2.cmd("estop"),
                                   "edge/dev1/status", "edge/dev1/reply/+")):
            watcher.publish(T1.cmd("status"), json.dumps({"v": 1, "id": f"rt-{i}"}),
                            response_topic=topic, correlation=b"c")
            msg = watcher.expect(lambda m, i=i: m.topic.startswith("edge/dev1/reply/")  # type: ignore[misc]
                                 and json.loads(m.payload).get("id") == f"rt-{i}")
            assert msg.topic == T1.reply("status")  # the device's own reply topic
        stray = [m.topic for m in watcher.drain() if ("/cmd/" in m.topic and "estop" in m.topic)
                 or (m.topic == "edge/dev1/status" and b"rt-" in m.payload)]
        assert stray == [] and estops == [], stray
        assert bridge.counters["response_topic_refused"] == 4
    finally:
        watcher.close()
        bridge.stop()

