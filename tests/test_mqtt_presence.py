"""Presence and robustness of the bridge: retained birth/LWT with seq, `kill -9`, clean stop,
broker restart (reconnect + resubscribe + retained status), and no password in any log line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import MQTT_USERS
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.commands import CommandAPI, Mode
from edge_agent.comms.mqtt_bridge import MqttBridge
from edge_agent.comms.mqtt_common import Topics
from edge_agent.comms.mqtt_settings import MqttSettings

T1 = Topics("edge/dev1")  # its command and reply topics

REPO = Path(__file__).resolve().parents[1]
CHILD = textwrap.dedent("""
    import json, logging, os, signal, sys, threading, time
    from edge_agent.logsetup import configure_logging
    configure_logging("debug", "json", stream=sys.stdout)
    logging.getLogger().addHandler(logging.StreamHandler(sys.stderr))  # paho's own debug lines
    from edge_agent.commands import CommandAPI, Mode
    from edge_agent.comms.mqtt_bridge import MqttBridge
    from edge_agent.comms.mqtt_settings import MqttSettings
    api = CommandAPI(lambda: Mode.IDLE)
    api.register("status", lambda args, ctx: {"alive": True})
    bridge = MqttBridge(MqttSettings(
        device_id="dev1", host="127.0.0.1", port=int(sys.argv[1]),
        password=os.environ["EDGE_TEST_MQTT_PASSWORD"], boot_id=sys.argv[2],
        reconnect_min_s=0.05, reconnect_max_s=0.5), api)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    bridge.start()
    # up to 10 s for the connection, but a SIGTERM ends the wait (a refused one never comes)
    ready, end = False, time.monotonic() + 10
    while not (ready or stop.is_set()) and time.monotonic() < end:
        ready = bridge.wait_ready(0.05)
    print(json.dumps({"event": "child_ready", "ready": ready}), flush=True)
    stop.wait()
    bridge.stop()
    print(json.dumps({"event": "child_stopped"}), flush=True)
""")


class Child:
    """The bridge in its own process, logging everything (JSON lines + paho DEBUG)."""

    def __init__(self, broker: Mosquitto, tmp: Path, password: str) -> None:
        self.boot_id = uuid.uuid4().hex
        script = tmp / "bridge_child.py"
        script.write_text(CHILD)
        env = {**os.environ, "EDGE_TEST_MQTT_PASSWORD": password,
               "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen([sys.executable, str(script), str(broker.port),
                                      self.boot_id], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=env, cwd=tmp)
        self.lines: list[str] = []
        self.errors: list[str] = []
        self._threads = [threading.Thread(target=self._pump, args=(s, out), daemon=True)
                         for s, out in ((self.proc.stdout, self.lines),
                                        (self.proc.stderr, self.errors))]
        for t in self._threads:
            t.start()

    def _pump(self, stream: Any, out: list[str]) -> None:
        for raw in stream:
            out.append(raw.decode("utf-8", "replace"))

    def wait_ready(self) -> None:
        wait_until(lambda: any('"child_ready"' in line for line in self.lines)
                   or self.proc.poll() is not None, 20, "the child bridge to start")
        ready = [json.loads(line) for line in self.lines if '"child_ready"' in line]
        assert ready and ready[0]["ready"], self.output()

    def finish(self, sig: int) -> int:
        self.proc.send_signal(sig)
        rc = self.proc.wait(20)
        for t in self._threads:
            t.join(10)
        return rc

    def output(self) -> str:
        return "".join(self.lines) + "".join(self.errors)


@pytest.fixture
def watcher(broker: Mosquitto) -> Iterator[Probe]:
    p = Probe(broker, "operator", MQTT_USERS["operator"])
    assert not p.connect().is_failure
    p.subscribe("edge/dev1/status")
    p.subscribe(T1.reply_filter)
    yield p
    p.close()


def status(probe: Probe, state: str, boot_id: str) -> dict[str, Any]:
    def match(m: Any) -> bool:
        d = json.loads(m.payload)
        return m.topic == "edge/dev1/status" and d["state"] == state and d["boot_id"] == boot_id
    data: dict[str, Any] = json.loads(probe.expect(match, 20).payload)
    return data


def test_last_will_fires_on_kill_9(broker: Mosquitto, watcher: Probe, tmp_path: Path) -> None:
    child = Child(broker, tmp_path, MQTT_USERS["dev1"])
    try:
        child.wait_ready()
        online = status(watcher, "online", child.boot_id)
        assert online == {"v": 1, "state": "online", "boot_id": child.boot_id,
                          "version": online["version"], "seq": 0, "config_hash": ""}
    finally:
        child.finish(signal.SIGKILL)
    offline = status(watcher, "offline", child.boot_id)
    assert offline == {**online, "state": "offline"}  # the same seq: Sparkplug bdSeq pairing
    late = Probe(broker, "operator", MQTT_USERS["operator"])  # retained for newcomers
    try:
        late.connect()
        late.subscribe("edge/dev1/status")
        assert json.loads(late.expect("edge/dev1/status").payload)["state"] == "offline"
    finally:
        late.close()


def test_clean_stop_publishes_offline_and_no_password_is_logged(
        broker: Mosquitto, watcher: Probe, tmp_path: Path) -> None:
    password = MQTT_USERS["dev1"]
    child = Child(broker, tmp_path, password)
    child.wait_ready()
    status(watcher, "online", child.boot_id)
    watcher.publish(T1.cmd("status"), b'{"v": 1, "id": "p1"}')
    watcher.publish(T1.cmd("status"), b'{"v": 1, "id": "p2", "bad": true}')
    watcher.publish(T1.cmd("status"), b"not json")
    for cid in ("p1", "p2"):
        watcher.expect(lambda m, c=cid: json.loads(m.payload).get("id") == c)
    assert child.finish(signal.SIGTERM) == 0
    assert status(watcher, "offline", child.boot_id)["seq"] == 0
    out = child.output()
    assert '"child_stopped"' in out and '"mqtt_connecting"' in out
    assert "Sending CONNECT" in out  # paho's debug lines were captured too
    assert password not in out
    # A refused connection (wrong password) is logged without the password either.
    wrong = "Wr0ng-" + uuid.uuid4().hex
    bad = Child(broker, tmp_path, wrong)
    wait_until(lambda: '"mqtt_connect_refused"' in "".join(bad.lines), 20, "the refusal")
    bad.finish(signal.SIGTERM)
    assert wrong not in bad.output() and '"mqtt_connect_refused"' in bad.output()


def test_broker_restart_reconnects_resubscribes_and_republishes_status(
        broker: Mosquitto) -> None:
    api = CommandAPI(lambda: Mode.IDLE)
    api.register("status", lambda a, c: {"alive": True})
    ups: list[bool] = []
    bridge = MqttBridge(MqttSettings(device_id="dev1", host=broker.host, port=broker.port,
                                     password=MQTT_USERS["dev1"], boot_id="b-restart",
                                     reconnect_min_s=0.05, reconnect_max_s=0.3),
                        api, on_connection=ups.append)
    bridge.start()
    try:
        assert bridge.wait_ready(10) and bridge.seq == 0
        bridge.publish_state({"mode": "idle", "state": "idle", "degraded": [], "homed": True})
        broker.restart()  # persistence off: sessions and retained messages are gone
        wait_until(lambda: bridge.ready and bridge.seq == 1, 20, "reconnect after restart")
        assert ups[:3] == [True, False, True]
        probe = Probe(broker, "operator", MQTT_USERS["operator"])
        try:
            probe.connect()
            probe.subscribe("edge/dev1/status")
            probe.subscribe("edge/dev1/state")
            probe.subscribe(T1.reply_filter)
            st = json.loads(probe.expect("edge/dev1/status").payload)
            assert (st["state"], st["seq"], st["boot_id"]) == ("online", 1, "b-restart")
            assert json.loads(probe.expect("edge/dev1/state").payload)["homed"] is True
            probe.publish(T1.cmd("status"), b'{"v": 1, "id": "after-restart"}')
            reply = json.loads(probe.expect(T1.reply("status")).payload)
            assert reply["id"] == "after-restart" and reply["ok"]
        finally:
            probe.close()
    finally:
        bridge.stop()
