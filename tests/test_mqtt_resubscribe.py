"""A broker that refuses the command subscription (a SUBACK failure) leaves the connection up but
the daemon deaf to commands and to the fleet e-stop: the bridge asks again, with backoff, on the
same connection, and is `ready` only once the subscription is granted.

The refusal here is real: a private Mosquitto with its dynamic-security plugin, whose default
denies every SUBSCRIBE (Mosquitto 2.0's acl_file grants a subscription and only filters what it
delivers); the test then allows subscriptions through the plugin's `$CONTROL` API, on the
running broker. In the field it was NATS's MQTT gateway: JetStream could not create the
subscription's consumer in time (12-07, ten daemons on a loaded machine), and the daemon stayed
connected and deaf until its connection dropped."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from conftest import MQTT_USERS
from mosquitto import Mosquitto, Probe, wait_until
from test_mqtt_bridge import T1, Device, body, reply_for

from edge_agent.log import capture_logs

# Debian's mosquitto package ships the plugin in the multiarch library dir
DYNSEC = next(iter(sorted(Path("/usr/lib").glob("*/mosquitto_dynamic_security.so"))),
              Path("/usr/lib/mosquitto_dynamic_security.so"))
CONTROL = "$CONTROL/dynamic-security/v1"
ADMIN = ("admin", "admin-pw")


def _dynsec_broker(workdir: Path) -> Mosquitto:
    broker = Mosquitto(workdir, MQTT_USERS)
    config = workdir / "dynsec.json"
    subprocess.run([shutil.which("mosquitto_ctrl") or "/usr/bin/mosquitto_ctrl", "dynsec",
                    "init", str(config), *ADMIN], check=True, capture_output=True)
    broker.use_config("\n".join([
        "per_listener_settings false", f"listener {broker.port} {broker.host}",
        f"plugin {DYNSEC}", f"plugin_opt_config_file {config}", "allow_anonymous false",
        "set_tcp_nodelay true", "persistence false", "log_dest stderr"]) + "\n")
    return broker


def _control(admin: Probe, *commands: dict[str, Any]) -> None:
    admin.publish(CONTROL, json.dumps({"commands": list(commands)}).encode())
    msg = admin.expect(lambda m: m.topic == f"{CONTROL}/response", 10)
    answers = json.loads(msg.payload)["responses"]
    assert not any("error" in a for a in answers), answers


@pytest.mark.skipif(not DYNSEC.exists(), reason="no mosquitto dynamic-security plugin")
@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_refused_command_subscription_is_asked_again_until_granted(
        tmp_path: Path, protocol: str) -> None:
    broker = _dynsec_broker(tmp_path / "mosquitto")
    broker.start()
    admin = Probe(broker, *ADMIN)
    operator = Probe(broker, "operator", MQTT_USERS["operator"])
    dev = Device(broker, protocol=protocol)
    try:
        assert not admin.connect().is_failure
        assert not admin.subscribe(f"{CONTROL}/response")[0].is_failure
        # the device and the operator may log in and publish; nobody may subscribe (the
        # plugin's default), but the operator, by a role
        _control(admin,
                 {"command": "createClient", "username": "dev1", "password": MQTT_USERS["dev1"]},
                 {"command": "createClient", "username": "operator",
                  "password": MQTT_USERS["operator"]},
                 {"command": "createRole", "rolename": "watch"},
                 {"command": "addRoleACL", "rolename": "watch", "acltype": "subscribePattern",
                  "topic": "#", "allow": True},
                 {"command": "addClientRole", "username": "operator", "rolename": "watch"},
                 {"command": "setDefaultACLAccess", "acls": [
                     {"acltype": "publishClientSend", "allow": True}]})
        assert not operator.connect().is_failure
        assert not operator.subscribe(T1.reply_filter)[0].is_failure
        with capture_logs() as logs:
            dev.bridge.start()
            wait_until(lambda: dev.bridge.counters["subscribe_refused"] >= 2, 10,
                       "the refusal seen and the subscription asked again")
            assert dev.bridge.connected and not dev.bridge.ready
            assert "refused the command subscription" in (dev.bridge.last_error or "")
            refused = [e for e in logs if e["event"] == "mqtt_subscribe_refused"]
            assert refused and refused[0]["retry_in_s"] > 0, refused

            _control(admin, {"command": "setDefaultACLAccess", "acls": [
                {"acltype": "subscribe", "allow": True}]})
            assert dev.bridge.wait_ready(10), dev.bridge.counters
        assert any(e["event"] == "mqtt_subscribed_after_refusal" for e in logs)
        assert dev.bridge.last_error is None
        # the same connection, asked again; not a reconnect
        assert dev.bridge.counters["connections"] == 1, dev.bridge.counters
        operator.publish(T1.cmd("status"), body("heard"))
        assert reply_for(operator, "heard")["ok"]
        operator.publish("edge/fleet/cmd/estop", json.dumps({"v": 1}).encode())
        wait_until(lambda: len(dev.estops) == 1, 10, "the fleet e-stop")
    finally:
        dev.bridge.stop()
        operator.close()
        admin.close()
        broker.stop()
