"""`edge-agent watch`: its arguments and the step from a config file to a broker connection.

    edge-agent watch [--config PATH] [--device ID|+] [--json] [--telemetry] [--replies]
                     [--count N] [--host H] [--port P] [--username U] [--password-file F]

The broker, TLS and prefix come from the config (the daemon's, by default); `--host` works
without one. A device account may not read its own state (the documented ACL), so an operator
usually watches as another user: `--username` / `$EDGE_AGENT_MQTT_USERNAME`, the password from
`--password-file` or `$EDGE_AGENT_MQTT_PASSWORD` (never on the command line: `ps` shows it).
Exit codes: 0 stopped (Ctrl-C, --count reached), 1 bad config, 2 usage, 3 broker unreachable
or refused.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
DEFAULT_CONFIG = "/etc/edge-agent/edge-agent.toml"


def add_parser(sub: Any) -> None:
    """Register `watch` on the main parser's subparsers (light: nothing heavy is imported)."""
    p = sub.add_parser(
        "watch", help="follow a device's state, events, reports and presence over MQTT",
        description="Follow one device (or every device with --device +) over MQTT and print "
                    "one line per message: time, device, kind (* = retained) and the important "
                    "fields; a report's Markdown is printed as-is. Ctrl-C stops.")
    p.add_argument("--config", metavar="PATH",
                   default=os.environ.get("EDGE_AGENT_CONFIG", DEFAULT_CONFIG),
                   help="a config naming the broker (default: $EDGE_AGENT_CONFIG, else "
                        "%(default)s); optional with --host")
    p.add_argument("--device", metavar="ID", default=None,
                   help="the device id, or + for all (default: the config's device.id, else +)")
    p.add_argument("--json", action="store_true", dest="json_lines",
                   help="print one JSON object per message (topic, device, kind, retained, "
                        "received, payload) instead of readable lines")
    p.add_argument("--telemetry", action="store_true", help="also print telemetry")
    p.add_argument("--replies", action="store_true", help="also print command replies")
    p.add_argument("--count", type=int, default=None, metavar="N",
                   help="exit after N messages")
    p.add_argument("--host", default=None, help="broker host (overrides the config)")
    p.add_argument("--port", type=int, default=None, help="broker port (overrides the config)")
    p.add_argument("--username", default=os.environ.get("EDGE_AGENT_MQTT_USERNAME"),
                   help="MQTT user (default: $EDGE_AGENT_MQTT_USERNAME, else the config's)")
    p.add_argument("--password-file", default=None, metavar="PATH",
                   help="file holding the password (default: $EDGE_AGENT_MQTT_PASSWORD, else "
                        "the config's when the user is the config's)")


def run(a: argparse.Namespace) -> int:
    """Entry point for the `watch` subcommand."""
    from edge_agent.comms.client import MqttTarget
    from edge_agent.comms.mqtt_common import TlsOptions
    from edge_agent.comms.watch import WatchOptions, run_watch
    from edge_agent.config import load_config
    from edge_agent.errors import ConfigError

    if a.count is not None and a.count < 1:
        print("error: --count must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    cfg = None
    if a.host is None or Path(a.config).exists():
        try:
            cfg = load_config(a.config, sim=True)  # no link.port needed to watch
        except ConfigError as exc:
            print(f"error: {exc}" if exc.source else f"error: {a.config}: {exc}",
                  file=sys.stderr)
            return EXIT_FAIL
    m = cfg.mqtt if cfg is not None else None
    own_id = cfg.device.id if cfg is not None else None
    device = a.device or own_id or "+"
    if not device or "/" in device or "#" in device or (device != "+" and "+" in device):
        print(f"error: --device {device!r}: a device id or +", file=sys.stderr)
        return EXIT_USAGE
    prefix = m.topic_prefix if m is not None and m.topic_prefix and device == own_id else None
    config_user = (m.username or own_id) if m is not None else None
    username = a.username or config_user
    password: str | None = None
    if a.password_file:
        try:
            password = Path(a.password_file).read_text(encoding="utf-8").splitlines()[0]
        except (OSError, IndexError) as exc:
            print(f"error: --password-file {a.password_file}: {exc}", file=sys.stderr)
            return EXIT_USAGE
    elif os.environ.get("EDGE_AGENT_MQTT_PASSWORD"):
        password = os.environ["EDGE_AGENT_MQTT_PASSWORD"]
    elif m is not None and m.password is not None and username == config_user:
        password = m.password.reveal()
    tls = None
    if m is not None and m.tls.enabled:
        tls = TlsOptions(ca_file=_str(m.tls.ca_file), cert_file=_str(m.tls.cert_file),
                         key_file=_str(m.tls.key_file), server_hostname_check=not m.tls.insecure)
    target = MqttTarget(device_id=device, host=a.host or (m.host if m else "127.0.0.1"),
                        port=a.port or (m.port if m else 1883), username=username,
                        password=password, tls=tls, topic_prefix=prefix,
                        protocol=m.protocol if m else "5")
    opts = WatchOptions(device=device, prefix=prefix, json_lines=a.json_lines,
                        telemetry=a.telemetry, replies=a.replies, count=a.count)
    return run_watch(target, opts, sys.stdout, sys.stderr)


def _str(p: object) -> str | None:
    return None if p is None else str(p)
