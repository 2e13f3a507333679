"""The fleet tools' one MQTT connection: every robot's retained status/state, its events, reports
and command replies, and commands to any robot.

Robots are found by subscribing to the `status`, `state`, `event`, `report` and `reply/#` topics
of a prefix pattern (`edge/+` by default: one `+` level is the device id), built with
`mqtt_common.Topics` so a change of the topic scheme follows. A command goes to
`Topics(prefix).cmd(name)` (QoS 1) and its reply is matched by the command id on the robot's
reply topics (MQTT 3.1.1 and 5 alike).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import paho.mqtt.client as paho

from edge_agent.comms.client import MqttTarget
from edge_agent.comms.mqtt_common import (
    Topics,
    connect_failure_reason,
    make_client,
    reason_failed,
    set_nodelay,
    to_payload,
)

DEFAULT_PATTERN = "edge/+"
Listener = Callable[["Robot", str, dict[str, Any], float], None]


class FleetError(Exception):
    """The broker cannot be reached, refused us, or refused a subscription."""


@dataclass
class Robot:
    """What the broker has told us about one robot (payloads as received; times: wall clock)."""

    device: str
    prefix: str
    status: dict[str, Any] | None = None  # retained presence: online/offline, boot_id, version
    state: dict[str, Any] | None = None  # retained state: mode, state, task, stop, degraded
    last_seen: float | None = None  # when any message of it arrived (a retained one: on arrival)
    last_event: dict[str, Any] | None = None
    last_report: dict[str, Any] | None = None  # id, kind, ts (the Markdown is not kept)
    details: dict[str, Any] | None = None  # the `status` command's result, when queried
    details_at: float | None = None

    @property
    def topics(self) -> Topics:
        return Topics(self.prefix)

    @property
    def online(self) -> bool:
        return bool(self.status and self.status.get("state") == "online")


@dataclass
class _Pending:
    done: threading.Event = field(default_factory=threading.Event)
    reply: dict[str, Any] | None = None


class FleetBus:
    """See the module doc. `start()` connects and subscribes; `settle(s)` waits for retained
    messages; `command()` / `request()` talk to one robot; `close()`."""

    def __init__(self, target: MqttTarget, pattern: str = DEFAULT_PATTERN) -> None:
        levels = pattern.split("/")
        if levels.count("+") != 1 or "#" in pattern or any(not lv for lv in levels):
            raise ValueError(f"prefix pattern {pattern!r}: topic levels with exactly one + "
                             "(the device id), e.g. edge/+")
        self.pattern = pattern
        self._id_level = levels.index("+")
        self._depth = len(levels)
        self.target = target
        self.robots: dict[str, Robot] = {}
        self.lock = threading.Lock()
        self._pending: dict[str, _Pending] = {}
        self._listeners: list[Listener] = []
        self._connected = threading.Event()
        self._subscribed = threading.Event()
        self._failure: list[str] = []
        self.last_message = 0.0  # monotonic: the last message of any robot
        token = uuid.uuid4().hex[:12]
        self.client = make_client(target.client_id or f"fleet-{token}", protocol=target.protocol,
                                  username=target.username, password=target.password,
                                  tls=target.tls)
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = self._on_subscribe
        self.client.on_message = self._on_message
        self.client.on_socket_open = _nodelay

    # -- connection ------------------------------------------------------------------------
    def filters(self) -> list[str]:
        t = Topics(self.pattern)
        return [t.status, t.state, t.event, t.report, t.reply("#")]

    def start(self, timeout: float = 10.0) -> None:
        t = self.target
        self.client.connect_timeout = timeout
        try:
            self.client.connect(t.host, t.port, keepalive=30)
        except OSError as exc:
            raise FleetError(f"broker {t.host}:{t.port}: "
                             f"{connect_failure_reason(exc)}") from None
        self.client.loop_start()
        if not self._connected.wait(timeout):
            self.close()
            raise FleetError(f"broker {t.host}:{t.port}: no CONNACK within {timeout:g} s")
        if self._failure:
            self.close()
            raise FleetError(self._failure[0])
        self.client.subscribe([(f, 1) for f in self.filters()])
        if not self._subscribed.wait(timeout) or self._failure:
            self.close()
            raise FleetError(self._failure[0] if self._failure else "no SUBACK in time")

    def settle(self, settle_s: float, quiet_s: float = 0.2) -> None:
        """Wait for the retained messages: until `quiet_s` passes without one, at most
        `settle_s` (a broker sends retained messages right after the SUBACK)."""
        end = time.monotonic() + settle_s
        while time.monotonic() < end:
            quiet = time.monotonic() - max(self.last_message, 0.0)
            if self.robots and quiet >= quiet_s:
                return
            time.sleep(0.02)

    def close(self) -> None:
        try:
            self.client.disconnect()
        finally:
            self.client.loop_stop()

    def listen(self, fn: Listener) -> None:
        """`fn(robot, kind, payload, received_wall)` for every message (on paho's thread)."""
        self._listeners.append(fn)

    def _on_connect(self, c: paho.Client, u: Any, flags: Any, rc: Any, props: Any) -> None:
        if reason_failed(rc):
            self._failure.append(f"the broker refused the connection: {rc}")
        self._connected.set()

    def _on_subscribe(self, c: paho.Client, u: Any, mid: int, codes: Any, props: Any) -> None:
        if any(reason_failed(rc) for rc in codes):
            self._failure.append(f"a subscription was refused ({self.filters()}): "
                                 "does the ACL let this user read them?")
        self._subscribed.set()

    # -- messages --------------------------------------------------------------------------
    def _split(self, topic: str) -> tuple[str, str, str] | None:
        levels = topic.split("/")
        if len(levels) <= self._depth:
            return None
        prefix = "/".join(levels[:self._depth])
        return levels[self._id_level], prefix, topic[len(prefix) + 1:]

    def _on_message(self, c: paho.Client, u: Any, msg: paho.MQTTMessage) -> None:
        parts = self._split(msg.topic)
        if parts is None:
            return
        device, prefix, _ = parts
        try:
            payload = json.loads(msg.payload) if msg.payload else None
        except ValueError:
            return
        now = time.time()
        t = Topics(prefix)
        with self.lock:
            robot = self.robots.get(device)
            if robot is None:
                if msg.topic not in (t.status, t.state) or payload is None:
                    return  # robots are found by their retained status/state
                robot = self.robots[device] = Robot(device, prefix)
            if not isinstance(payload, dict):
                return
            robot.last_seen = now
            self.last_message = time.monotonic()
            if msg.topic == t.status:
                kind = "status"
                robot.status = payload
            elif msg.topic == t.state:
                kind = "state"
                robot.state = payload
            elif msg.topic == t.event:
                kind = "event"
                robot.last_event = payload
            elif msg.topic == t.report:
                kind = "report"
                robot.last_report = {k: payload.get(k) for k in ("id", "kind", "ts")}
            elif msg.topic.startswith(t.reply("")):
                kind = "reply"
                pending = self._pending.pop(str(payload.get("id")), None)
                if pending is not None:
                    pending.reply = payload
                    pending.done.set()
            else:
                return
        for fn in self._listeners:
            fn(robot, kind, payload, now)

    # -- commands --------------------------------------------------------------------------
    def command(self, robot: Robot, name: str, args: dict[str, Any] | None = None) -> _Pending:
        """Publish command `name` to `robot` (QoS 1); wait on the returned handle's `done`."""
        cid = f"fleet-{uuid.uuid4().hex[:16]}"
        pending = _Pending()
        with self.lock:
            self._pending[cid] = pending
        self.client.publish(robot.topics.cmd(name), to_payload({"id": cid, **(args or {})}),
                            qos=1)
        return pending

    def request(self, robot: Robot, name: str, args: dict[str, Any] | None = None,
                timeout: float = 5.0) -> dict[str, Any] | None:
        """One command and its reply (None: no reply within `timeout`)."""
        pending = self.command(robot, name, args)
        pending.done.wait(timeout)
        return pending.reply

    def query_all(self, robots: list[Robot], timeout: float) -> None:
        """`status` to every robot at once; each answer lands in `robot.details`."""
        asked = [(r, self.command(r, "status")) for r in robots]
        end = time.monotonic() + timeout
        for robot, pending in asked:
            pending.done.wait(max(0.0, end - time.monotonic()))
            reply = pending.reply
            if reply is not None and reply.get("ok") and isinstance(reply.get("result"), dict):
                with self.lock:
                    robot.details, robot.details_at = reply["result"], time.time()

    def publish(self, topic: str, body: dict[str, Any], qos: int = 1) -> float:
        """Publish `body` (with "v": 1) to `topic`; returns the wall time just before."""
        t0 = time.time()
        self.client.publish(topic, to_payload(body), qos=qos)
        return t0

    def snapshot(self) -> list[Robot]:
        with self.lock:
            return sorted(self.robots.values(), key=lambda r: r.device)


def _nodelay(client: paho.Client, userdata: Any, sock: Any) -> None:
    set_nodelay(sock)


def wait_until(pred: Callable[[], bool], timeout: float, poll_s: float = 0.05) -> bool:
    """Poll `pred` until it holds (True) or `timeout` passes (False)."""
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() >= end:
            return False
        time.sleep(poll_s)
    return True

