"""Test helpers: private NATS (with its MQTT gateway) and RabbitMQ (with its MQTT plugin) brokers.

Each writes its own config into a temp dir, listens on free 127.0.0.1 ports, has users with
passwords, and offers what tests/mosquitto.py's `Mosquitto` does (`host`, `port`, `start()`,
`stop()`, `restart()` on the same port, `log()`), so `Probe` and `DaemonProc` take either.

NATS: MQTT needs JetStream and a `server_name`; retained messages and sessions live in the
JetStream store (kept across `restart()`). Only MQTT 3.1.1.
RabbitMQ: a node of its own (RABBITMQ_NODENAME, ports, mnesia, logs, enabled-plugins file in
the temp dir; HOME there too, for its Erlang cookie), `rabbitmq_mqtt` enabled by the
enabled-plugins file (what `rabbitmq-plugins --offline enable rabbitmq_mqtt` writes), users
from a definitions file. Started with /usr/lib/rabbitmq/bin/rabbitmq-server directly: the
/usr/sbin wrapper switches to the `rabbitmq` user when run as root, which cannot write the temp
dir. MQTT 3.1.1 only before RabbitMQ 3.13. `unavailable()` says why one cannot start here.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path

from mosquitto import free_port

NATS_SERVER = shutil.which("nats-server")
NICE = shutil.which("nice")
_RABBIT_LIB = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")
RABBITMQ_SERVER = str(_RABBIT_LIB) if _RABBIT_LIB.exists() else shutil.which("rabbitmq-server")


def _wait_port(proc: subprocess.Popen[bytes], host: str, port: int, timeout: float,
               what: str, log: Path) -> None:
    end = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited ({proc.returncode}):\n{_tail(log)}")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        if time.monotonic() > end:
            raise RuntimeError(f"{what} did not listen on {port} in {timeout:g} s:\n{_tail(log)}")
        time.sleep(0.05)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except FileNotFoundError:
        return ""


def _end(proc: subprocess.Popen[bytes] | None, timeout: float = 15.0) -> None:
    """SIGTERM the process group (it was started in a session of its own), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout)


class _PrivateBroker:
    """What both brokers share: a work dir, a free MQTT port, a process group, a log."""

    host = "127.0.0.1"
    name = ""
    protocol = "3.1.1"
    stop_timeout = 15.0

    def __init__(self, workdir: Path, log_name: str) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_path = self.dir / log_name

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        _end(proc, timeout=self.stop_timeout)

    def log(self) -> str:
        return _tail(self._log_path, 200)


class NatsMqtt(_PrivateBroker):
    """A private nats-server with JetStream and the MQTT gateway (MQTT 3.1.1)."""

    name = "nats"

    def __init__(self, workdir: Path, users: Mapping[str, str]) -> None:
        super().__init__(workdir, "nats.log")
        self.client_port = free_port()
        users_conf = ", ".join(f"{{user: {json.dumps(u)}, password: {json.dumps(p)}}}"
                               for u, p in users.items())
        self.config = self.dir / "nats.conf"
        self.config.write_text("\n".join([
            f'server_name: "edge-test-{self.port}"',
            f'listen: "{self.host}:{self.client_port}"',
            f'jetstream {{ store_dir: "{self.dir / "js"}", max_memory_store: 64MB, '
            "max_file_store: 256MB }",
            f'mqtt {{ listen: "{self.host}:{self.port}" }}',
            f"authorization {{ users: [ {users_conf} ] }}",
        ]) + "\n")

    @staticmethod
    def unavailable() -> str | None:
        return None if NATS_SERVER else "nats-server is not installed"

    def version(self) -> str:
        assert NATS_SERVER
        out = subprocess.run([NATS_SERVER, "--version"], capture_output=True, text=True,
                             check=False).stdout
        return out.strip().removeprefix("nats-server: ")

    def start(self, timeout: float = 20.0) -> None:
        if self._proc is not None:
            return
        assert NATS_SERVER
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen([NATS_SERVER, "-c", str(self.config)], stdout=log,
                                          stderr=subprocess.STDOUT, start_new_session=True)
        _wait_port(self._proc, self.host, self.port, timeout, "nats-server", self._log_path)

    def restart(self) -> None:
        self.stop()
        self.start()


def _password_hash(password: str) -> str:
    """RabbitMQ's rabbit_password_hashing_sha256: base64(salt + sha256(salt + password))."""
    salt = os.urandom(4)
    return base64.b64encode(salt + hashlib.sha256(salt + password.encode()).digest()).decode()


class RabbitMqtt(_PrivateBroker):
    """A private RabbitMQ node with the MQTT plugin (MQTT 3.1.1 before RabbitMQ 3.13)."""

    name = "rabbitmq"
    stop_timeout = 30.0

    def __init__(self, workdir: Path, users: Mapping[str, str]) -> None:
        super().__init__(workdir, "rabbitmq.out")
        self.amqp_port = free_port()
        self.dist_port = free_port()
        defs = {
            "users": [{"name": u, "password_hash": _password_hash(p), "tags": "",
                       "hashing_algorithm": "rabbit_password_hashing_sha256"}
                      for u, p in users.items()],
            "vhosts": [{"name": "/"}],
            "permissions": [{"user": u, "vhost": "/", "configure": ".*", "write": ".*",
                             "read": ".*"} for u in users],
        }
        (self.dir / "definitions.json").write_text(json.dumps(defs))
        (self.dir / "rabbitmq.conf").write_text("\n".join([
            f"listeners.tcp.default = {self.host}:{self.amqp_port}",
            f"mqtt.listeners.tcp.default = {self.host}:{self.port}",
            "mqtt.allow_anonymous = false",
            f"load_definitions = {self.dir / 'definitions.json'}",
            "log.console = true",
            "log.console.level = warning",
            "log.file = false",
        ]) + "\n")
        (self.dir / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
        self.env = {
            **os.environ, "HOME": str(self.dir),
            "RABBITMQ_NODENAME": f"edgetest{self.port}@localhost",
            "RABBITMQ_NODE_PORT": str(self.amqp_port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.dir / "plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
        }
        self.start_s: list[float] = []  # how long each start took (reported by the tests)

    @staticmethod
    def unavailable() -> str | None:
        if not RABBITMQ_SERVER:
            return "rabbitmq-server is not installed"
        if not shutil.which("erl"):
            return "Erlang (erl) is not installed"
        if str(_RABBIT_LIB) != RABBITMQ_SERVER and os.geteuid() == 0:
            return (f"{RABBITMQ_SERVER} switches to the rabbitmq user when run as root and "
                    "/usr/lib/rabbitmq/bin/rabbitmq-server is absent")
        return None

    def version(self) -> str:
        found = sorted(Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*"))
        return found[-1].name.removeprefix("rabbitmq_server-") if found else "?"

    def start(self, timeout: float = 120.0, niceness: int = 15) -> None:
        if self._proc is not None:
            return
        assert RABBITMQ_SERVER
        t0 = time.monotonic()
        # niced by default: its Erlang boot is CPU-heavy (~10 s of a core) and runs beside the
        # other brokers' daemons, whose simulated robots must not be starved of their ticks
        nice = [NICE, "-n", str(niceness)] if NICE and niceness else []
        with open(self._log_path, "ab") as log:
            self._proc = subprocess.Popen([*nice, RABBITMQ_SERVER], stdout=log,
                                          stderr=subprocess.STDOUT, env=self.env, cwd=self.dir,
                                          start_new_session=True)
        _wait_port(self._proc, self.host, self.port, timeout, "rabbitmq-server", self._log_path)
        self.start_s.append(time.monotonic() - t0)

    def restart(self) -> None:
        self.stop()
        self.start(niceness=0)  # in the foreground: nothing else of the test runs meanwhile


def mosquitto_version() -> str:
    from mosquitto import MOSQUITTO

    out = subprocess.run([MOSQUITTO, "-h"], capture_output=True, text=True, check=False).stdout
    found = re.search(r"mosquitto version (\S+)", out)
    return found.group(1) if found else "?"
