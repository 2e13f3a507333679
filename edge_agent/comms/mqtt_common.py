"""What the MQTT bridge and the `cmd` client share: topics, TLS options, a configured paho client.

The password is held in no dataclass repr and passed to paho only; nothing here logs it.
"""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTProtocolVersion
from paho.mqtt.properties import Properties

from edge_agent.comms.topic_rules import name_levels
from edge_agent.errors import ConfigError
from edge_agent.log import get_logger

_log = get_logger(__name__)

FLEET_ESTOP_TOPIC = "edge/fleet/cmd/estop"
PROTOCOLS: Mapping[str, int] = {"5": paho.MQTTv5, "5.0": paho.MQTTv5, "3.1.1": paho.MQTTv311,
                                "311": paho.MQTTv311}


@dataclass(frozen=True)
class TlsOptions:
    """Server verification by CA file (system store when None); optional client certificate."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_hostname_check: bool = True

    @classmethod
    def from_config(cls, tls: Any) -> TlsOptions:
        """From an `MqttTlsSection` (edge_agent.config.schema): the daemon's and the CLI's."""
        return cls(ca_file=str(tls.ca_file) if tls.ca_file else None,
                   cert_file=str(tls.cert_file) if tls.cert_file else None,
                   key_file=str(tls.key_file) if tls.key_file else None,
                   server_hostname_check=not tls.insecure)

    def context(self) -> ssl.SSLContext:
        """The client's SSL context; ConfigError naming the mqtt.tls key whose file fails.

        `edge-agent check-config` calls this too, so a file the daemon cannot use (a CA that
        is not a certificate, a key that does not match its certificate, a passphrase-protected
        key) is found before the service starts."""
        try:
            ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        except (ssl.SSLError, OSError, ValueError) as exc:
            raise ConfigError("mqtt.tls.ca_file", self.ca_file,
                              f"cannot be loaded as CA certificates: {_ssl_reason(exc)}") from None
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if not self.server_hostname_check:
            ctx.check_hostname = False
        if self.cert_file:
            try:
                ctx.load_cert_chain(self.cert_file, self.key_file, password=_no_passphrase)
            except _EncryptedKey:
                raise ConfigError("mqtt.tls.key_file", self.key_file or self.cert_file,
                                  "is protected by a passphrase; a service cannot type it: "
                                  "store it unencrypted (mode 0640, root:edge-agent): "
                                  "openssl pkey -in KEY -out KEY.plain") from None
            except (ssl.SSLError, OSError) as exc:
                reason = _ssl_reason(exc)
                key = ("mqtt.tls.key_file" if "KEY_VALUES_MISMATCH" in str(exc)
                       or "key values mismatch" in reason else "mqtt.tls.cert_file")
                why = ("does not belong to mqtt.tls.cert_file (the key and the certificate "
                       "differ)" if key == "mqtt.tls.key_file"
                       else f"certificate + key cannot be loaded: {reason}")
                raise ConfigError(key, self.key_file if key.endswith("key_file")
                                  else self.cert_file, why) from None
        return ctx


class _EncryptedKey(Exception):
    pass


def _no_passphrase() -> bytes:
    # Without this OpenSSL would prompt on the terminal (check-config) or fail obscurely.
    raise _EncryptedKey


def _ssl_reason(exc: BaseException) -> str:
    """A short reason from an ssl/OS error (the library's reason code when it has one)."""
    reason = getattr(exc, "verify_message", None) or getattr(exc, "reason", None)
    if reason:
        return str(reason).replace("_", " ").lower() if str(reason).isupper() else str(reason)
    return getattr(exc, "strerror", None) or str(exc)


@dataclass(frozen=True)
class Topics:
    """Every topic of one device, derived from its prefix (`edge/<device.id>` by default).

    A command travels on `<prefix>/cmd/<group>/<verb>` (`cmd/task/start`) and is answered on
    `<prefix>/reply/<group>/<verb>`; its NAME stays dotted (`task.start`) in payloads, events and
    the CLI. The dotted topics of earlier releases (`cmd/task.start`, answered on
    `reply/task.start`) are deprecated aliases the daemon still serves while `legacy` is true
    (config `mqtt.legacy_topics`). Names without a dot (`status`, `estop`) have one topic."""

    prefix: str
    fleet_estop: str = FLEET_ESTOP_TOPIC
    legacy: bool = True  # the daemon answers the dotted alias topics too

    @property
    def cmd_filter(self) -> str:
        """What the daemon subscribes: every command (and, under `#`, the dotted aliases)."""
        return f"{self.prefix}/cmd/#"

    @property
    def reply_filter(self) -> str:
        """Every reply of this device (`+` as the device level in the prefix: of every device)."""
        return f"{self.prefix}/reply/#"

    def cmd(self, name: str) -> str:
        return f"{self.prefix}/cmd/{name_levels(name)}"

    def reply(self, name: str) -> str:
        return f"{self.prefix}/reply/{name_levels(name)}"

    def legacy_cmd(self, name: str) -> str:
        """The deprecated dotted alias of `cmd(name)` (the same topic when the name has no dot)."""
        return f"{self.prefix}/cmd/{name}"

    def legacy_reply(self, name: str) -> str:
        """Where a command that came on `legacy_cmd(name)` is answered."""
        return f"{self.prefix}/reply/{name}"

    def reply_allowed(self, topic: str) -> bool:
        """An MQTT 5 response topic is honoured only under `<prefix>/reply/` (no wildcards):
        a command must not make the device publish elsewhere (e.g. a fleet e-stop)."""
        head = f"{self.prefix}/reply/"
        return (topic.startswith(head) and len(topic) > len(head)
                and not any(c in topic for c in "+#\x00"))

    @property
    def status(self) -> str:
        return f"{self.prefix}/status"

    @property
    def state(self) -> str:
        return f"{self.prefix}/state"

    @property
    def event(self) -> str:
        return f"{self.prefix}/event"

    @property
    def report(self) -> str:
        return f"{self.prefix}/report"

    @property
    def telemetry(self) -> str:
        return f"{self.prefix}/telemetry"

    def command_name(self, topic: str) -> str | None:
        """`<prefix>/cmd/task/start` (or the dotted alias `<prefix>/cmd/task.start`) →
        `task.start`; None for any other topic (an empty level, a dot beside a `/`)."""
        head = f"{self.prefix}/cmd/"
        if not topic.startswith(head):
            return None
        rest = topic[len(head):]
        levels = rest.split("/")
        if not rest or "" in levels or (len(levels) > 1 and "." in rest):
            return None
        return ".".join(levels)

    def is_legacy(self, topic: str) -> bool:
        """A command on a dotted alias topic (`<prefix>/cmd/task.start`)."""
        head = f"{self.prefix}/cmd/"
        return topic.startswith(head) and "." in topic[len(head):]

    def reply_for(self, name: str, *, legacy: bool = False) -> str:
        """Where a command is answered: the alias's reply topic when it came on an alias."""
        return self.legacy_reply(name) if legacy else self.reply(name)


def check_topic_level(key: str, value: str) -> str:
    """A value used as one topic level (the device id): non-empty, no `/`, `+`, `#`, NUL."""
    if not value or any(c in value for c in "/+#\x00"):
        raise ConfigError(key, value, "must be non-empty without / + # (it is a topic level)")
    return value


def protocol_number(protocol: str | int) -> int:
    """'5' / '3.1.1' (or paho's constants) → paho's protocol constant."""
    if isinstance(protocol, int) and protocol in (paho.MQTTv5, paho.MQTTv311):
        return protocol
    number = PROTOCOLS.get(str(protocol))
    if number is None:
        raise ConfigError("mqtt.protocol", protocol, "expected '5' or '3.1.1'")
    return number


def make_client(client_id: str, *, protocol: str | int, username: str | None,
                password: str | None, tls: TlsOptions | None,
                clean_session: bool | None = None,
                cls: type[paho.Client] = paho.Client) -> paho.Client:
    """A paho 2.x client (callback API v2) with credentials and TLS applied; `cls`: the
    daemon's `mqtt_bounded.BoundedClient`."""
    number = protocol_number(protocol)
    kwargs: dict[str, Any] = {}
    if number != paho.MQTTv5:
        kwargs["clean_session"] = True if clean_session is None else clean_session
    client = cls(CallbackAPIVersion.VERSION2, client_id=client_id,
                         protocol=MQTTProtocolVersion(number), **kwargs)
    if username is not None:
        client.username_pw_set(username, password)
    if tls is not None:
        client.tls_set_context(tls.context())
    return client


def mqtt_properties(packet_type: int) -> Properties:
    """An empty MQTT 5 property set for one packet type (paho's constructor is untyped)."""
    return Properties(packet_type)  # type: ignore[no-untyped-call]


def set_nodelay(sock: object) -> bool:
    """TCP_NODELAY on paho's socket: a QoS 1 round trip drops from ~88 ms to ~0.25 ms here."""
    setsockopt = getattr(sock, "setsockopt", None)
    if setsockopt is None:
        return False
    try:
        setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # not a TCP socket (a websocket wrapper, a unix socket)
        return False
    return True


def to_payload(data: Mapping[str, Any]) -> bytes:
    """JSON with `"v": 1` first (added when missing); unknown types become strings."""
    body = {"v": 1, **data} if "v" not in data else dict(data)
    return json.dumps(body, separators=(",", ":"), default=str).encode("utf-8")


def reason_failed(reason_code: Any) -> bool:
    """paho v2 hands ReasonCode objects (v5) or ints; both mean failure when >= 128 / non-zero."""
    is_failure = getattr(reason_code, "is_failure", None)
    if isinstance(is_failure, bool):
        return is_failure
    try:
        return int(reason_code) != 0
    except (TypeError, ValueError):
        return True


V5_REFUSED = ("the broker does not speak MQTT 5 (NATS, and RabbitMQ before 3.13, speak only "
              "3.1.1): set mqtt.protocol = \"3.1.1\" (docs/INSTALL.md, Brokers)")
V5_CLOSED = ("the broker closed the connection before answering the MQTT 5 CONNECT: if it does "
             "not speak MQTT 5 (RabbitMQ before 3.13 closes silently), set "
             "mqtt.protocol = \"3.1.1\" (docs/INSTALL.md, Brokers)")


def protocol_refused(reason_code: Any) -> bool:
    """A CONNACK that refuses the protocol version (MQTT 5 reason 0x84; paho maps 3.1.1's 1)."""
    value = getattr(reason_code, "value", reason_code)
    try:
        return int(value) == 0x84
    except (TypeError, ValueError):
        return False


def connect_refusal(reason_code: Any, *, v5: bool = True) -> str:
    """One line for a refused CONNACK: the reason, and `mqtt.protocol` when that is the cause."""
    if v5 and protocol_refused(reason_code):
        return f"the broker refused the connection: {reason_code}: {V5_REFUSED}"
    return f"the broker refused the connection: {reason_code}"


def connect_failure_reason(exc: BaseException | None) -> str:
    """One line: why a connection attempt failed (OpenSSL's verify message when TLS)."""
    if exc is None:
        return "connection failed"
    verify = getattr(exc, "verify_message", None)
    if verify:
        return f"TLS: the broker's certificate was rejected: {verify}"
    if isinstance(exc, ssl.SSLError):
        return f"TLS: {exc.reason or exc}"
    return f"{type(exc).__name__}: {exc}"
