"""The live view's server: foxglove-sdk's WebSocket server on a private Context, one channel
per observe channel (edge_agent/observe/channels.py: same topics, same JSON schemas as the
flight recorder's MCAP), fed by a pump thread that drains its own tap subscription.

The tap subscription exists only while a client is subscribed to some channel (the server's
listener says when): with the server on and nobody watching, the daemon's seams pay nothing
more than with it off. The pump encodes (channels.encode) and rate-limits (rate.py) on its own
thread; foxglove-sdk's server runs its own threads (Rust) and drops the oldest messages of a
slow client (`message_backlog_size`). Never on the control thread.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any

import foxglove
from foxglove.websocket import ChannelView, Client

from edge_agent.liveview.rate import RateLimit
from edge_agent.log import get_logger
from edge_agent.observe import channels as obs_channels
from edge_agent.observe.tap import TAP, Subscription, Tap

if TYPE_CHECKING:
    from edge_agent.contract.status_observe import LiveViewStatus

_log = get_logger(__name__)

PUMP_PERIOD_S = 0.02  # the pump drains the tap every 20 ms
TAP_QUEUE = 8192  # items between two drains at most (drop-oldest beyond: counted by the tap)
BACKLOG = 1024  # per client, foxglove-sdk's own drop-oldest queue


class _Listener(foxglove.websocket.ServerListener):
    """Counts subscribers by topic (foxglove-sdk's thread); the pump reads `topics()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._subs: dict[str, set[int]] = {}
        self.changed = threading.Event()

    def on_subscribe(self, client: Client, channel: ChannelView) -> None:
        with self._lock:
            self._subs.setdefault(channel.topic, set()).add(client.id)
        self.changed.set()

    def on_unsubscribe(self, client: Client, channel: ChannelView) -> None:
        with self._lock:
            ids = self._subs.get(channel.topic)
            if ids is not None:
                ids.discard(client.id)
                if not ids:
                    del self._subs[channel.topic]
        self.changed.set()

    def topics(self) -> frozenset[str]:
        with self._lock:
            return frozenset(self._subs)


class LiveView:
    """`ws://host:port` (subprotocol foxglove.websocket.v1) until `stop()`."""

    def __init__(self, host: str, port: int, rate_hz: float, *, tap: Tap = TAP,
                 name: str = "edge-agent") -> None:
        self.tap = tap
        self.limit = RateLimit(rate_hz)
        self.sent: dict[str, int] = {}  # messages handed to the server, by topic
        self.encode_errors = 0
        self.cpu_s = 0.0  # the pump thread's own CPU time (time.thread_time)
        self._ctx = foxglove.Context()
        self._channels = {
            topic: foxglove.Channel(
                topic, schema=foxglove.Schema(name=c.schema_name, encoding=c.schema_encoding,
                                              data=c.schema_bytes()),
                message_encoding=c.message_encoding, context=self._ctx)
            for topic, c in obs_channels.CHANNELS.items()}
        self._listener = _Listener()
        self._server = foxglove.start_server(
            name=name, host=host, port=port, context=self._ctx,
            server_listener=self._listener, message_backlog_size=BACKLOG)
        self.port = self._server.port
        self._sub: Subscription | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._pump, name="liveview", daemon=True)
        self._thread.start()
        _log.info("liveview_listening", host=host, port=self.port, rate_hz=rate_hz,
                  channels=len(self._channels))

    def _resubscribe(self) -> None:
        """The tap subscription follows the clients' subscriptions (none: no subscription)."""
        self._listener.changed.clear()
        wanted = self._listener.topics()
        old = self._sub
        if old is not None and old.topics == wanted:
            return
        if old is not None:  # what it holds goes out first: no message twice
            self.tap.unsubscribe(old)
            self._forward(old.drain(TAP_QUEUE), time.monotonic())
        self._sub = self.tap.subscribe("liveview", TAP_QUEUE, wanted) if wanted else None

    def _pump(self) -> None:
        t0 = time.thread_time()
        while not self._stop.wait(PUMP_PERIOD_S):
            self.cpu_s = time.thread_time() - t0
            try:
                if self._listener.changed.is_set():
                    self._resubscribe()
                if self._sub is not None:
                    self._forward(self._sub.drain(TAP_QUEUE), time.monotonic())
            except Exception:  # the view must not die on one bad payload or a race
                _log.exception("liveview_pump_failed")

    def _forward(self, items: list[tuple[str, int, Any]], now: float) -> None:
        for topic, t_ns, payload in items:
            ch = self._channels.get(topic)
            if ch is None or not self.limit.allow(topic, now):
                continue
            try:
                data = obs_channels.encode(topic, payload, t_ns)
            except (TypeError, ValueError, AttributeError, KeyError):
                self.encode_errors += 1
                continue
            ch.log(data, log_time=t_ns)
            self.sent[topic] = self.sent.get(topic, 0) + 1

    def status(self) -> LiveViewStatus:
        sub = self._sub
        return {"port": self.port, "sent": dict(self.sent),
                "limited": dict(self.limit.limited), "encode_errors": self.encode_errors,
                "cpu_s": round(self.cpu_s, 6),
                "tap": sub.stats() if sub is not None else None}

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(2.0)
        if self._sub is not None:
            self.tap.unsubscribe(self._sub)
            self._sub = None
        self._server.stop()
