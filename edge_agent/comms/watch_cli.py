"""`edge-agent watch`: its arguments and the step from a config file to a broker connection.

    edge-agent watch [--config PATH] [--device ID|+] [--json] [--telemetry] [--replies]
                     [--count N] [--host H] [--port P] [--username U] [--password-file F]
                     [--mqtt-protocol 5|3.1.1]

The broker, TLS and prefix come from the config (the daemon's, by default); `--host` works
without one. A device account may not read its own state (the documented ACL), so an operator
usually watches as another user: `--username` / `$EDGE_AGENT_MQTT_USERNAME`, the password from
`--password-file` or `$EDGE_AGENT_MQTT_PASSWORD` (never on the command line: `ps` shows it).
Exit codes: 0 stopped (Ctrl-C, --count reached), 1 bad config, 2 usage, 3 broker unreachable
or refused.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from edge_agent.comms.broker_args import add_broker_arguments

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any) -> None:
    """Register `watch` on the main parser's subparsers (light: nothing heavy is imported)."""
    p = sub.add_parser(
        "watch", help="follow a device's state, events, reports and presence over MQTT",
        description="Follow one device (or every device with --device +) over MQTT and print "
                    "one line per message: time, device, kind (* = retained) and the important "
                    "fields; a report's Markdown is printed as-is. Ctrl-C stops.")
    p.add_argument("--device", metavar="ID", default=None,
                   help="the device id, or + for all (default: the config's device.id, else +)")
    p.add_argument("--json", action="store_true", dest="json_lines",
                   help="print one JSON object per message (topic, device, kind, retained, "
                        "received, payload) instead of readable lines")
    p.add_argument("--telemetry", action="store_true", help="also print telemetry")
    p.add_argument("--replies", action="store_true", help="also print command replies")
    p.add_argument("--count", type=int, default=None, metavar="N",
                   help="exit after N messages")
    add_broker_arguments(p)  # --config --host --port --username --password-file --mqtt-protocol


def run(a: argparse.Namespace) -> int:
    """Entry point for the `watch` subcommand."""
    from edge_agent.comms.broker_args import BrokerArgsError, broker_target, load_optional_config
    from edge_agent.comms.watch import WatchOptions, run_watch

    if a.count is not None and a.count < 1:
        print("error: --count must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    try:
        cfg = load_optional_config(a)
    except BrokerArgsError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE if exc.usage else EXIT_FAIL
    m = cfg.mqtt if cfg is not None else None
    own_id = cfg.device.id if cfg is not None else None
    device = a.device or own_id or "+"
    if not device or "/" in device or "#" in device or (device != "+" and "+" in device):
        print(f"error: --device {device!r}: a device id or +", file=sys.stderr)
        return EXIT_USAGE
    prefix = m.topic_prefix if m is not None and m.topic_prefix and device == own_id else None
    try:
        target = broker_target(a, cfg, device, prefix)
    except BrokerArgsError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE
    opts = WatchOptions(device=device, prefix=prefix, json_lines=a.json_lines,
                        telemetry=a.telemetry, replies=a.replies, count=a.count)
    return run_watch(target, opts, sys.stdout, sys.stderr)

