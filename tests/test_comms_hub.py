"""The daemon's comms on their own: a real command API, a real broker, the real control socket."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.commands import CommandAPI, CommandContext
from edge_agent.comms.client import json_line_request
from edge_agent.config import load_config
from edge_agent.daemon.comms_hub import CommsHub
from edge_agent.daemon.supervisor import Supervisor
from edge_agent.vocab import EventType, StopCause

SIM = Path(__file__).resolve().parents[1] / "configs" / "sim.toml"


def test_events_from_before_the_bridge_go_out_in_order_and_a_socket_estop_comes_first(
        tmp_path: Path, broker: Mosquitto) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    cfg = load_config(SIM, [f"state_dir={state}", "link.port=/dev/null", "device.id=dev1",
                            f"mqtt.port={broker.port}", 'mqtt.password="dev1-secret-pw"'])
    order: list[str] = []
    threads = Supervisor(("comms", "mqtt-start"))
    hub = CommsHub(cfg, "boot-1", on_estop=lambda cause: order.append(f"on_estop:{cause.value}"),
                   state=lambda: {"mode": "idle"}, telemetry=dict, spawn=threads.spawn)
    seen: list[dict[str, Any]] = []
    hub.add_listener(seen.append)
    probe = Probe(broker, "operator", "operator-pw")
    assert probe.connect() == 0
    probe.subscribe("edge/dev1/event")
    for n in range(3):  # MQTT not even started: kept for the bridge, in order
        hub.event({"type": EventType.ESTIMATORS_READY, "ms": n})
    assert hub.mqtt_status() == {"connected": False, "bridge": False, "error": None,
                                 "attempts": 0}

    def estop(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        order.append(f"handler:{ctx.source}")
        return {"latched": True}

    api = CommandAPI(lambda: "idle")
    api.register("estop", estop)
    threads.adopt("comms", hub.stop)
    hub.start(api)
    try:
        got = [json.loads(probe.expect(lambda m: b'"estimators_ready"' in m.payload).payload)
               for _ in range(3)]
        assert [e["ms"] for e in got] == [0, 1, 2]
        assert all(e["boot_id"] == "boot-1" and e["type"] == "estimators_ready" for e in got)
        assert [e.get("ms") for e in seen][:3] == [0, 1, 2]  # listeners see every event
        assert EventType.MQTT_CONNECTED in [e["type"] for e in seen]
        wait_until(lambda: hub.mqtt_ready, 10, "the command subscription")
        assert hub.mqtt_status()["connected"] is True
        reply = json_line_request(state / "control.sock", {
            "cmd": "estop", "v": 1, "id": os.urandom(6).hex()}, 5.0, what="estop")
        assert reply["ok"] is True
        assert order == [f"on_estop:{StopCause.ESTOP_LOCAL.value}", "handler:socket"]
    finally:
        threads.stop()
        probe.close()
    hub.stop()  # idempotent
    health = {h.name: h for h in threads.health()}
    assert health["mqtt-start"].alive is False and health["mqtt-start"].last_error is None
    assert not (state / "control.sock").exists()
