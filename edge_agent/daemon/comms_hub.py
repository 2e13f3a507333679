"""The daemon's comms: events, retained `state` and telemetry out; MQTT and the control socket in.

Never blocks a caller: publishing is paho's queue; `state` is rebuilt on the main thread's
housekeeping tick when something changed (and every few seconds), so the control loop and the
link reader only set a flag. Both inbound transports hand commands to the one `CommandAPI` and
call `on_estop` before a command is even parsed.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, cast

from edge_agent.comms import runtime_dir
from edge_agent.comms.control_socket import SOCKET_NAME, ControlSocketServer
from edge_agent.daemon.supervisor import Spawn
from edge_agent.log import get_logger
from edge_agent.observe import channels as obs
from edge_agent.observe.tap import TAP
from edge_agent.vocab import EventType, StopCause, estop_cause

if TYPE_CHECKING:
    from edge_agent.commands import CommandAPI
    from edge_agent.comms.mqtt_bridge import MqttBridge
    from edge_agent.config import Config
    from edge_agent.contract.events import Event
    from edge_agent.contract.payloads import ReportPayload, TelemetryFields
    from edge_agent.contract.status import MqttStatus, StateFields
    from edge_agent.reports.sinks import Published

_log = get_logger(__name__)


class CommsHub:
    """Events, state and telemetry out; the transports in. `start()` once, `stop()` idempotent."""

    def __init__(self, cfg: Config, boot_id: str, *, on_estop: Callable[[StopCause], None],
                 state: Callable[[], StateFields],
                 telemetry: Callable[[], TelemetryFields], spawn: Spawn) -> None:
        self._cfg = cfg  # [device], [mqtt] (the bridge: MqttSettings.from_config), state_dir
        self.boot_id = boot_id
        self._on_estop = on_estop
        self._state = state
        self._telemetry = telemetry
        self._spawn = spawn
        self.bridge: MqttBridge | None = None
        self.socket: ControlSocketServer | None = None
        self._dirty = True
        self._last_state: StateFields | None = None
        self._last_state_at = 0.0
        self._last_telemetry_at = 0.0
        self.events_sent = 0
        self._stopping = False
        self._lock = threading.Lock()
        self._early: deque[Event] = deque(maxlen=1000)  # before the bridge exists
        self._stop_wait = threading.Event()
        self.mqtt_error: str | None = None  # why the bridge could not be built (None: built)
        self.mqtt_attempts = 0
        self.pointer: Path | None = None  # <runtime dir>/<device>.sock → the control socket
        self._listeners: list[Callable[[Event], None]] = []

    def add_listener(self, fn: Callable[[Event], None]) -> None:
        """`fn(event)` for every event from now on, on the publishing thread (must not block)."""
        self._listeners.append(fn)

    def start(self, api: CommandAPI) -> None:
        """The control socket now; MQTT on a thread of its own (importing paho is ~30 ms of the
        start-up budget): its connect starts right away and never delays READY. Events
        published before the bridge exists wait in a bounded buffer and go out in order."""
        self.socket = ControlSocketServer(api, Path(self._cfg.state_dir) / SOCKET_NAME,
                                          on_estop=self.on_estop)
        self.socket.start()
        # how `edge-agent cmd` finds this daemon without its config (comms/runtime_dir.py)
        self.pointer = runtime_dir.publish(self._cfg.device.id, self.socket.path)
        if self.pointer is not None:
            _log.info("control_socket_published", pointer=str(self.pointer))
        else:
            _log.warning("control_socket_unpublished", hint="no writable runtime directory: "
                         "`edge-agent cmd` needs --config here (see `edge-agent cmd --help`)")
        self._spawn("mqtt-start", lambda: self._start_mqtt(api))

    def _start_mqtt(self, api: CommandAPI) -> None:
        """Build the bridge, retrying with backoff for as long as the daemon runs: a TLS file
        that cannot be loaded now (a bad key pair, a CA being rotated) must not leave the robot
        without remote and fleet e-stop for the rest of the run. Once built, paho reconnects."""
        m = self._cfg.mqtt
        delay = m.reconnect_min_s
        while not self._stopping:
            self.mqtt_attempts += 1
            if self._build_bridge(api):
                return
            if self._stop_wait.wait(delay):
                return
            delay = min(m.reconnect_max_s, delay * 2)

    def _build_bridge(self, api: CommandAPI) -> bool:
        from edge_agent.comms.mqtt_bridge import MqttBridge
        from edge_agent.comms.mqtt_settings import MqttSettings
        from edge_agent.errors import ConfigError

        try:  # (loading a TLS file may fail: inside the retry)
            bridge = MqttBridge(MqttSettings.from_config(self._cfg, boot_id=self.boot_id), api,
                                on_estop=self.on_estop, on_connection=self._on_connection)
        except ConfigError as exc:  # a TLS file: name the key and why, no traceback
            self._bridge_failed(f"{exc.key}: {exc.why}")
            return False
        except Exception as exc:
            _log.exception("mqtt_bridge_failed_unexpectedly")
            self._bridge_failed(f"{type(exc).__name__}: {exc}")
            return False
        with self._lock:
            if self._stopping:
                return True
            while self._early:
                bridge.publish_event(self._early.popleft())
            self.bridge = bridge
            self.mqtt_error = None
            bridge.start()
        return True

    def _bridge_failed(self, why: str) -> None:
        first = self.mqtt_error != why
        self.mqtt_error = why
        self._dirty = True
        if first or self.mqtt_attempts % 20 == 0:
            _log.error("mqtt_bridge_failed", error=why, attempts=self.mqtt_attempts,
                       note="MQTT (remote and fleet e-stop) is down; retrying with backoff")

    def mqtt_status(self) -> MqttStatus:
        """For `status`: connected or not, and why not (the bridge's last failure)."""
        bridge = self.bridge
        if bridge is None:
            return {"connected": False, "bridge": False, "error": self.mqtt_error,
                    "attempts": self.mqtt_attempts}
        return {"connected": bridge.connected, "bridge": True, "error": bridge.last_error,
                "connections": bridge.counters["connections"]}

    @property
    def mqtt_ready(self) -> bool:
        """Connected with the command subscription granted: a command published now is received."""
        bridge = self.bridge
        return bool(bridge is not None and bridge.ready)

    def on_estop(self, source: str) -> None:
        """Called in paho's (or the socket's) thread before the command is parsed."""
        self._on_estop(estop_cause(source))

    def _on_connection(self, up: bool) -> None:
        self._dirty = True
        self.event({"type": EventType.MQTT_CONNECTED} if up else
                   {"type": EventType.MQTT_DISCONNECTED})

    # -- outgoing --------------------------------------------------------------------------
    def event(self, fields: Event) -> None:
        """Publish `fields` with the envelope (ts, mono, boot_id; a producer's own mono stays)."""
        ev = cast("Event", {"ts": time.time(), "mono": round(time.monotonic(), 6),
                            "boot_id": self.boot_id, **fields})
        _log.info("event", **{k: v for k, v in ev.items() if k not in ("ts", "mono", "boot_id")})
        self.events_sent += 1
        TAP.publish(obs.EVENTS, ev)  # published once, then only read
        for fn in self._listeners:
            fn(ev)
        bridge = self.bridge
        if bridge is None:
            with self._lock:  # MQTT still starting: keep it for the bridge (bounded)
                bridge = self.bridge
                if bridge is None:
                    self._early.append(ev)
                    return
        if not self._stopping:
            bridge.publish_event(ev)

    def publish_report(self, payload: ReportPayload) -> Published | None:
        """A repair report on MQTT: its handle (delivered on the broker's PUBACK), None when
        not handed over (no bridge yet, not connected: the outbox retries)."""
        bridge = self.bridge
        if bridge is None:
            return None
        return bridge.publish_report(payload)  # None when not connected

    def state_changed(self) -> None:
        self._dirty = True

    def tick(self, now: float) -> None:
        """Main-thread housekeeping: retained state on change (≤ 10/s) and every 5 s."""
        if self.bridge is None:
            return
        if (self._dirty and now - self._last_state_at >= 0.1) or now - self._last_state_at >= 5:
            state = self._state()
            if state != self._last_state or now - self._last_state_at >= 5:
                self.bridge.publish_state(state)
                self._last_state = state
            self._last_state_at = now
            self._dirty = False
        hz = self._cfg.mqtt.telemetry_hz
        if hz > 0 and now - self._last_telemetry_at >= 1.0 / hz:
            self._last_telemetry_at = now
            self.bridge.publish_telemetry(self._telemetry())

    def stop(self) -> None:
        with self._lock:
            self._stopping = True
        self._stop_wait.set()
        if self.socket is not None:
            runtime_dir.unpublish(self.pointer, self.socket.path)
            self.socket.stop()
        if self.bridge is not None:
            self.bridge.stop()
