"""The MQTT bridge: one paho 2.x client onto the CommandAPI, presence (birth/LWT), publish helpers.

Threads: paho's network thread runs the callbacks, which never block and never wait for a
publish — they hand command messages to `CommandIntake` (mqtt_inbound.py: admission, the e-stop
fast path, retained and expired commands, the reply path), which puts them into a bounded
`CommandInbox` drained by one worker thread that calls `CommandAPI.handle` and publishes the reply.

Presence follows Sparkplug's bdSeq: the Last Will (`offline`, retained) is set before each
connection attempt with that attempt's `seq`; the birth (`online`, retained) carries the same
`seq`; a clean `stop()` publishes `offline` itself, then disconnects (which discards the will).

Sessions: every connection starts clean and the session expires with it (MQTT 5 clean start,
session expiry 0; 3.1.1 clean session), so the broker keeps nothing for the daemon while it is
unreachable: a command published then is never delivered (REQUIREMENTS.md 2, DESIGN.md stop
model).
"""

from __future__ import annotations

import random
import sys
import threading
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.clock import Clock, MonotonicClock
from edge_agent.commands.api import CommandAPI
from edge_agent.comms.inbox import CommandInbox
from edge_agent.comms.mqtt_bounded import BoundedClient, connect_kwargs
from edge_agent.comms.mqtt_common import (
    V5_CLOSED,
    Topics,
    check_topic_level,
    connect_failure_reason,
    connect_refusal,
    make_client,
    mqtt_properties,
    protocol_number,
    reason_failed,
    set_nodelay,
    to_payload,
)
from edge_agent.comms.mqtt_inbound import CommandIntake
from edge_agent.comms.mqtt_settings import MqttSettings
from edge_agent.log import get_logger

if TYPE_CHECKING:
    from edge_agent.contract.events import Event
    from edge_agent.contract.payloads import ReportPayload, TelemetryFields
    from edge_agent.contract.status import StateFields

_log = get_logger(__name__)


class MqttBridge:
    """Owns the daemon's MQTT connection. `start()` returns at once; `stop()` is idempotent."""

    def __init__(self, settings: MqttSettings, api: CommandAPI, *,
                 on_estop: Callable[[str], None] | None = None,
                 on_connection: Callable[[bool], None] | None = None,
                 clock: Clock | None = None, rng: random.Random | None = None) -> None:
        st = self.settings = settings
        self.device_id = check_topic_level("device.id", st.device_id)
        self.topics = Topics(st.topic_prefix or f"edge/{st.device_id}", st.fleet_estop_topic,
                             legacy=st.legacy_topics)
        self._v5 = protocol_number(st.protocol) == paho.MQTTv5
        self._identity = {"boot_id": st.boot_id or uuid.uuid4().hex, "version": st.version,
                          "config_hash": st.config_hash}
        self._on_connection = on_connection
        self._clock: Clock = clock or MonotonicClock()
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._attempt_seq = 0  # the seq the will of the pending connection attempt carries
        self._live_seq: int | None = None  # the seq of the current connection's birth
        self._connections = 0
        self._connack_seen = False  # this attempt got a CONNACK (accepted or refused)
        self._connected = threading.Event()
        self._subscribed = threading.Event()  # this connection's SUBACK came back granted
        self._sub_mid: int | None = None
        # a refused SUBACK leaves the connection up but deaf: the subscription is asked again
        self._sub_retry_s = 0.0  # the next retry's delay (0: none refused on this connection)
        self._sub_timer: threading.Timer | None = None
        self._sub_lock = threading.Lock()  # a retry's mid is known before its SUBACK is read
        self._last_state: StateFields | None = None
        self._last_telemetry: float | None = None
        self._started = self._stopped = False
        self.counters: dict[str, int] = dict.fromkeys((
            "received", "estops", "ignored", "retained", "replies", "publish_dropped",
            "publish_refused", "telemetry_suppressed", "connections", "disconnects",
            "response_topic_refused", "legacy_topic", "subscribe_refused"), 0)
        # why the last connection attempt failed, or this connection's subscription was refused
        self.last_error: str | None = None
        self._intake = CommandIntake(api, self.topics, v5=self._v5, clock=self._clock,
                                     inbox_size=st.inbox_size, publish=self._publish,
                                     counters=self.counters, lock=self._lock, on_estop=on_estop)
        self._inbox = self._intake.inbox
        self._client = make_client(st.device_id, protocol=st.protocol,
                                   username=st.username or st.device_id,
                                   password=st.password, tls=st.tls, clean_session=True,
                                   cls=BoundedClient)
        self._client.max_queued_messages_set(st.max_queued)
        self._client.enable_logger()  # paho's own debug lines (never the password) via logging
        self._jitter_reconnect()
        self._client.on_pre_connect = self._on_pre_connect
        self._client.on_socket_open = self._on_socket_open
        self._client.on_connect = self._on_connect
        self._client.on_connect_fail = self._on_connect_fail
        self._client.on_disconnect = self._on_disconnect
        self._client.on_message = self._on_message
        self._client.on_subscribe = self._on_subscribe
        self._client.on_publish = self._on_publish
        self._set_will(self._attempt_seq)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker and paho's loop; connects in the background (never blocks)."""
        with self._lock:
            if self._started or self._stopped:
                return
            self._started = True
        self._inbox.start()
        kwargs = connect_kwargs(self._v5)  # v5: clean start + Maximum Packet Size
        st = self.settings
        _log.info("mqtt_connecting", host=st.host, port=st.port, client_id=self.device_id,
                  protocol="5" if self._v5 else "3.1.1", prefix=self.topics.prefix,
                  boot_id=self._identity["boot_id"])
        self._client.connect_async(st.host, st.port, st.keepalive, **kwargs)
        self._client.loop_start()

    def stop(self, timeout: float = 2.0) -> None:
        """Publish retained `offline`, disconnect cleanly, stop the threads. Never raises."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            started = self._started
        self._inbox.stop(timeout)
        timer = self._sub_timer
        if timer is not None:
            timer.cancel()
        if started and self._connected.is_set():
            try:
                info = self._client.publish(self.topics.status, self._status("offline"),
                                            qos=1, retain=True)
                info.wait_for_publish(timeout)
            except (RuntimeError, ValueError) as exc:  # lost the connection meanwhile
                _log.warning("mqtt_offline_not_published", error=str(exc))
        for step in (self._client.disconnect, *((self._client.loop_stop,) if started else ())):
            try:
                step()
            except Exception:
                _log.exception("mqtt_stop_step_failed", step=step.__name__)
        _log.info("mqtt_stopped", counters=dict(self.counters))

    @property
    def connected(self) -> bool:
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        return self._connected.wait(timeout)

    @property
    def ready(self) -> bool:
        """Connected and subscribed: commands sent now will be received."""
        return self._connected.is_set() and self._subscribed.is_set()

    def wait_ready(self, timeout: float) -> bool:
        return self._subscribed.wait(timeout) and self._connected.is_set()

    @property
    def seq(self) -> int | None:
        """The `seq` of the current (or last) connection's birth."""
        return self._live_seq

    @property
    def inbox(self) -> CommandInbox:
        return self._inbox

    # -- publish helpers (any thread, never block) ----------------------------------------

    def publish_state(self, state: StateFields) -> bool:
        """Retained `<prefix>/state`; re-published after every reconnect."""
        self._last_state = state.copy()
        return self._publish(self.topics.state, state, qos=1, retain=True) is not None

    def publish_event(self, event: Event) -> bool:
        return self._publish(self.topics.event, event, qos=1) is not None

    def publish_report(self, report: ReportPayload) -> paho.MQTTMessageInfo | None:
        """QoS 1 `<prefix>/report`; its handle (PUBACK: is_published()), None if not sent."""
        return self._publish(self.topics.report, report, qos=1) if self.connected else None

    def publish_telemetry(self, telemetry: TelemetryFields) -> bool:
        """QoS 0, at most one per `telemetry_min_interval_s`; False when suppressed or dropped."""
        now = self._clock.now()
        with self._lock:
            last = self._last_telemetry
            if last is not None and now - last < self.settings.telemetry_min_interval_s:
                self.counters["telemetry_suppressed"] += 1
                return False
            self._last_telemetry = now
        return self._publish(self.topics.telemetry, telemetry, qos=0) is not None

    def _publish(self, topic: str, data: Mapping[str, Any], *, qos: int, retain: bool = False,
                 properties: Properties | None = None) -> paho.MQTTMessageInfo | None:
        try:
            info = self._client.publish(topic, to_payload(data), qos=qos, retain=retain,
                                        properties=properties)
        except (TypeError, ValueError) as exc:
            _log.error("mqtt_publish_invalid", topic=topic, error=str(exc))
            return None
        rc = info.rc
        # Not connected: paho keeps QoS>0 messages for the next connection (up to max_queued).
        if rc == paho.MQTT_ERR_SUCCESS or (rc == paho.MQTT_ERR_NO_CONN and qos > 0):
            return info
        with self._lock:
            self.counters["publish_dropped"] += 1
            dropped = self.counters["publish_dropped"]
        if dropped == 1 or dropped % 100 == 0:
            _log.warning("mqtt_publish_dropped", topic=topic, rc=paho.error_string(rc),
                         dropped=dropped)
        return None

    # -- presence --------------------------------------------------------------------------

    def _status(self, state: str, seq: int | None = None) -> bytes:
        use = self._live_seq if seq is None else seq
        return to_payload({"v": 1, "state": state, **self._identity, "seq": use})

    def _set_will(self, seq: int) -> None:
        props = None
        if self._v5 and self.settings.will_delay_s > 0:
            props = mqtt_properties(PacketTypes.WILLMESSAGE)
            props.WillDelayInterval = self.settings.will_delay_s
        self._client.will_set(self.topics.status, self._status("offline", seq), qos=1,
                              retain=True, properties=props)

    def _jitter_reconnect(self) -> None:
        lo, hi = self.settings.reconnect_min_s, self.settings.reconnect_max_s
        # Per-device jitter so a fleet does not reconnect in lock-step after a broker restart;
        # paho doubles the delay from the min up to the max within one outage.
        # paho annotates ints but computes with floats (sub-second delays work).
        self._client.reconnect_delay_set(
            lo * self._rng.uniform(0.5, 1.5),  # type: ignore[arg-type]
            max(lo, hi * self._rng.uniform(0.75, 1.0)),  # type: ignore[arg-type]
        )

    # -- paho callbacks (paho's thread: quick, never block) ------------------------------

    def _on_pre_connect(self, client: paho.Client, userdata: Any) -> None:
        self._attempt_seq = self._connections
        self._connack_seen = False
        self._set_will(self._attempt_seq)

    def _on_socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        set_nodelay(sock)

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, reason_code: Any,
                    properties: Any) -> None:
        self._connack_seen = True
        if reason_failed(reason_code):
            self._refused(connect_refusal(reason_code, v5=self._v5), str(reason_code))
            return
        self.last_error = None
        set_nodelay(client.socket())
        self._live_seq = self._attempt_seq
        self._connections += 1
        self.counters["connections"] += 1
        self._subscribed.clear()
        with self._sub_lock:
            self._sub_retry_s = 0.0
            _rc, self._sub_mid = client.subscribe(self._intake.subscriptions())
        client.publish(self.topics.status, self._status("online"), qos=1, retain=True)
        if self._last_state is not None:
            client.publish(self.topics.state, to_payload(self._last_state), qos=1, retain=True)
        self._jitter_reconnect()
        self._connected.set()
        session_present = bool(getattr(flags, "session_present", False))
        if session_present:  # we asked for a clean start: a broker that ignores it is news
            _log.error("mqtt_session_present_despite_clean_start", seq=self._live_seq)
        _log.info("mqtt_connected", seq=self._live_seq, session_present=session_present)
        self._notify_connection(True)

    def _refused(self, why: str, reason: str) -> None:
        """Log a refused attempt once per cause (paho retries with backoff for ever)."""
        if why != self.last_error:
            _log.error("mqtt_connect_refused", reason=reason, host=self.settings.host,
                       port=self.settings.port, error=why)
        self.last_error = why

    def _on_connect_fail(self, client: paho.Client, userdata: Any) -> None:
        # paho calls this inside its `except OSError:`: the exception says why (a TLS
        # verification failure carries OpenSSL's reason, e.g. "certificate has expired").
        exc = sys.exc_info()[1]
        self.last_error = connect_failure_reason(exc)
        _log.warning("mqtt_connect_failed", host=self.settings.host, port=self.settings.port,
                     error=self.last_error)

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, reason_code: Any,
                       properties: Any) -> None:
        was = self._connected.is_set()
        self._connected.clear()
        self._subscribed.clear()
        if not was and self._v5 and not self._connack_seen and not self._stopped:
            # closed before any CONNACK: RabbitMQ before 3.13 answers an MQTT 5 CONNECT so
            self._refused(V5_CLOSED, str(reason_code))
        if was:
            self.counters["disconnects"] += 1
            _log.warning("mqtt_disconnected", reason=str(reason_code), seq=self._live_seq)
            self._notify_connection(False)

    def _notify_connection(self, up: bool) -> None:
        if self._on_connection is not None:
            try:
                self._on_connection(up)
            except Exception:
                _log.exception("on_connection_failed")

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, reason_codes: Any,
                      properties: Any) -> None:
        with self._sub_lock:
            if mid != self._sub_mid:
                return  # an older connection's or attempt's
        failed = [str(rc) for rc in reason_codes if reason_failed(rc)]
        if not failed:
            if self._sub_retry_s:
                _log.info("mqtt_subscribed_after_refusal", seq=self._live_seq)
                self.last_error = None
            self._sub_retry_s = 0.0
            self._subscribed.set()
            return
        # Connected but deaf to commands (and to the fleet e-stop): NATS's MQTT gateway
        # answers a SUBACK failure when JetStream cannot create the consumer in time (12-07,
        # ten daemons on a loaded machine). Ask again with backoff while this connection lasts;
        # `ready` stays false meanwhile (the broker probe: broker_lost).
        self.counters["subscribe_refused"] += 1
        lo, hi = self.settings.reconnect_min_s, self.settings.reconnect_max_s
        delay = min(hi, max(lo, 2 * self._sub_retry_s)) * self._rng.uniform(0.75, 1.25)
        self._sub_retry_s = delay
        self.last_error = f"the broker refused the command subscription: {', '.join(failed)}"
        _log.error("mqtt_subscribe_refused", reasons=failed, seq=self._live_seq,
                   retry_in_s=round(delay, 2))
        timer = threading.Timer(delay, self._resubscribe, args=(self._live_seq,))
        timer.daemon = True
        timer.name = "mqtt-resubscribe"
        self._sub_timer = timer
        timer.start()

    def _resubscribe(self, seq: int | None) -> None:
        """Ask for the command subscription again, on the connection that was refused."""
        with self._sub_lock:  # paho's thread may read the SUBACK before subscribe() returns
            if self._stopped or not self._connected.is_set() or seq != self._live_seq:
                return  # gone: a new connection subscribes by itself
            _rc, self._sub_mid = self._client.subscribe(self._intake.subscriptions())

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, reason_code: Any,
                    properties: Any) -> None:
        if reason_failed(reason_code):  # MQTT 5 PUBACK with an error, e.g. an ACL refusal
            self.counters["publish_refused"] += 1
            _log.warning("mqtt_publish_refused", mid=mid, reason=str(reason_code))

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        try:
            self._intake.dispatch(msg)
        except Exception:
            _log.exception("mqtt_dispatch_failed", topic=msg.topic)
