"""MqttSettings.from_config: the one place [mqtt] becomes the bridge's settings."""

from __future__ import annotations

from pathlib import Path

from config_helpers import PASSWORD, load

from edge_agent.comms.mqtt_settings import MqttSettings


def test_from_config_maps_every_mqtt_key_the_bridge_uses(tmp_path: Path) -> None:
    cfg = load(tmp_path, {"mqtt": {
        "host": '"broker.local"', "port": "8884", "password": f'"{PASSWORD}"',
        "protocol": '"3.1.1"', "keepalive_s": "7", "max_queued": "50",
        "reconnect_min_s": "0.25", "reconnect_max_s": "9", "telemetry_hz": "4",
        "fleet_topic": '"site/estop"'}})
    s = MqttSettings.from_config(cfg, boot_id="b-1")
    assert (s.device_id, s.host, s.port, s.username, s.password) == (
        "dev-1", "broker.local", 8884, "dev-1", PASSWORD)
    assert (s.topic_prefix, s.fleet_estop_topic, s.protocol, s.keepalive, s.max_queued) == (
        "edge/dev-1", "site/estop", "3.1.1", 7, 50)
    assert (s.reconnect_min_s, s.reconnect_max_s, s.telemetry_min_interval_s) == (0.25, 9.0, 0.25)
    assert (s.boot_id, s.config_hash, s.tls) == ("b-1", cfg.hash, None)
    assert PASSWORD not in repr(s)


def test_telemetry_off_is_at_most_one_an_hour(tmp_path: Path) -> None:
    cfg = load(tmp_path, {"mqtt": {"telemetry_hz": "0"}})
    assert MqttSettings.from_config(cfg).telemetry_min_interval_s == 3600.0
