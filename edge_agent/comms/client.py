"""What `edge-agent cmd NAME [JSON]` uses: send one command, return its reply.

Over the local control socket when it exists and answers, else over MQTT: MQTT 5 request/response
(a private response topic under `<prefix>/reply/<group>/<verb>/`, where the device's ACL lets
it write, plus correlation data and a message expiry equal to the timeout — never on `estop`),
and for MQTT 3.1.1 devices the plain `<prefix>/reply/<group>/<verb>` matched by command id.
It publishes on `<prefix>/cmd/<group>/<verb>` (`task.start` → `cmd/task/start`: Topics), never
on the deprecated dotted topics.
"""

from __future__ import annotations

import json
import math
import os
import queue
import threading
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes

from edge_agent.comms.jsonline import CommandTimeout, CommandTransportError, json_line_request
from edge_agent.comms.mqtt_common import (
    V5_CLOSED,
    TlsOptions,
    Topics,
    connect_refusal,
    make_client,
    mqtt_properties,
    protocol_number,
    reason_failed,
    set_nodelay,
    to_payload,
)


@dataclass(frozen=True)
class MqttTarget:
    """Which device, through which broker, as whom."""

    device_id: str
    host: str = "localhost"
    port: int = 1883
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: TlsOptions | None = None
    topic_prefix: str | None = None
    protocol: str = "5"
    client_id: str | None = None


def prepare_payload(payload: Mapping[str, Any] | str | None) -> dict[str, Any]:
    """JSON text or mapping → a dict with `"v": 1` and an id (generated when missing)."""
    if payload is None or payload == "":
        body: Any = {}
    elif isinstance(payload, str):
        try:
            body = json.loads(payload)
        except ValueError as exc:
            raise ValueError(f"command arguments are not JSON: {exc}") from None
    else:
        body = dict(payload)
    if not isinstance(body, dict):
        raise ValueError("command arguments must be a JSON object")
    body.setdefault("v", 1)
    body.setdefault("id", uuid.uuid4().hex)
    return body


def send_command(name: str, payload: Mapping[str, Any] | str | None = None, *,
                 socket_path: Path | str | None = None, mqtt: MqttTarget | None = None,
                 timeout: float = 5.0) -> dict[str, Any]:
    """Send command `name` and return the reply dict; raises CommandTimeout/TransportError."""
    body = prepare_payload(payload)
    if socket_path is not None and os.path.exists(socket_path):
        try:
            return _via_socket(Path(socket_path), name, body, timeout)
        except CommandTransportError:
            if mqtt is None:
                raise
    if mqtt is None:
        raise CommandTransportError(
            f"no control socket at {socket_path} and no MQTT broker configured")
    return _via_mqtt(mqtt, name, body, timeout)


def _via_socket(path: Path, name: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    return json_line_request(path, {**body, "cmd": name}, timeout, what=name)


def _via_mqtt(target: MqttTarget, name: str, body: dict[str, Any],
              timeout: float) -> dict[str, Any]:
    topics = Topics(target.topic_prefix or f"edge/{target.device_id}")
    v5 = protocol_number(target.protocol) == paho.MQTTv5
    token = uuid.uuid4().hex
    client = make_client(target.client_id or f"cmd-{token[:12]}", protocol=target.protocol,
                         username=target.username, password=target.password, tls=target.tls)
    connected = threading.Event()
    subscribed = threading.Event()
    failure: list[str] = []
    replies: queue.Queue[dict[str, Any]] = queue.Queue()
    response_topic = f"{topics.reply(name)}/{token}"

    def on_connect(c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        if reason_failed(rc):
            failure.append(connect_refusal(rc, v5=v5))
        connected.set()

    def on_disconnect(c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        if not connected.is_set():  # closed before any CONNACK
            failure.append(V5_CLOSED if v5 else f"the broker closed the connection: {rc}")
            connected.set()

    def on_subscribe(c: paho.Client, u: Any, mid: int, codes: Any, props: Any) -> None:
        if any(reason_failed(rc) for rc in codes):
            failure.append(f"subscription to {topics.reply(name)}/# refused")
        subscribed.set()

    def on_message(c: paho.Client, u: Any, msg: paho.MQTTMessage) -> None:
        correlation = getattr(getattr(msg, "properties", None), "CorrelationData", None)
        try:
            reply = json.loads(msg.payload)
        except ValueError:
            return
        if isinstance(reply, dict) and (correlation == token.encode()
                                        or (correlation is None and reply.get("id") == body["id"])):
            replies.put(reply)

    client.on_connect, client.on_subscribe, client.on_message = on_connect, on_subscribe, on_message
    client.on_disconnect = on_disconnect

    def on_socket_open(c: paho.Client, u: Any, sock: Any) -> None:
        set_nodelay(sock)

    client.on_socket_open = on_socket_open
    client.connect_timeout = timeout
    deadline = _Deadline(timeout)
    try:
        try:
            client.connect(target.host, target.port, keepalive=max(5, math.ceil(timeout) + 5))
        except OSError as exc:
            raise CommandTransportError(f"broker {target.host}:{target.port}: {exc}") from exc
        client.loop_start()
        _wait(connected, deadline, "connect to the broker", failure)
        client.subscribe(f"{topics.reply(name)}/#", qos=1)
        _wait(subscribed, deadline, "subscribe to the reply topic", failure)
        props = None
        if v5:
            props = mqtt_properties(PacketTypes.PUBLISH)
            props.ResponseTopic = response_topic
            props.CorrelationData = token.encode()
            if name != "estop":  # an e-stop must never be dropped for being late
                props.MessageExpiryInterval = max(1, math.ceil(timeout))
        client.publish(topics.cmd(name), to_payload(body), qos=1, properties=props)
        try:
            return replies.get(timeout=deadline.left())
        except queue.Empty:
            raise CommandTimeout(f"no reply to {name} within {timeout:g} s") from None
    finally:
        client.disconnect()
        client.loop_stop()


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self._end = time.monotonic() + seconds

    def left(self) -> float:
        return max(0.0, self._end - time.monotonic())


def _wait(event: threading.Event, deadline: _Deadline, what: str, failure: list[str]) -> None:
    if not event.wait(deadline.left()):
        raise CommandTimeout(f"could not {what} in time")
    if failure:
        raise CommandTransportError(failure[0])
