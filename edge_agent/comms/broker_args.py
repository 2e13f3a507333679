"""The broker options an operator tool shares (`watch`, `fleet`): from arguments and a config to
an `MqttTarget`.

    --config PATH   a config naming the broker, TLS, the prefix (optional with --host)
    --host H --port P --username U --password-file F
    --mqtt-protocol 5|3.1.1   the MQTT version (default: the config's mqtt.protocol, else 5);
                              3.1.1 for a broker that speaks no MQTT 5 (NATS, RabbitMQ < 3.13)

A device account may not read other devices' topics (the documented ACL), so an operator connects
as another user: `--username` / `$EDGE_AGENT_MQTT_USERNAME`, the password from `--password-file`
or `$EDGE_AGENT_MQTT_PASSWORD` (never on the command line: `ps` shows it), else the config's when
the user is the config's.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edge_agent.comms.client import MqttTarget
    from edge_agent.config import Config

DEFAULT_CONFIG = "/etc/edge-agent/edge-agent.toml"


class BrokerArgsError(Exception):
    """A bad config (`usage` False) or a bad argument (`usage` True); the message is one line."""

    def __init__(self, message: str, usage: bool) -> None:
        super().__init__(message)
        self.usage = usage


def add_broker_arguments(p: Any) -> None:
    """`--config`, `--host`, `--port`, `--username`, `--password-file`, `--mqtt-protocol`."""
    p.add_argument("--config", metavar="PATH",
                   default=os.environ.get("EDGE_AGENT_CONFIG", DEFAULT_CONFIG),
                   help="a config naming the broker (default: $EDGE_AGENT_CONFIG, else "
                        "%(default)s); optional with --host")
    p.add_argument("--host", default=None, help="broker host (overrides the config)")
    p.add_argument("--port", type=int, default=None, help="broker port (overrides the config)")
    p.add_argument("--username", default=os.environ.get("EDGE_AGENT_MQTT_USERNAME"),
                   help="MQTT user (default: $EDGE_AGENT_MQTT_USERNAME, else the config's)")
    p.add_argument("--password-file", default=None, metavar="PATH",
                   help="file holding the password (default: $EDGE_AGENT_MQTT_PASSWORD, else "
                        "the config's when the user is the config's)")
    p.add_argument("--mqtt-protocol", choices=("5", "3.1.1"), default=None,
                   help="MQTT version (default: the config's mqtt.protocol, else 5); 3.1.1 for "
                        "a broker without MQTT 5 (NATS, RabbitMQ before 3.13)")


@dataclass(frozen=True)
class Broker:
    """The loaded config (None with --host and no config file) and the connection target."""

    cfg: Config | None
    target: MqttTarget


def load_optional_config(a: argparse.Namespace) -> Config | None:
    """The config `--config` names; None when `--host` is given and the file does not exist."""
    from edge_agent.config import load_config
    from edge_agent.errors import ConfigError

    if a.host is not None and not Path(a.config).exists():
        return None
    try:
        return load_config(a.config, sim=True)  # no link.port needed for a client
    except ConfigError as exc:
        raise BrokerArgsError(f"error: {exc}" if exc.source else f"error: {a.config}: {exc}",
                              usage=False) from None


def broker_target(a: argparse.Namespace, cfg: Config | None, device: str,
                  prefix: str | None) -> MqttTarget:
    """The `MqttTarget` for `device` (an id or `+`) from the arguments and `cfg`."""
    from edge_agent.comms.client import MqttTarget
    from edge_agent.comms.mqtt_common import TlsOptions

    m = cfg.mqtt if cfg is not None else None
    own_id = cfg.device.id if cfg is not None else None
    config_user = (m.username or own_id) if m is not None else None
    username = a.username or config_user
    password: str | None = None
    if a.password_file:
        try:
            password = Path(a.password_file).read_text(encoding="utf-8").splitlines()[0]
        except (OSError, IndexError) as exc:
            raise BrokerArgsError(f"error: --password-file {a.password_file}: {exc}",
                                  usage=True) from None
    elif os.environ.get("EDGE_AGENT_MQTT_PASSWORD"):
        password = os.environ["EDGE_AGENT_MQTT_PASSWORD"]
    elif m is not None and m.password is not None and username == config_user:
        password = m.password.reveal()
    tls = None
    if m is not None and m.tls.enabled:
        tls = TlsOptions(ca_file=_str(m.tls.ca_file), cert_file=_str(m.tls.cert_file),
                         key_file=_str(m.tls.key_file), server_hostname_check=not m.tls.insecure)
    return MqttTarget(device_id=device, host=a.host or (m.host if m else "127.0.0.1"),
                      port=a.port or (m.port if m else 1883), username=username,
                      password=password, tls=tls, topic_prefix=prefix,
                      protocol=a.mqtt_protocol or (m.protocol if m else "5"))


def _str(p: object) -> str | None:
    return None if p is None else str(p)
