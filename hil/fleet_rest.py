"""The fleet benches' wait for robots at rest before an e-stop trial.

A stop makes a repair report: its plot is drawn in a subprocess (~0.9 s of CPU here) and its
recording is written 5 s after the stop. Eight robots' worth of that on this machine's two
cores, with the next e-stop 1.5 s later, made the trials measure the last stop's aftermath
(12-07, 8 daemons: P99 278-312 ms back to back, 36 ms with the robots at rest). A fleet e-stop
in the field reaches robots at work, not robots writing the reports of the last one: the
benches wait, by each robot's own `status`, until it is at rest.
"""

from __future__ import annotations

import json
import time
from typing import Any

import paho.mqtt.client as paho

from edge_agent.comms.mqtt_common import Topics

REPLY_FILTER = "edge/+/reply/status"


def at_rest(status: dict[str, Any] | None) -> bool:
    """Background start-up over (the model, the rest calibration), no report in the outbox (its
    plot drawn, delivered), no recording open."""
    if not status:
        return False
    recorder = ((status.get("observe") or {}).get("recorder")) or {}
    return ({"inference", "calibration"} <= set(status.get("background") or {})
            and (status.get("reports") or {}).get("pending") == 0
            and not recorder.get("open"))


class RestWatch:
    """Asks robots for `status` (on `client`, an operator's connected paho client) until each
    one's answer shows it at rest. Only the answer to the latest ask of a robot counts."""

    def __init__(self, client: paho.Client) -> None:
        self.c = client
        self.status: dict[str, dict[str, Any]] = {}
        self.asked: dict[str, str] = {}
        self.asks = 0
        client.message_callback_add(REPLY_FILTER, self._on_reply)
        client.subscribe(REPLY_FILTER, 1)

    def _on_reply(self, c: Any, u: Any, m: paho.MQTTMessage) -> None:
        device, body = m.topic.split("/")[1], json.loads(m.payload)
        if body.get("id") == self.asked.get(device):
            self.status[device] = body.get("result") or {}

    def quiet(self, devices: list[str]) -> list[str]:
        """The robots at rest by their answers; asks every other one again."""
        done = [d for d in devices if at_rest(self.status.get(d))]
        for d in set(devices) - set(done):
            self.status.pop(d, None)
            self.asks += 1
            self.asked[d] = f"rest-{self.asks}"
            self.c.publish(Topics(f"edge/{d}").cmd("status"),
                           json.dumps({"v": 1, "id": self.asked[d]}), qos=1)
        return done

    def forget(self) -> None:
        """Every answer is old now (an e-stop went out): ask again."""
        self.status.clear()
        self.asked.clear()

    def wait(self, devices: list[str], timeout: float) -> tuple[float, bool]:
        """Forget, then ask every 0.5 s until all of `devices` are at rest or `timeout` passes:
        (seconds waited, all at rest)."""
        self.forget()
        t0 = time.monotonic()
        end = t0 + timeout
        while True:
            if len(self.quiet(devices)) == len(devices):
                return time.monotonic() - t0, True
            if time.monotonic() > end:
                return time.monotonic() - t0, False
            time.sleep(0.5)
