"""What the MQTT bridge is built with: one frozen record, mapped from the config in one place.

    settings = MqttSettings.from_config(cfg, boot_id=boot_id)
    bridge = MqttBridge(settings, api, on_estop=..., on_connection=...)

Defaults are the bridge's own (tests and tools build one by hand); the daemon's come from
[mqtt] through `from_config`. The password is kept out of the repr.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from edge_agent import __version__
from edge_agent.comms.mqtt_common import FLEET_ESTOP_TOPIC, TlsOptions

if TYPE_CHECKING:
    from edge_agent.config import Config

# telemetry_hz = 0 (telemetry off): at most one message an hour (the daemon publishes none).
_TELEMETRY_OFF_INTERVAL_S = 3600.0


@dataclass(frozen=True, slots=True)
class MqttSettings:
    """The broker, identity, topics, queues and backoff of one `MqttBridge`."""

    device_id: str
    host: str = "localhost"
    port: int = 1883
    username: str | None = None  # None: the device id
    password: str | None = field(default=None, repr=False)
    tls: TlsOptions | None = None
    topic_prefix: str | None = None  # None: edge/<device_id>
    legacy_topics: bool = True  # also serve the deprecated dotted command topics
    fleet_estop_topic: str = FLEET_ESTOP_TOPIC
    protocol: str | int = "5"
    keepalive: int = 30
    max_queued: int = 1000
    inbox_size: int = 256
    reconnect_min_s: float = 1.0
    reconnect_max_s: float = 30.0
    will_delay_s: int = 0
    boot_id: str | None = None  # None: a random one per bridge
    version: str = __version__
    config_hash: str = ""
    telemetry_min_interval_s: float = 1.0

    @classmethod
    def from_config(cls, cfg: Config, *, boot_id: str | None = None) -> MqttSettings:
        """The daemon's bridge: [mqtt] of `cfg`, its device id and config hash."""
        m = cfg.mqtt
        return cls(
            device_id=cfg.device.id, host=m.host, port=m.port,
            username=m.username or cfg.device.id,
            password=m.password.reveal() if m.password else None,
            tls=TlsOptions.from_config(m.tls) if m.tls.enabled else None,
            topic_prefix=m.topic_prefix or None, legacy_topics=m.legacy_topics,
            fleet_estop_topic=m.fleet_topic,
            protocol=m.protocol, keepalive=m.keepalive_s, max_queued=m.max_queued,
            reconnect_min_s=m.reconnect_min_s, reconnect_max_s=m.reconnect_max_s,
            boot_id=boot_id, config_hash=cfg.hash,
            telemetry_min_interval_s=(1.0 / m.telemetry_hz if m.telemetry_hz > 0
                                      else _TELEMETRY_OFF_INTERVAL_S))
