"""Doctor checks of the broker: TLS files, login as the device, what its ACL lets it do.

It logs in as the daemon does (username, password, TLS; a client id of its own) and asks for
what the daemon needs: subscriptions to its commands and the fleet e-stop, and a QoS 1 publish on
one of its own topics (`<prefix>/reply/doctor`: MQTT 5 brokers answer a publish the ACL denies
with PUBACK reason 0x87; Mosquitto does). The documented ACL gives a device no topic it may both
write and read, so the round trip is the broker's answer to each request — which proves
writing, not reading: Mosquitto grants every subscription and filters at delivery (a refused
SUBACK is reported; a granted one is no proof). Under MQTT 3.1.1 a denied publish is
acknowledged like any other: the write check is then reported as unproven.

While this device's daemon runs, doctor does not log in (with `use_username_as_clientid` the
broker would disconnect the daemon): it asks the daemon whether its MQTT session is up.
"""

from __future__ import annotations

import json
import queue
import ssl
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.doctor import Finding, error, ok, warn

if TYPE_CHECKING:
    from edge_agent.config import Config

ACL_FIX = ("let the device read edge/%u/cmd/# and the fleet topic and write its own topics: the "
           "`pattern` lines of docs/mosquitto/acl in the broker's acl_file, then reload the broker")


def check_tls_files(cfg: Config) -> list[Finding]:
    """Every TLS file the config names is readable by this user."""
    t = cfg.mqtt.tls
    out: list[Finding] = []
    for key, p in (("ca_file", t.ca_file), ("cert_file", t.cert_file), ("key_file", t.key_file)):
        if p is None:
            continue
        try:
            with open(p, "rb") as f:
                f.read(1)
        except OSError as exc:
            out.append(error("broker_tls", f"mqtt.tls.{key} {p}: {exc.strerror}",
                             f"make {p} readable by the service user (root:edge-agent 0640 for "
                             "a key, 0644 for a certificate)"))
    if t.enabled and not out:
        out.append(ok("broker_tls", "TLS files readable"
                      + (" (certificate checks OFF: mqtt.tls.insecure)" if t.insecure else "")))
    return out


def check_broker(cfg: Config, timeout: float = 5.0) -> list[Finding]:
    """Log in as the device; subscribe to its commands; publish on its own topic."""
    if any(f.level > 0 for f in check_tls_files(cfg)):
        return [error("broker", "not tried: a TLS file cannot be read (see broker_tls)",
                      "fix broker_tls first")]
    running = _daemon_session(cfg)
    if running is not None:
        return [running]
    import paho.mqtt.client as paho
    from paho.mqtt.packettypes import PacketTypes

    from edge_agent.comms.mqtt_common import (
        V5_REFUSED,
        TlsOptions,
        Topics,
        make_client,
        mqtt_properties,
        protocol_number,
        protocol_refused,
    )

    m = cfg.mqtt
    device = cfg.device.id
    user = m.username or device
    where = f"{m.host}:{m.port} as {user}"
    tls = None
    if m.tls.enabled:
        tls = TlsOptions(ca_file=_s(m.tls.ca_file), cert_file=_s(m.tls.cert_file),
                         key_file=_s(m.tls.key_file), server_hostname_check=not m.tls.insecure)
    v5 = protocol_number(m.protocol) == paho.MQTTv5
    events: queue.Queue[tuple[str, Any]] = queue.Queue()
    try:
        # its own client id: where the broker does not force id = username, a daemon of this
        # device elsewhere is not disconnected by the check
        client = make_client(f"{device}-doctor-{uuid.uuid4().hex[:6]}", protocol=m.protocol,
                             username=user, tls=tls,
                             password=m.password.reveal() if m.password else None)
    except (OSError, ssl.SSLError, ValueError) as exc:
        return [error("broker", f"TLS set-up: {exc}", "check mqtt.tls.* files (PEM)")]
    connack: dict[str, Any] = {}

    def on_connect(c: Any, u: Any, f: Any, rc: Any, props: Any) -> None:
        connack["props"] = props
        events.put(("connect", rc))

    client.on_connect = on_connect
    client.on_subscribe = lambda c, u, mid, codes, p: events.put(("subscribe", codes))
    client.on_publish = lambda c, u, mid, rc, p: events.put(("publish", rc))
    client.on_disconnect = lambda c, u, f, rc, p: events.put(("disconnect", rc))
    topics = Topics(m.topic_prefix or f"edge/{device}")
    try:
        try:
            client.connect(m.host, m.port, keepalive=max(5, int(timeout) + 5))
        except ssl.SSLError as exc:
            return [error("broker", f"{where}: TLS handshake failed: {exc.reason or exc}",
                          "mqtt.tls.ca_file must hold the CA that signed the broker's "
                          "certificate, and mqtt.host must match its name")]
        except OSError as exc:
            return [error("broker", f"{where}: cannot connect: {exc}",
                          "check mqtt.host/mqtt.port and that the broker runs "
                          "(`systemctl status mosquitto`) and is reachable from here")]
        client.loop_start()
        rc = _expect(events, "connect", timeout)
        if v5 and rc is not None and protocol_refused(rc):
            return [error("broker", f"{where}: MQTT 5 refused: {rc}", V5_REFUSED)]
        if rc is None or _failed(rc):
            why = "no answer" if rc is None else str(rc)
            return [error("broker", f"{where}: login refused: {why}",
                          f"the broker's password file must hold user {user} with the password "
                          "in mqtt.password_file (`mosquitto_passwd -b <file> "
                          f"{user} <password>`), then reload the broker")]
        out = [ok("broker", f"{where}: logged in ({'MQTT 5' if v5 else 'MQTT 3.1.1'}"
                            f"{', TLS' if tls else ''})")]
        filters = [topics.cmd_filter, m.fleet_topic]
        client.subscribe([(f, 1) for f in filters])
        codes = _expect(events, "subscribe", timeout)
        if codes is None:
            return [*out, error("broker_acl", "no answer to SUBSCRIBE", ACL_FIX)]
        refused = [f for f, c in zip(filters, codes, strict=False) if _failed(c)]
        if refused:
            out.append(error("broker_acl", f"subscription refused: {', '.join(refused)} (the "
                                           "device would never receive commands there)", ACL_FIX))
        else:
            # Mosquitto grants every subscription and filters at delivery: a grant does not
            # prove the ACL lets the commands through (the first command over MQTT does)
            out.append(ok("broker_acl", f"subscriptions granted: {', '.join(filters)} (the "
                                        "broker may still filter what it delivers)"))
        props = None
        if v5:
            props = mqtt_properties(PacketTypes.PUBLISH)
            props.MessageExpiryInterval = 5
        probe = topics.reply("doctor")
        payload = json.dumps({"v": 1, "id": uuid.uuid4().hex, "ok": True, "doctor": True})
        client.publish(probe, payload, qos=1, properties=props)
        rc = _expect(events, "publish", timeout)
        if rc is None:
            out.append(error("broker_acl", f"no PUBACK for a QoS 1 publish on {probe}", ACL_FIX))
        elif _failed(rc):
            out.append(error("broker_acl", f"publish on {probe} refused: {rc} (replies, state "
                                           "and events would be dropped)", ACL_FIX))
        elif v5:
            out.append(ok("broker_acl", f"may publish on its topics ({probe} acknowledged)"))
        else:
            out.append(warn("broker_acl", f"publish on {probe} acknowledged, but MQTT 3.1.1 "
                                          "acknowledges denied publishes too: not proven",
                            "use mqtt.protocol = \"5\" (or read the broker log for "
                            "'Denied PUBLISH')"))
        # last: a broker with max_packet_size answers the oversized probe by disconnecting
        out.append(_size_limit(client, events, probe, v5, connack.get("props"), timeout))
        return out
    finally:
        client.disconnect()
        client.loop_stop()


SIZE_FIX = ("refuse large packets at the broker: `max_packet_size 262144` (as "
            "docs/mosquitto/mosquitto.conf), then reload it")


def _size_limit(client: Any, events: queue.Queue[tuple[str, Any]], topic: str, v5: bool,
                props: Any, timeout: float) -> Finding:
    """Whether the broker refuses a publish over what the daemon reads (docs/INSTALL.md)."""
    from paho.mqtt.packettypes import PacketTypes

    from edge_agent.comms.mqtt_bounded import MAX_PACKET_BYTES
    from edge_agent.comms.mqtt_common import mqtt_properties

    advertised = getattr(props, "MaximumPacketSize", None) if v5 else None
    if isinstance(advertised, int) and advertised <= MAX_PACKET_BYTES:
        return ok("broker_size", f"the broker takes no packet over {advertised} bytes "
                                 "(max_packet_size, in its CONNACK)")
    body = json.dumps({"v": 1, "id": uuid.uuid4().hex, "doctor": "size probe",
                       "pad": " " * MAX_PACKET_BYTES})
    size = len(body)
    pub_props = None
    if v5:
        pub_props = mqtt_properties(PacketTypes.PUBLISH)
        pub_props.MessageExpiryInterval = 5
    client.publish(topic, body, qos=1, properties=pub_props)
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        try:
            what, rc = events.get(timeout=left)
        except queue.Empty:
            break
        if what == "disconnect":
            return ok("broker_size", f"the broker refuses a {size}-byte publish (it "
                                     "disconnected the sender)")
        if what != "publish":
            continue
        if _failed(rc):
            return ok("broker_size", f"the broker refuses a {size}-byte publish ({rc})")
        if v5:
            return warn("broker_size", f"the broker accepted a {size}-byte publish: the daemon "
                                       "never reads one (its CONNECT says so), but a command that "
                                       "large is dropped without a reply", SIZE_FIX)
        return warn("broker_size", f"the broker acknowledged a {size}-byte publish (MQTT 3.1.1 "
                                   "acknowledges refused ones too: not proven); without a limit "
                                   "a publish that large on a command topic makes the daemon "
                                   "drop its connection and reconnect", SIZE_FIX)
    return warn("broker_size", f"no answer to a {size}-byte publish", SIZE_FIX)


def _daemon_session(cfg: Config) -> Finding | None:
    """When this device's daemon answers on its control socket: whether its session is up."""
    from edge_agent.comms.jsonline import json_line_request

    sock = cfg.state_dir / "control.sock"
    if not Path(sock).exists():
        return None
    try:
        reply = json_line_request(sock, {"cmd": "status", "v": 1, "id": uuid.uuid4().hex},
                                  3.0, what="status")
    except Exception:  # no daemon behind the socket file: log in ourselves
        return None
    res = reply.get("result") or {}
    if res.get("mqtt_connected"):
        return ok("broker", f"the running daemon ({cfg.device.id}) is connected with its command "
                            "subscription granted (not logging in beside it)")
    return error("broker", f"the running daemon ({cfg.device.id}) is not connected to "
                           f"{cfg.mqtt.host}:{cfg.mqtt.port}",
                 "its log says why (`journalctl -u edge-agent | grep mqtt`); stop it and run "
                 "doctor again to test the login and the ACL directly")


def _expect(events: queue.Queue[tuple[str, Any]], kind: str, timeout: float) -> Any:
    end = time.monotonic() + timeout
    while (left := end - time.monotonic()) > 0:
        try:
            what, value = events.get(timeout=left)
        except queue.Empty:
            return None
        if what == kind:
            return value
        if what == "disconnect":  # the broker closed the connection instead of answering
            return f"disconnected ({value})" if kind == "connect" else None
    return None


def _failed(rc: Any) -> bool:
    from edge_agent.comms.mqtt_common import reason_failed

    return reason_failed(rc)


def _s(p: object) -> str | None:
    return None if p is None else str(p)
