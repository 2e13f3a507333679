"""The MQTT bridge's inbound side: which command topics it subscribes, how a message is admitted
(e-stop first, retained refused, inbox bounded), the worker that runs it, and the reply path.

`MqttBridge` owns the connection and hands every message here (paho's network thread); nothing
here blocks. The e-stop (`<prefix>/cmd/estop` and the fleet topic) is the exception to queueing:
`on_estop(source)` is called right in paho's thread, whatever the payload, retain flag or expiry,
and then the e-stop is queued at the front of the inbox for its reply.

Topics (mqtt_common.Topics): the daemon subscribes `<prefix>/cmd/#`; `task.start` comes on
`cmd/task/start` and is answered on `reply/task/start`. The dotted topics of earlier releases
(`cmd/task.start`) are deprecated aliases: served and answered on their own reply topic
(`reply/task.start`) while `mqtt.legacy_topics` is true, ignored when it is false; logged
either way (the first of each name, then every 100th).

The stop epoch when a command arrives travels with it to the API, which refuses a motion command
`stale` if a stop or reset came in between (commands/freshness.py). MQTT 5 message expiry is
honoured on arrival.

Retained commands never run: the command subscription asks for retain-as-published (MQTT 5), so
a retained `task.start` published while we are subscribed still carries its flag, and is answered
`retained`; stored ones are not even sent (retain handling 2). MQTT 3.1.1 has neither: a broker
clears the flag on live delivery, so only the stored copy (sent on subscribing) is recognised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from edge_agent.clock import Clock
from edge_agent.commands.api import CommandAPI
from edge_agent.commands.codes import Reply
from edge_agent.commands.schema import recover_id
from edge_agent.comms.inbox import CommandInbox, InboundCommand
from edge_agent.comms.mqtt_common import Topics, mqtt_properties
from edge_agent.log import get_logger
from edge_agent.vocab import ErrorCode

_log = get_logger(__name__)

# (topic, data, qos, properties) -> the publish handle, None when not sent (MqttBridge._publish)
Publish = Callable[..., "paho.MQTTMessageInfo | None"]


class CommandIntake:
    """Admits command messages into a bounded inbox, runs them on its worker, publishes replies.

    `counters` and `lock` are the bridge's (one set of counters for `status`)."""

    def __init__(self, api: CommandAPI, topics: Topics, *, v5: bool, clock: Clock,
                 inbox_size: int, publish: Publish, counters: dict[str, int],
                 lock: threading.Lock, on_estop: Callable[[str], None] | None = None) -> None:
        self._api = api
        self.topics = topics
        self._v5 = v5
        self._clock = clock
        self._publish = publish
        self.counters = counters
        self._lock = lock
        self._on_estop = on_estop
        self.inbox = CommandInbox(self._process, maxsize=inbox_size)
        self._legacy_seen: dict[str, int] = {}  # dotted-topic commands per name

    def subscriptions(self) -> list[tuple[str, Any]]:
        """What to subscribe on each connection: the device's commands and the fleet e-stop."""
        cmd_opts: Any = 1
        fleet_opts: Any = 1
        if self._v5:  # a retained command is never run; a retained fleet e-stop still stops
            cmd_opts = SubscribeOptions(qos=1, retainAsPublished=True,
                                        retainHandling=SubscribeOptions.RETAIN_DO_NOT_SEND)
            fleet_opts = SubscribeOptions(qos=1)
        return [(self.topics.cmd_filter, cmd_opts), (self.topics.fleet_estop, fleet_opts)]

    # -- paho's thread: quick, never block -------------------------------------------------

    def dispatch(self, msg: paho.MQTTMessage) -> None:
        now = self._clock.now()
        arrived = self._api.epoch()  # before anything else: a stop may trip any moment now
        topic = msg.topic
        self.counters["received"] += 1
        props = getattr(msg, "properties", None)
        response_topic = getattr(props, "ResponseTopic", None) or None
        correlation = getattr(props, "CorrelationData", None) or None
        if topic in (self.topics.fleet_estop, self.topics.cmd("estop")):
            source = "fleet" if topic == self.topics.fleet_estop else "mqtt"
            self.counters["estops"] += 1
            if self._on_estop is not None:
                try:
                    self._on_estop(source)
                except Exception:
                    _log.exception("on_estop_failed", source=source)
            self.inbox.offer(InboundCommand("estop", bytes(msg.payload), source, None,
                                            response_topic, correlation, priority=True))
            return
        name = self.topics.command_name(topic)
        if name is None:
            self.counters["ignored"] += 1
            _log.warning("mqtt_message_ignored", topic=topic)
            return
        legacy = self.topics.is_legacy(topic)
        if legacy and not self._legacy_admitted(topic, name):
            return
        expiry = getattr(props, "MessageExpiryInterval", None)
        deadline = now + float(expiry) if expiry is not None else None
        item = InboundCommand(name, bytes(msg.payload), "mqtt", deadline, response_topic,
                              correlation, arrived=arrived, legacy=legacy)
        if msg.retain:  # whoever retained it meant "for whoever subscribes later": never run
            self.counters["retained"] += 1
            _log.warning("mqtt_retained_command_refused", topic=topic,
                         id=recover_id(item.payload))
            self.send_reply(item, Reply.failure(
                recover_id(item.payload), ErrorCode.RETAINED,
                "retained messages are never run as commands; publish it without retain "
                "(and clear the retained one: an empty retained message on this topic)"))
            return
        if not self.inbox.offer(item):
            self.send_reply(item, Reply.failure(recover_id(item.payload), ErrorCode.OVERLOADED,
                                                "command inbox full; try again"))

    def _legacy_admitted(self, topic: str, name: str) -> bool:
        """A command on a deprecated dotted topic: served (and answered on the alias's reply
        topic) while `mqtt.legacy_topics` is true, else ignored; logged either way (the first
        of each name, then every 100th)."""
        served = self.topics.legacy
        key = "legacy_topic" if served else "ignored"
        with self._lock:
            self.counters[key] += 1
            seen = self._legacy_seen[name] = self._legacy_seen.get(name, 0) + 1
        if seen == 1 or seen % 100 == 0:
            _log.warning("mqtt_legacy_topic_served" if served else "mqtt_legacy_topic_ignored",
                         topic=topic, use=self.topics.cmd(name), seen=seen,
                         key="mqtt.legacy_topics")
        return served

    # -- worker thread ---------------------------------------------------------------------

    def _process(self, item: InboundCommand) -> None:
        reply = self._api.handle(item.name, item.payload, source=item.source,
                                 deadline=item.deadline, arrived=item.arrived)
        self.send_reply(item, reply)

    def send_reply(self, item: InboundCommand, reply: Reply) -> None:
        if reply.id is None and item.correlation is None:
            _log.info("mqtt_reply_unroutable", command=item.name, code=str(reply.code))
            return
        topic = self.topics.reply_for(item.name, legacy=item.legacy)
        props: Properties | None = None
        if item.response_topic:
            if self.topics.reply_allowed(item.response_topic):
                topic = item.response_topic
            else:  # e.g. the fleet e-stop topic: this device publishes only its own replies
                with self._lock:
                    self.counters["response_topic_refused"] += 1
                _log.warning("mqtt_response_topic_refused", topic=item.response_topic[:200],
                             allowed=f"{self.topics.prefix}/reply/...")
        if self._v5 and item.correlation is not None:
            props = mqtt_properties(PacketTypes.PUBLISH)
            props.CorrelationData = item.correlation
        if self._publish(topic, reply.to_dict(), qos=1, properties=props) is not None:
            with self._lock:
                self.counters["replies"] += 1
