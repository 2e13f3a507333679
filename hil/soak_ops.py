"""hil.soak's parts around the daemon: the persistent broker, the operator's MQTT client, the log.

- `persistent_broker`: tests/mosquitto.py's private Mosquitto (the shipped ACL) with persistence
  on, so the operator's session and the QoS 1 messages queued for it survive a broker restart
  (a report the daemon delivers in the second after a restart still reaches the operator).
- `Operator`: the `operator` login (MQTT 5, a session that outlives a restart); sends commands
  on `edge/<device>/cmd/<name>` and waits for the reply; notes every `report` message's id.
- `LogFollower`: the daemon's JSON log (`<state_dir>/daemon.log`), read on from where it left:
  the events the soak waits for, and a count of tracebacks and error lines.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from hil.daemon_proc import ROOT

sys.path.insert(0, str(ROOT / "tests"))  # the private broker of the daemon tests

from mosquitto import Mosquitto

DEVICE, DEVICE_PW = "dev1", "dev1-secret-pw"
OPERATOR, OPERATOR_PW = "operator", "operator-pw"
KEPT_EVENTS = frozenset({"task_started", "task_done", "task_frozen", "stop", "degraded",
                         "recovered", "model_trial", "diagnostic"})


def persistent_broker(workdir: Path) -> Mosquitto:
    broker = Mosquitto(workdir, {DEVICE: DEVICE_PW, OPERATOR: OPERATOR_PW})
    text = broker.config.read_text().replace(
        "persistence false", f"persistence true\npersistence_location {broker.dir}/")
    broker.use_config(text)
    return broker


class Operator:
    """The operator's MQTT client: commands with replies, report ids, reconnects on its own."""

    def __init__(self, broker: Mosquitto) -> None:
        self.prefix = f"edge/{DEVICE}"
        self.client = paho.Client(CallbackAPIVersion.VERSION2, client_id="soak-operator",
                                  protocol=MQTTProtocolVersion.MQTTv5)
        self.client.username_pw_set(OPERATOR, OPERATOR_PW)
        self.client.reconnect_delay_set(1, 2)
        self.replies: dict[str, queue.Queue[dict[str, Any]]] = {}
        self.report_ids: list[str] = []
        self.connected = threading.Event()
        self._lock = threading.Lock()
        self.client.on_connect = self._on_connect
        self.client.on_message = self._on_message
        self.client.on_disconnect = lambda c, u, f, rc, p: self.connected.clear()
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 7200  # the session (and its queue) outlives a restart
        self.client.connect_async(broker.host, broker.port, keepalive=5, clean_start=False,
                                  properties=props)
        self.client.loop_start()

    def _on_connect(self, c: Any, u: Any, flags: Any, rc: Any, p: Any) -> None:
        if rc.is_failure:
            return
        c.subscribe([(f"{self.prefix}/report", 1), (f"{self.prefix}/reply/#", 1)])
        self.connected.set()

    def _on_message(self, c: Any, u: Any, m: paho.MQTTMessage) -> None:
        with contextlib.suppress(ValueError):
            body = json.loads(m.payload)
            if m.topic.endswith("/report"):
                with self._lock:
                    self.report_ids.append(str(body.get("id")))
                return
            q = self.replies.get(str(body.get("id")))
            if q is not None:
                q.put(body)

    def command(self, name: str, timeout: float = 10.0, **args: Any) -> dict[str, Any] | None:
        """One command over MQTT; its reply, or None when none came in `timeout` (broker down)."""
        if not self.connected.wait(timeout):
            return None
        cid = os.urandom(6).hex()
        q: queue.Queue[dict[str, Any]] = queue.Queue()
        self.replies[cid] = q
        try:
            self.client.publish(f"{self.prefix}/cmd/{name}", json.dumps(
                {"v": 1, "id": cid, "ts": time.time(), **args}), qos=1)
            return q.get(timeout=timeout)
        except queue.Empty:
            return None
        finally:
            self.replies.pop(cid, None)

    def reports(self) -> list[str]:
        with self._lock:
            return list(self.report_ids)

    def close(self) -> None:
        self.client.loop_stop()
        with contextlib.suppress(Exception):
            self.client.disconnect()


class LogFollower:
    """The daemon's log: the events in KEPT_EVENTS (with their log time), tracebacks, errors."""

    def __init__(self, path: Path) -> None:
        self.path, self._offset = path, 0
        self.events: list[dict[str, Any]] = []
        self.tracebacks = 0
        self.built_ids: list[str] = []  # report_built lines: every report the daemon built
        self.errors: list[str] = []
        self._lock = threading.Lock()

    def poll(self) -> None:
        with self._lock:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
            end = chunk.rfind(b"\n") + 1
            self._offset += end
            for line in chunk[:end].splitlines():
                if line.startswith(b"Traceback"):
                    self.tracebacks += 1
                if not line.startswith(b"{"):
                    continue
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("level") in ("error", "critical") and len(self.errors) < 200:
                    self.errors.append(line.decode(errors="replace")[:300])
                if rec.get("event") == "report_built":
                    self.built_ids.append(str(rec.get("id")))
                if rec.get("event") == "event" and rec.get("type") in KEPT_EVENTS:
                    self.events.append(rec)

    def find(self, kind: str, since: float, **match: Any) -> list[dict[str, Any]]:
        """Events of `kind` logged at or after wall time `since`, with these field values."""
        from hil.bench_degraded import log_time

        self.poll()
        return [e for e in self.events if e.get("type") == kind and log_time(e) >= since
                and all(e.get(k) == v for k, v in match.items())]
