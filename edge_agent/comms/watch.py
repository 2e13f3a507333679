"""`edge-agent watch`: follow one device (or all) over MQTT and print each message on one line.

Subscribes to `<prefix>/status`, `state`, `event`, `report` (and `telemetry` when asked) and
prints `time device kind fields...`; a report's Markdown follows its line as-is. `--json` prints
one JSON object per message instead: `{"topic", "device", "kind", "retained", "received",
"payload"}` (the payload parsed when it is JSON, else the text). paho's thread only queues;
the caller's thread formats and prints, so Ctrl-C and a closed pipe end it cleanly. Reconnects
with backoff and resubscribes after a broker restart (said on stderr).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import paho.mqtt.client as paho

from edge_agent.comms.client import MqttTarget
from edge_agent.comms.mqtt_common import (
    Topics,
    connect_refusal,
    make_client,
    protocol_number,
    reason_failed,
    set_nodelay,
)
from edge_agent.errors import EdgeAgentError

_ENVELOPE = ("v", "ts", "mono", "boot_id", "type")
_MAX_VALUE = 80
_MAX_LINE = 240


class WatchError(EdgeAgentError):
    """The broker could not be reached or refused us."""


@dataclass(frozen=True)
class WatchOptions:
    """What to follow: `device` is one id or `+` (all); `prefix` overrides `edge/<device>`."""

    device: str = "+"
    prefix: str | None = None
    json_lines: bool = False
    telemetry: bool = False
    replies: bool = False
    count: int | None = None  # stop after this many messages
    quiet_hint_s: float = 5.0  # say on stderr why nothing arrives after this long

    def filters(self) -> list[str]:
        t = Topics(self.prefix or f"edge/{self.device}")  # `edge/+`: every device
        return [t.status, t.state, t.event, t.report, *((t.telemetry,) if self.telemetry else ()),
                *((t.reply_filter,) if self.replies else ())]


@dataclass(frozen=True)
class Received:
    topic: str
    payload: bytes
    retained: bool
    at: float  # wall clock when received


def split_topic(topic: str, prefix: str | None = None) -> tuple[str, str]:
    """`edge/dev1/state` → ("dev1", "state"); with a custom prefix the device is its last level."""
    if prefix and topic.startswith(prefix + "/"):
        return prefix.rsplit("/", 1)[-1], topic[len(prefix) + 1:]
    parts = topic.split("/", 2)
    if len(parts) == 3:
        return parts[1], parts[2]
    return "?", topic


def _value(v: Any) -> str:
    if isinstance(v, str):
        text = v if v and " " not in v and "=" not in v else json.dumps(v, ensure_ascii=False)
    elif isinstance(v, bool) or v is None:
        text = json.dumps(v)
    elif isinstance(v, float):
        text = f"{v:.0f}" if abs(v) >= 1e5 else f"{v:.6g}"
    elif isinstance(v, list) and all(isinstance(x, int | float) for x in v):
        text = "[" + ",".join(_value(x) for x in v) + "]"
    else:
        text = json.dumps(v, separators=(",", ":"), ensure_ascii=False, default=str)
    return text if len(text) <= _MAX_VALUE else text[:_MAX_VALUE - 1] + "…"


def _fields(data: Mapping[str, Any], skip: tuple[str, ...]) -> str:
    return " ".join(f"{k}={_value(v)}" for k, v in data.items() if k not in skip)


def _state_line(p: Mapping[str, Any]) -> str:
    out = [f"mode={_value(p.get('mode'))}"]
    if p.get("state") != p.get("mode"):
        out.append(f"state={_value(p.get('state'))}")
    task = p.get("task")
    if isinstance(task, Mapping) and task.get("task_id"):
        out.append(f"task={_value(task.get('task_id'))}")
    stop = p.get("stop")
    if isinstance(stop, Mapping):
        out.append(f"stop={stop.get('kind')}/{stop.get('cause')}")
        if stop.get("hardware_input"):
            out.append("estop_input=pressed")
    degraded = p.get("degraded") or []
    out.append("degraded=" + (",".join(map(str, degraded)) if degraded else "-"))
    for key in ("homed", "link_up"):
        if key in p:
            out.append(f"{key}={_value(p[key])}")
    return " ".join(out)


def _reply_line(p: Mapping[str, Any]) -> str:
    head = f"id={_value(p.get('id'))} " + ("ok" if p.get("ok") else "ERROR")
    err = p.get("error")
    if isinstance(err, Mapping):
        return f"{head} {err.get('code')}: {err.get('message')}"
    result = p.get("result")
    return f"{head} {_fields(result, ())}" if isinstance(result, Mapping) else head


def format_message(msg: Received, prefix: str | None = None) -> str:
    """One readable line (a report: the line, then its Markdown as-is). Pure."""
    device, kind = split_topic(msg.topic, prefix)
    try:
        payload = json.loads(msg.payload)
    except ValueError:
        payload = None
    ts = payload.get("ts") if isinstance(payload, dict) else None
    when = ts if isinstance(ts, int | float) and not isinstance(ts, bool) else msg.at
    try:
        clock = dt.datetime.fromtimestamp(when).strftime("%H:%M:%S.%f")[:-3]
    except (OverflowError, OSError, ValueError):
        clock = "??:??:??.???"
    label = kind + ("*" if msg.retained else "")
    head = f"{clock} {device} {label:<10}"
    if not isinstance(payload, dict):
        return f"{head} (not a JSON object: {len(msg.payload)} bytes)"
    markdown = None
    if kind == "status":
        body = (f"{payload.get('state')} seq={_value(payload.get('seq'))} "
                f"version={_value(payload.get('version'))} "
                f"boot={str(payload.get('boot_id'))[:8]} "
                f"config={_value(payload.get('config_hash'))}")
    elif kind == "state":
        body = _state_line(payload)
    elif kind == "event":
        body = f"{payload.get('type')} {_fields(payload, _ENVELOPE)}"
    elif kind == "report":
        body = f"{payload.get('kind')} id={_value(payload.get('id'))}"
        if isinstance(payload.get("title"), str):
            body += f" {payload['title']}"  # what an operator reads first
        markdown = payload.get("markdown")
    elif kind.startswith("reply/"):
        body = _reply_line(payload)
    else:
        body = _fields(payload, ("v",))
    line = f"{head} {body}".rstrip()
    if len(line) > _MAX_LINE:
        line = line[:_MAX_LINE - 1] + "…"
    if isinstance(markdown, str):
        line += "\n" + markdown.rstrip("\n") + "\n"
    return line


def json_line(msg: Received, prefix: str | None = None) -> str:
    device, kind = split_topic(msg.topic, prefix)
    try:
        payload: Any = json.loads(msg.payload)
    except ValueError:
        payload = msg.payload.decode("utf-8", "replace")
    return json.dumps({"topic": msg.topic, "device": device, "kind": kind,
                       "retained": msg.retained, "received": round(msg.at, 6),
                       "payload": payload}, separators=(",", ":"), ensure_ascii=False)


class Watcher:
    """A paho client that queues every message of the filters; `stop()` is idempotent."""

    def __init__(self, target: MqttTarget, opts: WatchOptions,
                 notice: Callable[[str], None]) -> None:
        self.opts = opts
        self.messages: queue.Queue[Received] = queue.Queue(maxsize=10_000)
        self.dropped = 0
        self._notice = notice
        self._connack: queue.Queue[Any] = queue.Queue()
        self._connected_once = threading.Event()
        self._target = target
        client_id = target.client_id or f"edge-agent-watch-{uuid.uuid4().hex[:8]}"
        self.client = make_client(client_id, protocol=target.protocol, username=target.username,
                                  password=target.password, tls=target.tls)
        self.client.reconnect_delay_set(1, 30)
        self.client.on_socket_open = self._on_socket_open
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_message = self._on_message
        self._stopped = False

    def start(self, timeout: float = 10.0) -> None:
        """Connect (bounded wait); raises WatchError when the broker is unreachable or refuses."""
        t = self._target
        self.client.connect_timeout = timeout  # the TCP (and TLS) connect itself is bounded too
        try:
            self.client.connect(t.host, t.port, keepalive=30)
        except (OSError, ValueError) as exc:
            raise WatchError(f"cannot connect to {t.host}:{t.port}: {exc}") from exc
        self.client.loop_start()
        try:
            rc = self._connack.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise WatchError(f"no answer from the broker at {t.host}:{t.port} in "
                             f"{timeout:g} s") from None
        if reason_failed(rc):
            self.stop()
            why = connect_refusal(rc, v5=protocol_number(t.protocol) == paho.MQTTv5)
            raise WatchError(f"{t.host}:{t.port}: {why} (user {t.username!r})")

    def _on_socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        set_nodelay(sock)

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, rc: Any,
                    properties: Any) -> None:
        if not reason_failed(rc):  # subscribe on every (re)connection
            client.subscribe([(f, 1) for f in self.opts.filters()])
            if self._connected_once.is_set():
                self._notice("reconnected")
            self._connected_once.set()
        self._connack.put(rc)

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, rc: Any,
                       properties: Any) -> None:
        if not self._stopped and self._connected_once.is_set():  # not: a failed first try
            self._notice(f"disconnected ({rc}); reconnecting")

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        try:
            self.messages.put_nowait(Received(msg.topic, bytes(msg.payload), bool(msg.retain),
                                              time.time()))
        except queue.Full:
            self.dropped += 1

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        for step in (self.client.disconnect, self.client.loop_stop):
            with contextlib.suppress(Exception):  # best effort at shutdown
                step()


def run_watch(target: MqttTarget, opts: WatchOptions, out: TextIO, err: TextIO,
              stop: threading.Event | None = None) -> int:
    """Print messages until Ctrl-C, `stop`, or `opts.count` messages; returns an exit code."""
    def notice(text: str) -> None:
        print(f"watch: {text}", file=err, flush=True)

    watcher = Watcher(target, opts, notice)
    try:
        watcher.start()
    except WatchError as exc:
        print(f"error: {exc}", file=err)
        return 3
    notice(f"following {', '.join(opts.filters())} at {target.host}:{target.port} "
           f"as {target.username or '(anonymous)'} (Ctrl-C to stop)")
    shown, started, hinted = 0, time.monotonic(), False
    stop = stop or threading.Event()
    try:
        while not stop.is_set() and (opts.count is None or shown < opts.count):
            try:
                msg = watcher.messages.get(timeout=0.2)
            except queue.Empty:
                if not shown and not hinted and time.monotonic() - started > opts.quiet_hint_s:
                    hinted = True
                    notice("nothing yet: is the device up, and may this account read those "
                           "topics (the broker's ACL drops what it may not read, silently)?")
                continue
            line = (json_line(msg, opts.prefix) if opts.json_lines
                    else format_message(msg, opts.prefix))
            print(line, file=out, flush=True)
            shown += 1
    except KeyboardInterrupt:
        pass
    finally:
        watcher.stop()
    if watcher.dropped:
        notice(f"{watcher.dropped} messages dropped (printing too slow)")
    return 0
