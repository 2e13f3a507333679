"""A fleet on this machine for tests and benches: private Mosquitto broker(s), ONE rig process
serving N ptys (`python -m hil.rig --ptys N`) and N daemons (`edge-agent run`, each its own
device id, state dir and pty, control loops in the no-spin fleet profile).

    with Fleet(tmp, n=5, brokers=1) as fleet:        # brokers=3: a bridged Mosquitto cluster
        fleet.start(extra_sets=[...])                # waits until every daemon's link is up
        fleet.operator_args(node=0)                  # `--host/--port/--username/--password-file`

The cluster: node 0 bridges to nodes 1 and 2 (`topic edge/# both 1`), a star, so no message
loops; daemon i connects to node i % brokers. Every node has the password file and the
documented ACL (docs/mosquitto/acl) plus a `bridge` account that may read and write edge/#.

`kind="nats"`: a NATS cluster instead (nats-server, every node routed to every other, JetStream
clustered, the MQTT gateway on each node; MQTT 3.1.1, so the daemons get
`mqtt.protocol="3.1.1"` and the operator tools `--mqtt-protocol 3.1.1`). Users with passwords,
no per-topic permissions (not the documented ACL).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion

from edge_agent.comms.mqtt_common import Topics
from hil.daemon_proc import with_parent

ROOT = Path(__file__).resolve().parents[1]
MOSQUITTO = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
MOSQUITTO_PASSWD = shutil.which("mosquitto_passwd") or "/usr/bin/mosquitto_passwd"
NATS_SERVER = shutil.which("nats-server") or "/usr/bin/nats-server"
KINDS = ("mosquitto", "nats")
OPERATOR = ("operator", "operator-pw")
BRIDGE = ("bridge", "bridge-pw")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait(pred: Any, timeout: float, what: str, interval: float = 0.05) -> None:
    end = time.monotonic() + timeout
    while True:
        try:
            if pred():
                return
        except (OSError, ValueError, KeyError):
            pass
        if time.monotonic() > end:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def fleet_sets(tick_us: int = 10000, rate_hz: float = 50.0) -> list[str]:
    """The no-spin fleet profile of hil/bench_fleet_estop.py."""
    return ["control.no_spin=true", f"control.rate_hz={rate_hz:g}", "control.decision_hz=10",
            f"link.status_period_us={tick_us}", "link.deadman_ms=200",
            "link.hello_timeout_s=10", "mqtt.telemetry_hz=0", "log.level=warning"]


class Fleet:
    """See the module doc. Every process it starts is stopped by `close()` (or `with`)."""

    def __init__(self, tmp: Path, n: int, brokers: int = 1, tick_us: int = 10000,
                 rate_hz: float = 50.0, kind: str = "mosquitto") -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        self.tmp, self.n, self.tick_us, self.rate_hz = Path(tmp), n, tick_us, rate_hz
        self.kind = kind
        self.protocol = "3.1.1" if kind == "nats" else "5"
        self.devices = [f"robot{i:02d}" for i in range(n)]
        self.users = {d: f"{d}-pw" for d in self.devices} | dict([OPERATOR, BRIDGE])
        self.ports = [free_port() for _ in range(brokers)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.brokers: list[subprocess.Popen[bytes]] = []
        self.daemons: list[subprocess.Popen[bytes]] = []
        self.rig: subprocess.Popen[bytes] | None = None
        self.ptys: list[str] = []

    def __enter__(self) -> Fleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- brokers ---------------------------------------------------------------------------
    def start_brokers(self) -> None:
        if self.kind == "nats":
            self._start_nats()
        else:
            self._start_mosquittos()
        for port in self.ports:
            wait(lambda p=port: socket.create_connection(("127.0.0.1", p), 0.5).close() is None,
                 20, f"{self.kind} on {port}")
        if len(self.ports) > 1 or self.kind == "nats":
            self._wait_bridges()

    def _start_nats(self) -> None:
        routes = [free_port() for _ in self.ports]
        users = ", ".join(f"{{user: {json.dumps(u)}, password: {json.dumps(p)}}}"
                          for u, p in self.users.items())
        for node, port in enumerate(self.ports):
            lines = [f'server_name: "fleet-n{node}"', f'listen: "127.0.0.1:{free_port()}"',
                     f'jetstream {{ store_dir: "{self.tmp / f"js-{node}"}", '
                     "max_memory_store: 64MB, max_file_store: 256MB }",
                     f'mqtt {{ listen: "127.0.0.1:{port}" }}',
                     f"authorization {{ users: [ {users} ] }}"]
            if len(self.ports) > 1:
                others = ", ".join(f"nats://127.0.0.1:{r}" for i, r in enumerate(routes)
                                   if i != node)
                lines.append(f'cluster {{ name: "edge-fleet", listen: "127.0.0.1:{routes[node]}",'
                             f" routes: [ {others} ] }}")
            self._broker(NATS_SERVER, f"nats-{node}", lines)

    def _start_mosquittos(self) -> None:
        passwd = self.tmp / "passwd"
        for i, (user, pw) in enumerate(self.users.items()):
            subprocess.run([MOSQUITTO_PASSWD, "-b", *(["-c"] if i == 0 else []), str(passwd),
                            user, pw], check=True, capture_output=True)
        os.chmod(passwd, 0o600)
        acl = self.tmp / "acl"
        acl.write_text((ROOT / "docs" / "mosquitto" / "acl").read_text()
                       + "\nuser bridge\ntopic readwrite edge/#\n")
        os.chmod(acl, 0o600)
        for node, port in enumerate(self.ports):
            lines = [f"listener {port} 127.0.0.1", "allow_anonymous false",
                     f"password_file {passwd}", f"acl_file {acl}", "set_tcp_nodelay true",
                     "persistence false", "max_queued_messages 10000",
                     *(["user root"] if os.geteuid() == 0 else [])]
            if node == 0:
                for peer, peer_port in enumerate(self.ports[1:], start=1):
                    lines += [f"connection node0-to-node{peer}",
                              f"address 127.0.0.1:{peer_port}", f"remote_username {BRIDGE[0]}",
                              f"remote_password {BRIDGE[1]}", f"remote_clientid bridge-0-{peer}",
                              "local_username bridge", "topic edge/# both 1",
                              "cleansession true", "try_private true",
                              "bridge_protocol_version mqttv311"]
            self._broker(MOSQUITTO, f"mosquitto-{node}", lines)

    def _broker(self, binary: str, name: str, conf_lines: list[str]) -> None:
        """Write `name`.conf, start `binary -c` on it (log: `name`.log)."""
        conf = self.tmp / f"{name}.conf"
        conf.write_text("\n".join(conf_lines) + "\n")
        log = open(self.tmp / f"{name}.log", "wb")  # noqa: SIM115 - the child's
        proc = subprocess.Popen([binary, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT)
        self.brokers.append(proc)
        self.procs.append(proc)

    def _wait_bridges(self) -> None:
        """Until a message published on each node reaches every other node (NATS: until its
        JetStream cluster serves MQTT at all)."""
        clients: list[paho.Client] = []

        def connect_all() -> bool:
            while len(clients) < len(self.ports):
                clients.append(self.client(len(clients), f"bridge-check-{len(clients)}"))
            return True

        wait(connect_all, 60, f"MQTT on every {self.kind} node", interval=0.5)
        got: dict[int, set[str]] = {i: set() for i in range(len(clients))}
        for i, c in enumerate(clients):
            c.on_message = lambda c, u, m, i=i: got[i].add(m.payload.decode())
            c.subscribe("edge/bridge-check/+", 1)
        time.sleep(0.3)

        def all_seen() -> bool:
            for i, c in enumerate(clients):
                if not c.is_connected():
                    continue  # NATS refuses CONNECTs until its MQTT streams exist; paho retries
                c.subscribe("edge/bridge-check/+", 1)  # again: a reconnect lost the last one
                c.publish(f"edge/bridge-check/{i}", str(i), qos=1)
            time.sleep(0.2)
            return all(len(s) == len(clients) for s in got.values())

        wait(all_seen, 60, "the broker bridges", interval=0.3)
        for c in clients:
            c.loop_stop()
            c.disconnect()

    def client(self, node: int, client_id: str) -> paho.Client:
        """A started operator client (MQTT 5, 3.1.1 on NATS; TCP_NODELAY) on `node`."""
        proto = paho.MQTTv311 if self.protocol == "3.1.1" else paho.MQTTv5
        c = paho.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=proto)
        c.username_pw_set(*OPERATOR)
        c.on_socket_open = lambda c, u, s: s.setsockopt(socket.IPPROTO_TCP,
                                                        socket.TCP_NODELAY, 1)
        c.connect("127.0.0.1", self.ports[node])
        c.loop_start()
        return c

    def operator_args(self, node: int = 0) -> list[str]:
        """The `edge-agent fleet …` broker arguments for the operator account on `node`."""
        pw = self.tmp / "operator.pw"
        pw.write_text(OPERATOR[1] + "\n")
        os.chmod(pw, 0o600)
        return ["--host", "127.0.0.1", "--port", str(self.ports[node]), "--username",
                OPERATOR[0], "--password-file", str(pw), "--mqtt-protocol", self.protocol]

    # -- rig and daemons -------------------------------------------------------------------
    def start_rig(self, fifo: int = 0) -> None:
        cmd = [sys.executable, "-m", "hil.rig", "--robot",
               str(ROOT / "configs" / "robot" / "edge-arm-4.toml"), "--ptys", str(self.n),
               "--tick-us", str(self.tick_us), "--control-socket", str(self.tmp / "rig.sock")]
        pre = None
        if fifo > 0:
            def pre() -> None:
                with contextlib.suppress(OSError):
                    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(fifo))
        log = open(self.tmp / "rig.log", "wb")  # noqa: SIM115 - handed to the child
        self.rig = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, cwd=ROOT,
                                    preexec_fn=pre)
        self.procs.append(self.rig)
        assert self.rig.stdout is not None
        while len(self.ptys) < self.n:
            line = self.rig.stdout.readline().decode()
            if not line:
                raise RuntimeError(f"the rig exited early; see {self.tmp / 'rig.log'}")
            if line.startswith("PTY "):
                self.ptys.append(line[4:].strip())

    def start_daemons(self, extra_sets: list[str], batch: int = 3,
                      timeout_s: float = 240.0) -> float:
        """Start the daemons in batches; wait until every one publishes link_up; seconds."""
        seen: dict[str, dict[str, Any]] = {}
        watcher = self.client(0, "fleet-proc-watch")
        watcher.on_message = lambda c, u, m: seen.__setitem__(m.topic.split("/")[1],
                                                                json.loads(m.payload))
        watcher.subscribe(Topics("edge/+").state, 1)
        t0 = time.monotonic()
        try:
            for i, (d, pty) in enumerate(zip(self.devices, self.ptys, strict=True)):
                state = self.tmp / d
                state.mkdir(exist_ok=True)
                sets = [f"state_dir={state}", f"device.id={d}",
                        f"mqtt.port={self.ports[i % len(self.ports)]}",
                        f'mqtt.password="{d}-pw"', f'mqtt.protocol="{self.protocol}"',
                        f"link.port={pty}",
                        *fleet_sets(self.tick_us, self.rate_hz), *extra_sets]
                cmd = [sys.executable, "-m", "edge_agent.cli", "run", "--config",
                       str(ROOT / "configs" / "sim.toml")]
                for s in sets:
                    cmd += ["--set", s]
                log = open(self.tmp / f"{d}.log", "wb")  # noqa: SIM115 - the child's
                proc = subprocess.Popen(with_parent(cmd), stdout=log, stderr=subprocess.STDOUT,
                                        cwd=ROOT, start_new_session=True)
                self.daemons.append(proc)
                self.procs.append(proc)
                if (i + 1) % batch == 0 or i + 1 == self.n:
                    k = i + 1
                    wait(lambda k=k: sum(bool(s.get("link_up")) for s in seen.values()) >= k,
                         timeout_s, f"{k} daemons up (logs in {self.tmp})", interval=0.1)
        finally:
            watcher.loop_stop()
            watcher.disconnect()
        return time.monotonic() - t0

    def close(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(p.pid, 15) if p in self.daemons else p.terminate()
        for p in reversed(self.procs):
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        self.procs.clear()
