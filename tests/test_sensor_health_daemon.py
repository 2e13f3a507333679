"""A camera dropout on a real `--sim` daemon: `sensor_predicted` for the channel, then recovery.

The rig (hil/sim) drops the camera for 0.8 s, inside its 1 s prediction bound: the hub predicts
the pose, the stale watch fails `sensor:object_pose` at once, the mode is entered (event,
`state.degraded`) and left after `health.recover_after` good runs — with no protective stop.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProc
from mosquitto import wait_until


def test_a_camera_dropout_is_sensor_predicted_then_recovered(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, None, extra=("health.period_s=0.2",)).start()

    def events(kind: str) -> list[dict[str, Any]]:
        return [e for e in d.events("event") if e.get("type") == kind
                and e.get("mode") == "sensor_predicted"]

    def probe(name: str) -> dict[str, Any]:
        health = d.socket_cmd("status")["result"].get("health") or {}  # None before it starts
        return dict((health.get("probes") or {}).get(name) or {})

    try:
        d.wait_ready()
        wait_until(lambda: probe("sensor:object_pose").get("level") == "ok", 30, "camera up")
        t0 = time.monotonic()
        r = d.rig({"cmd": "inject", "target": "sensor:object_pose", "mode": "dropout",
                   "duration_s": 0.8})
        assert r["ok"], r
        wait_until(lambda: bool(events("degraded")), 30, "sensor_predicted entered")
        entered_s = time.monotonic() - t0
        ev = events("degraded")[0]
        assert ev["subject"] == "object_pose" and ev["probe"] == "sensor:object_pose"
        assert "Kalman-predicted" in ev["cause"], ev
        wait_until(lambda: bool(events("recovered")), 30, "sensor_predicted left")
        st = d.socket_cmd("status")["result"]
        assert "sensor_predicted" not in st["health"]["degraded"]
        assert probe("sensor:object_pose")["fast_fails"] >= 1  # the stale watch saw it first
        assert not [e for e in d.events("event") if e.get("type") == "sensor_lost"]
        print(f"camera dropout -> sensor_predicted in {entered_s * 1e3:.0f} ms")
    finally:
        d.stop()
