"""Test helper: a throw-away PKI (openssl) and the shipped Mosquitto config with its TLS listener.

`make_pki(dir)` writes a CA and a server certificate for 127.0.0.1; `shipped_tls_broker(tmp)`
runs docs/mosquitto/mosquitto.conf + acl on a private broker: plain on `broker.port`, TLS on
the returned port, with that PKI.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from conftest import MQTT_USERS
from mosquitto import Mosquitto, free_port, shipped_config

EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def openssl(*args: str, cwd: Path) -> None:
    """Run `openssl ARGS` in `cwd`; fail the test on an error."""
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_pki(d: Path) -> None:
    """A throw-away CA and a server certificate for 127.0.0.1 (EC keys: fast)."""
    d.mkdir(parents=True, exist_ok=True)
    openssl("req", "-x509", *EC_KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2",
            "-subj", "/CN=edge-test-ca", cwd=d)
    openssl("req", *EC_KEY, "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=localhost", cwd=d)
    (d / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext", cwd=d)


@contextlib.contextmanager
def shipped_tls_broker(tmp_path: Path) -> Iterator[tuple[Mosquitto, int, Path]]:
    """(broker, TLS port, PKI dir): the shipped config running, stopped after the block."""
    pki = tmp_path / "certs"
    make_pki(pki)
    broker = Mosquitto(tmp_path / "mosquitto", MQTT_USERS)
    tls_port = free_port()
    broker.use_config(shipped_config(broker, tls_port, pki))
    broker.start()
    try:
        yield broker, tls_port, pki
    finally:
        broker.stop()
