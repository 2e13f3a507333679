"""A real `--sim` daemon on each broker a fleet may run: Mosquitto, NATS's MQTT gateway, RabbitMQ's
MQTT plugin (issue 31, "Broker portability"), each started privately on free ports.

For each: the birth (`online`, retained), a task to `task_done`, an e-stop and its reset, a
broker restart the daemon reconnects through (answering again, a new `seq`), and its Last Will
(`offline`) after a kill -9. Commands go through `edge_agent.comms.client.send_command` (what
`edge-agent cmd` does): MQTT 5 response topic + correlation data on Mosquitto, MQTT 3.1.1 matched
by id on NATS and RabbitMQ (neither speaks MQTT 5 here). What each broker does with the
deprecated dotted topics is pinned too, and that a daemon configured for MQTT 5 against a 3.1.1
broker says to set `mqtt.protocol`.

RabbitMQ takes ~10 s to boot on a loaded 2-core machine: its node starts in the background when
the module begins, so the boot overlaps the Mosquitto and NATS runs. A broker that cannot start
here is skipped with the reason.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from brokers import NatsMqtt, RabbitMqtt
from conftest import MQTT_USERS
from daemon_proc import DaemonProc
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.commands import CommandAPI, Mode
from edge_agent.comms.client import MqttTarget, send_command
from edge_agent.comms.jsonline import CommandTimeout, CommandTransportError
from edge_agent.comms.mqtt_bridge import MqttBridge
from edge_agent.comms.mqtt_common import Topics
from edge_agent.comms.mqtt_settings import MqttSettings
from edge_agent.vocab import ErrorCode

T1 = Topics("edge/dev1")
# about the broker, not L1 nor the deadman: generous timeouts on this loaded 2-core machine
SETS = (*(f"executor.l1_timeouts_s.{s}=60" for s in (
    "approach", "grasp", "lift", "transfer", "release", "retreat")), "link.deadman_ms=1000",
    "executor.reset_min_interval_s=0", "mqtt.telemetry_hz=0")


class _Background:
    """RabbitMQ booting in a thread while the other brokers' tests run."""

    def __init__(self, broker: RabbitMqtt) -> None:
        self.broker = broker
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="rabbitmq-boot", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.broker.start()
        except BaseException as exc:  # handed to the test that needs it
            self.error = exc


@pytest.fixture(scope="module", autouse=True)
def rabbit_boot(request: pytest.FixtureRequest,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Background | None]:
    wanted = any("rabbitmq" in item.name for item in request.session.items
                 if item.module is request.module)
    if not wanted or RabbitMqtt.unavailable():
        yield None
        return
    boot = _Background(RabbitMqtt(tmp_path_factory.mktemp("rabbitmq"), MQTT_USERS))
    try:
        yield boot
    finally:
        boot.thread.join(120)
        boot.broker.stop()


@pytest.fixture(params=["mosquitto", "nats", "rabbitmq"])
def any_broker(request: pytest.FixtureRequest, tmp_path: Path,
               rabbit_boot: _Background | None) -> Iterator[Any]:
    name = request.param
    if name == "rabbitmq":
        why = RabbitMqtt.unavailable()
        if why or rabbit_boot is None:
            pytest.skip(f"RabbitMQ cannot start here: {why}")
        rabbit_boot.thread.join(120)
        if rabbit_boot.error is not None:
            pytest.skip(f"RabbitMQ cannot start here: {rabbit_boot.error}")
        b = rabbit_boot.broker
        print(f"rabbitmq {b.version()} boot {b.start_s[0]:.1f} s (in the background)")
        yield b  # stopped by rabbit_boot
        return
    if name == "nats":
        why = NatsMqtt.unavailable()
        if why:
            pytest.skip(why)
        b = NatsMqtt(tmp_path / "nats", MQTT_USERS)
    else:
        b = Mosquitto(tmp_path / "mosquitto", MQTT_USERS)
        b.name, b.protocol = "mosquitto", "5"  # type: ignore[attr-defined]
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _probe(broker: Any) -> Probe:
    """The operator's watcher: presence, state, events and every reply of dev1."""
    proto = paho.MQTTv5 if broker.protocol == "5" else paho.MQTTv311
    p = Probe(broker, "operator", MQTT_USERS["operator"], protocol=proto,
              client_id=f"watch-{time.monotonic_ns()}")
    assert not paho_failed(p.connect(timeout=20)), broker.log()
    for topic in (T1.status, T1.state, T1.event, T1.reply_filter):
        assert not any(paho_failed(rc) for rc in p.subscribe(topic, timeout=20)), topic
    return p


def paho_failed(rc: Any) -> bool:
    return bool(getattr(rc, "is_failure", rc))


def _payload(msg: Any) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(msg.payload)
    return out


def _cmd(broker: Any, name: str, args: dict[str, Any] | None = None,
         timeout: float = 15.0) -> dict[str, Any]:
    """`edge-agent cmd NAME` over MQTT as the operator (the client's own topic handling)."""
    target = MqttTarget(device_id="dev1", host=broker.host, port=broker.port,
                        username="operator", password=MQTT_USERS["operator"],
                        protocol=broker.protocol)
    return send_command(name, args or {}, mqtt=target, timeout=timeout)


def _answers(broker: Any) -> bool:
    # a status sent before the daemon is subscribed again is lost: retry after 1 s (a round
    # trip takes milliseconds), not after 3 s
    try:
        return bool(_cmd(broker, "status", timeout=1)["ok"])
    except (CommandTimeout, CommandTransportError):
        return False


def _idle(b: Any, d: DaemonProc) -> None:
    """A loaded machine may start the sim daemon in a protective stop (a late first frame):
    reset it, saying so — the broker is what is under test here."""
    st = d.socket_cmd("status")["result"]
    if st["mode"] == "protective_stop":
        print(f"{b.name}: the daemon came up in a protective stop {st['stop']}: reset")
        wait_until(lambda: _cmd(b, "reset")["ok"], 30, "reset of the start-up stop")
    wait_until(lambda: d.socket_cmd("status")["result"]["mode"] == "idle", 30, "idle")


def test_daemon_works_end_to_end_on_the_broker(any_broker: Any, tmp_path: Path) -> None:
    b = any_broker
    t0 = last = time.monotonic()
    laps: list[str] = []

    def lap(what: str) -> None:
        nonlocal last
        now = time.monotonic()
        laps.append(f"{what} {now - last:.1f} s")
        last = now

    probe = _probe(b)
    d = DaemonProc(tmp_path, b, extra=(f'mqtt.protocol="{b.protocol}"', *SETS)).start()
    fleet: _Lines | None = None
    try:
        boot = d.wait_ready()["boot_id"]
        # birth: online, this boot, first connection
        online = probe.expect(lambda m: m.topic == T1.status and _payload(m)["state"] == "online"
                              and _payload(m)["boot_id"] == boot, timeout=30)
        assert _payload(online)["seq"] == 0
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        _idle(b, d)
        lap("online")
        fleet = _fleet_status(b, tmp_path)
        lap("fleet status")

        # a task to its end
        started = _cmd(b, "task.start", {"id": f"job-{b.name}"})
        assert started["ok"], started
        done = _payload(probe.expect(lambda m: m.topic == T1.event and _payload(m).get(
            "type") == "task_done", timeout=90))
        assert done["task_id"] == f"job-{b.name}" and done["outcome"] == "success", done
        if fleet is not None:
            _fleet_saw_it_live(fleet)
        lap("task_done")

        # an e-stop, refused motion while latched, and the reset
        assert _cmd(b, "estop", {"reason": f"portability {b.name}"})["result"]["latched"]
        probe.expect(lambda m: m.topic == T1.state and _payload(m)["mode"] == "estop", 30)
        assert _cmd(b, "task.start")["error"]["code"] == ErrorCode.ESTOP_ACTIVE
        wait_until(lambda: _cmd(b, "reset")["ok"], 30, "reset accepted")
        probe.expect(lambda m: m.topic == T1.state and _payload(m)["mode"] == "idle", 30)
        lap("estop+reset")

        _legacy_alias(b, probe)

        # the broker restarts: the daemon reconnects (a new seq) and answers again
        probe.close()
        b.restart()
        probe = _probe(b)
        wait_until(lambda: _answers(b), 60, f"the daemon answering through {b.name} again")
        again = probe.expect(lambda m: m.topic == T1.status and _payload(m)["state"] == "online"
                             and _payload(m)["seq"] >= 1, timeout=30)
        assert _payload(again)["boot_id"] == boot
        lap("broker restart")

        # kill -9: the broker publishes the Last Will
        d.stop(signal.SIGKILL)
        offline = probe.expect(lambda m: m.topic == T1.status
                               and _payload(m)["state"] == "offline", timeout=30)
        assert _payload(offline)["boot_id"] == boot
        assert _payload(offline)["seq"] == _payload(again)["seq"]  # the will of that connection
        lap("will after kill -9")
        starts = getattr(b, "start_s", None)  # RabbitMQ: its boots (the first in the background)
        print(f"{b.name}: {', '.join(laps)}; {time.monotonic() - t0:.1f} s in all"
              + (f"; broker starts {', '.join(f'{s:.1f} s' for s in starts)}" if starts else ""))
    finally:
        d.stop()
        probe.close()
        if fleet is not None and fleet.proc.poll() is None:
            fleet.proc.kill()


def _fleet_status(b: Any, tmp: Path) -> _Lines | None:
    """`edge-agent fleet status` through this broker (`--mqtt-protocol` where it has no MQTT 5):
    the robot online and idle. On RabbitMQ, which sends no retained message to a wildcard
    filter (rabbitmq-server#8824, docs/INSTALL.md), the view finds a robot only when it
    publishes live: the command is left running (returned) while the task publishes its state."""
    pw = tmp / "operator.pw"
    pw.write_text(MQTT_USERS["operator"] + "\n")
    pw.chmod(0o600)
    cmd = [sys.executable, "-m", "edge_agent.cli", "fleet", "status", "--json", "--host", b.host,
           "--port", str(b.port), "--username", "operator", "--password-file", str(pw),
           "--mqtt-protocol", b.protocol, "--config", str(tmp / "none.toml"),
           "--query-timeout", "15"]  # a loaded CI machine missed the default 3 s (12-07)
    if b.name == "rabbitmq":
        # --watch prints its first view only after the SUBACK (FleetBus.start waits for it):
        # that line is the sign the subscription is in place before the task's first state
        proc = subprocess.Popen([*cmd, "--watch", "--interval", "0.5", "--settle-s", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        view = _Lines(proc)
        first = view.next(30)
        assert first, (proc.poll(), "no first view within 30 s")
        assert isinstance(json.loads(first), list), first
        return view
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
    rows = {r["robot"]: r for r in json.loads(out.stdout)}
    assert rows["dev1"]["online"] is True and rows["dev1"]["mode"] == "idle", rows
    assert rows["dev1"]["model"]["current"]["name"] == "pick-place-policy", rows  # queried
    return None


class _Lines:
    """A running command's stdout lines through a reader thread: `next(timeout)` returns "" when
    the command has ended or said nothing within `timeout` (a silent view cannot hang the test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self._q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True, name="fleet-view-lines").start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._q.put(line)
        self._q.put("")

    def next(self, timeout: float) -> str:
        try:
            return self._q.get(timeout=max(0.0, timeout))
        except queue.Empty:
            return ""


def _fleet_saw_it_live(view: _Lines) -> None:
    """RabbitMQ: the view found the robot by its live state; its presence stays unknown.
    Each refresh is a line within ~0.5 s (no robot is online to query), so the loop is bounded."""
    deadline = time.monotonic() + 30
    rows: dict[str, Any] = {}
    try:
        while "dev1" not in rows and time.monotonic() < deadline:
            line = view.next(deadline - time.monotonic())
            if not line:  # it exited, or said nothing until the deadline
                break
            rows = {r["robot"]: r for r in json.loads(line)}
    finally:
        view.proc.terminate()
        view.proc.wait(timeout=10)  # stdout is the reader thread's; stderr is read here
        err = view.proc.stderr.read() if view.proc.stderr is not None else ""
    assert "dev1" in rows, (rows, view.proc.returncode, err)
    dev1 = rows["dev1"]
    assert dev1["presence"] is None and dev1["online"] is False and dev1["mode"], rows


def _legacy_alias(b: Any, probe: Probe) -> None:
    """A command on the deprecated dotted topic, as each broker treats it."""
    body = json.dumps({"v": 1, "id": f"legacy-{b.name}"})
    if b.name == "nats":
        # NATS maps levels to subjects: it refuses the dotted topic and drops the publisher
        # (why the scheme changed); the daemon never sees it
        other = Probe(b, "operator", MQTT_USERS["operator"], protocol=paho.MQTTv311,
                      client_id="legacy-publisher")
        try:
            assert not paho_failed(other.connect(timeout=20))
            other.client.publish(T1.legacy_cmd("task.cancel"), body, qos=1)
            assert other.disconnected.wait(10), "NATS accepted a '.' inside a topic level"
        finally:
            other.close()
        return
    probe.publish(T1.legacy_cmd("task.cancel"), body)
    reply = probe.expect(lambda m: m.topic.startswith(f"{T1.prefix}/reply/")
                         and _payload(m).get("id") == f"legacy-{b.name}", timeout=15)
    assert _payload(reply)["ok"], _payload(reply)
    # Mosquitto delivers the alias as sent: answered on the alias's reply topic. RabbitMQ turns
    # '.' into '/' on the way: the daemon receives (and answers) the new topic itself.
    want = T1.legacy_reply("task.cancel") if b.name == "mosquitto" else T1.reply("task.cancel")
    assert reply.topic == want


@pytest.mark.parametrize("name", ["nats", "rabbitmq"])
def test_mqtt5_refused_by_a_311_broker_names_the_config_key(name: str, tmp_path: Path,
                                                            rabbit_boot: _Background | None
                                                            ) -> None:
    if name == "nats":
        if NatsMqtt.unavailable():
            pytest.skip(str(NatsMqtt.unavailable()))
        broker: Any = NatsMqtt(tmp_path / "nats", MQTT_USERS)
        broker.start()
    else:
        if rabbit_boot is None:
            pytest.skip(f"RabbitMQ cannot start here: {RabbitMqtt.unavailable()}")
        rabbit_boot.thread.join(120)
        if rabbit_boot.error is not None:
            pytest.skip(f"RabbitMQ cannot start here: {rabbit_boot.error}")
        broker = rabbit_boot.broker
    bridge = MqttBridge(MqttSettings(device_id="dev1", host=broker.host, port=broker.port,
                                     password=MQTT_USERS["dev1"], protocol="5",
                                     reconnect_min_s=0.2, reconnect_max_s=0.5),
                        CommandAPI(lambda: Mode.IDLE))
    bridge.start()
    try:
        wait_until(lambda: "mqtt.protocol" in (bridge.last_error or ""), 20,
                   f"an error naming mqtt.protocol ({bridge.last_error})")
        assert not bridge.connected
        assert '"3.1.1"' in (bridge.last_error or "")
    finally:
        bridge.stop()
        if name == "nats":
            broker.stop()
