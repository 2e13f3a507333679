"""`edge-agent watch`: a real subprocess against a private broker (and once against a real daemon).

What an operator sees: one line per message (time, device, kind, the fields that matter), a
report's Markdown as-is, every device with `--device +`, `--json` for scripts, a clean exit on
Ctrl-C, and a one-line error (exit 3) when the broker is unreachable or refuses the account.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from daemon_proc import REPO, SIM_CONFIG, DaemonProc
from mosquitto import Mosquitto, Probe, free_port, wait_until

from edge_agent.comms.watch import Received, format_message

REPORT_MD = "# Gripper weak\n\n| attempt | force |\n|---|---|\n| 1 | 0.4 N |\n\n- raised current"


class Watch:
    """`python -m edge_agent.cli watch ...` with its stdout/stderr collected line by line."""

    def __init__(self, *args: str, password: str = "operator-pw") -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "EDGE_AGENT_MQTT_USERNAME": "operator",
               "EDGE_AGENT_MQTT_PASSWORD": password}
        self.proc = subprocess.Popen([sys.executable, "-m", "edge_agent.cli", "watch", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env=env, cwd=REPO)
        self.out: list[str] = []
        self.err: list[str] = []
        for stream, sink in ((self.proc.stdout, self.out), (self.proc.stderr, self.err)):
            threading.Thread(target=self._pump, args=(stream, sink), daemon=True).start()

    @staticmethod
    def _pump(stream: object, sink: list[str]) -> None:
        for line in stream:  # type: ignore[attr-defined]
            sink.append(line.rstrip("\n"))

    def wait_for(self, text: str, timeout: float = 30.0) -> str:
        wait_until(lambda: any(text in line for line in self.out) or self.proc.poll() is not None,
                   timeout, f"watch output containing {text!r}")
        found = [line for line in self.out if text in line]
        assert found, f"watch exited ({self.proc.returncode}): {self.out} {self.err}"
        return found[0]

    def following(self) -> None:
        """Subscribed (the 'following' notice is printed after CONNACK, subscribe is queued)."""
        wait_until(lambda: any("following" in e for e in self.err)
                   or self.proc.poll() is not None, 30, "watch connected")

    def interrupt(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        return self.proc.wait(20)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        self.proc.wait(10)


def _publish_device(p: Probe, device: str) -> None:
    base = f"edge/{device}"
    p.publish(f"{base}/status", json.dumps({"v": 1, "state": "online", "boot_id": "b" * 32,
                                            "version": "0.1.0", "seq": 3,
                                            "config_hash": "abc123"}), retain=True)
    p.publish(f"{base}/state", json.dumps({
        "v": 1, "mode": "estop", "state": "estop", "degraded": [], "homed": True,
        "stop": {"kind": "estop", "cause": "estop_input", "causes": ["estop_input"],
                 "hardware_input": True}}), retain=True)
    p.publish(f"{base}/event", json.dumps({"v": 1, "ts": 1_700_000_000.25, "mono": 1.0,
                                           "boot_id": "b" * 32, "type": "task_done",
                                           "task_id": "t-9", "outcome": "failed",
                                           "attempts": 3}))
    p.publish(f"{base}/report", json.dumps({"v": 1, "id": "r-1", "ts": 1_700_000_001.0,
                                            "kind": "fault", "markdown": REPORT_MD}))
    p.publish(f"{base}/telemetry", json.dumps({"v": 1, "link_frames": 7}))


def test_readable_lines_for_every_kind_and_every_device(broker: Mosquitto) -> None:
    pub = Probe(broker, "operator", "operator-pw")
    assert pub.connect() == 0
    w = Watch("--config", "/nonexistent.toml", "--host", broker.host, "--port", str(broker.port),
              "--device", "+")
    try:
        w.following()
        _publish_device(pub, "dev1")
        _publish_device(pub, "dev2")
        for dev in ("dev1", "dev2"):
            status = w.wait_for(f"{dev} status")
            assert "online seq=3 version=0.1.0" in status and "config=abc123" in status
            state = w.wait_for(f"{dev} state")
            assert "mode=estop" in state and "stop=estop/estop_input" in state
            assert "estop_input=pressed" in state and "degraded=-" in state
            event = w.wait_for(f"{dev} event")
            assert "task_done" in event and "task_id=t-9" in event and "outcome=failed" in event
            assert "boot_id" not in event and "mono" not in event  # envelope left out
            w.wait_for(f"{dev} report     fault id=r-1")
        text = "\n".join(w.out)
        assert text.count(REPORT_MD) == 2  # the Markdown as-is, once per device
        assert "telemetry" not in text  # only with --telemetry
        assert all(line[2] == ":" and line[5] == ":" for line in w.out if " dev" in line)
        assert w.interrupt() == 0
        assert not any("Traceback" in e for e in w.err), w.err
    finally:
        w.kill()
        pub.close()


def test_json_lines_with_count_and_a_config(broker: Mosquitto) -> None:
    pub = Probe(broker, "operator", "operator-pw")
    assert pub.connect() == 0
    _publish_device(pub, "dev1")  # status and state are retained: watch sees them at once
    w = Watch("--config", str(SIM_CONFIG), "--port", str(broker.port), "--device", "dev1",
              "--json", "--telemetry", "--count", "2")
    try:
        assert w.proc.wait(30) == 0
        wait_until(lambda: len(w.out) >= 2, 10, "two lines")
        rows = [json.loads(line) for line in w.out]
        assert {r["kind"] for r in rows} == {"status", "state"}
        assert all(r["device"] == "dev1" and r["retained"] is True for r in rows)
        state = next(r for r in rows if r["kind"] == "state")
        assert state["payload"]["stop"]["cause"] == "estop_input"
    finally:
        w.kill()
        pub.close()


def test_watch_resubscribes_after_a_broker_restart(broker: Mosquitto) -> None:
    w = Watch("--config", "/nonexistent.toml", "--host", broker.host, "--port", str(broker.port),
              "--device", "dev1")
    try:
        w.following()
        broker.restart()  # no persistence: the subscription is gone unless watch makes it again
        wait_until(lambda: any("reconnected" in e for e in w.err), 30, "watch reconnected")
        pub = Probe(broker, "operator", "operator-pw")
        assert pub.connect() == 0
        # retained: watch sees it whether its SUBSCRIBE lands before or after this publish
        pub.publish("edge/dev1/state", json.dumps({"v": 1, "mode": "idle", "state": "idle",
                                                   "degraded": [], "homed": True}), retain=True)
        assert "mode=idle" in w.wait_for("dev1 state")
        pub.close()
        assert w.interrupt() == 0
    finally:
        w.kill()


def test_unreachable_broker_and_refused_account_are_one_line_errors(broker: Mosquitto) -> None:
    w = Watch("--config", "/nonexistent.toml", "--host", "127.0.0.1", "--port", str(free_port()))
    assert w.proc.wait(30) == 3
    w2 = Watch("--config", "/nonexistent.toml", "--host", broker.host, "--port",
               str(broker.port), password="wrong")
    assert w2.proc.wait(30) == 3
    for x in (w, w2):
        x.kill()
        wait_until(lambda x=x: bool(x.err), 10, "stderr")  # type: ignore[misc]
        assert x.err[-1].startswith("error: ") and not any("Traceback" in e for e in x.err)
    assert "refused" in w2.err[-1]


def test_watching_a_real_daemon_through_an_estop(tmp_path: Path, broker: Mosquitto) -> None:
    d = DaemonProc(tmp_path, broker).start()
    w = Watch("--config", "/nonexistent.toml", "--host", broker.host, "--port", str(broker.port),
              "--device", "dev1")
    try:
        d.wait_ready()
        assert "online" in w.wait_for("dev1 status")  # retained (status*) or live
        w.wait_for("dev1 state")
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        assert d.rig({"cmd": "inject", "target": "estop", "mode": "press"})["ok"]
        assert "cause=estop_input" in w.wait_for("dev1 event      stop ")
        w.wait_for("stop=estop/estop_input")
        assert w.interrupt() == 0
    finally:
        w.kill()
        d.stop()


def test_format_message_is_one_line_and_tolerates_garbage() -> None:
    line = format_message(Received("edge/a/event", b"\xff not json", False, 0.0))
    assert "a event" in line and "not a JSON object" in line
    long = format_message(Received("edge/a/event", json.dumps(
        {"v": 1, "type": "diagnostic", "record": {"x": "y" * 1000}}).encode(), False, 0.0))
    assert "\n" not in long and len(long) <= 240
    assert "state*" in format_message(Received("edge/a/state", b'{"mode": "idle"}', True, 0.0))
