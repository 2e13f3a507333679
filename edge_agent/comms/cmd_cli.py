"""`edge-agent cmd NAME [JSON]` and `edge-agent status`: find the daemon, send, print the reply.

Which daemon, first that applies (the way `docker` takes `-H`, then `$DOCKER_HOST`, then its
well-known socket):

1. `--config PATH`: that daemon's control socket (`<state_dir>/control.sock`), else its broker.
2. `--device ID`: the daemon that published itself as ID in a runtime directory
   (`edge_agent/comms/runtime_dir.py`: `$RUNTIME_DIRECTORY`, `$XDG_RUNTIME_DIR/edge-agent`,
   `/run/edge-agent`, ...).
3. `$EDGE_AGENT_CONFIG`: as `--config`.
4. The runtime directories: with one running daemon, that one; with several, they are named and
   `--device` picks one (exit 2).
5. `/etc/edge-agent/edge-agent.toml`, the production install's config, when it exists.

The reply is printed for a person on a terminal (edge_agent/console_format.py; colour unless
NO_COLOR) and as JSON when stdout is not a terminal or with `--json`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.errors import ConfigError, EdgeAgentError

if TYPE_CHECKING:
    from edge_agent.comms.client import MqttTarget

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NO_REPLY = 0, 1, 2, 3
DEFAULT_CONFIG = "/etc/edge-agent/edge-agent.toml"
COMMANDS = ("task.start, task.cancel, resume, reset, estop, manual.enter, manual.jog, "
            "manual.exit, status, model.update, model.shadow, failure.inject, journal.label, "
            "record.start, record.stop")


def add_target_options(p: argparse.ArgumentParser) -> None:
    """--config, --device, --timeout, --json|--human: which daemon, and how to print."""
    p.add_argument("--config", metavar="PATH", default=None,
                   help="the daemon's config, to find its socket and broker (default: "
                        "$EDGE_AGENT_CONFIG, else the one daemon running here, else "
                        f"{DEFAULT_CONFIG}; see below)")
    p.add_argument("--device", metavar="ID", default=None,
                   help="which daemon, when several run on this machine (their device ids)")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S",
                   help="seconds to wait for the reply (default: %(default)s)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help="print the reply as JSON (the default when stdout is not a terminal)")
    out.add_argument("--human", action="store_true",
                     help="print the reply for a person even when stdout is not a terminal")


def add_parsers(sub: Any) -> None:
    """Register `cmd` and `status` on the main parser's subparsers."""
    cmd = sub.add_parser(
        "cmd", help="send a command to the running daemon and print the reply",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Send one command to the running daemon (over its local control socket when "
                    "it answers, else MQTT) and print the reply.\nCommands: " + COMMANDS,
        epilog=__doc__.split("\n\n", 1)[1].split("\n\nThe reply")[0])
    cmd.add_argument("name", metavar="NAME", help="the command, e.g. status, estop, reset")
    cmd.add_argument("args", metavar="JSON", nargs="?", default="{}",
                     help="the command's arguments as a JSON object, e.g. '{\"task\": "
                          "\"pick_place\"}' (the id is added for you)")
    add_target_options(cmd)
    st = sub.add_parser("status", help="the running daemon's state, like `systemctl status` "
                                       "(= `cmd status`)",
                        description="Print the running daemon's status: mode, stop and cause, "
                                    "degraded modes, link, policy, loop figures, uptime.")
    add_target_options(st)


@dataclass(frozen=True)
class Target:
    """Where to send: a control socket, a broker, or both (the socket first)."""

    socket_path: Path | None
    mqtt: MqttTarget | None


class _Usage(Exception):
    """Which daemon is unclear: exit 2 with the message."""


class _BadConfig(Exception):
    """The config named cannot be read: exit 1 with the message."""


def run(a: argparse.Namespace) -> int:
    """Entry point for `cmd` and `status`."""
    name = "status" if a.command == "status" else a.name
    raw = "{}" if a.command == "status" else a.args
    try:
        args: Any = json.loads(raw)
    except json.JSONDecodeError as exc:
        print(f"error: JSON arguments: {exc.msg} at column {exc.colno}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(args, dict):
        print("error: JSON arguments must be an object, e.g. '{\"task\": \"pick_place\"}'",
              file=sys.stderr)
        return EXIT_USAGE
    if a.timeout <= 0:
        print("error: --timeout must be > 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        target = resolve(a.config, a.device)
    except _Usage as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except _BadConfig as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_FAIL
    from edge_agent.comms.client import send_command

    try:
        reply = send_command(name, args, socket_path=target.socket_path, mqtt=target.mqtt,
                             timeout=a.timeout)
    except (EdgeAgentError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_NO_REPLY
    tty = sys.stdout.isatty()
    if a.json or not (tty or a.human):
        print(json.dumps(reply, indent=2 if tty else None))
    else:
        from edge_agent.console_format import format_reply, use_color

        print(format_reply(name, reply, color=use_color(sys.stdout)))
    return EXIT_OK if reply.get("ok") else EXIT_FAIL


def resolve(config: str | None, device: str | None) -> Target:
    """The daemon to talk to (module docstring); raises _Usage or _BadConfig."""
    if config is not None:
        return _from_config(config)
    from edge_agent.comms import runtime_dir

    if device is not None:
        found = runtime_dir.discover(device)
        if found and found[0].alive:
            return Target(found[0].link, None)
        env = os.environ.get("EDGE_AGENT_CONFIG")
        if env:
            return _from_config(env)
        where = ", ".join(str(d) for d in runtime_dir.candidate_dirs())
        why = "its socket does not answer (stopped?)" if found else f"not published in {where}"
        raise _Usage(f"no running daemon {device!r}: {why}; give --config PATH to reach it "
                     "over MQTT")
    env = os.environ.get("EDGE_AGENT_CONFIG")
    if env:
        return _from_config(env)
    found = runtime_dir.discover()
    alive = [f for f in found if f.alive]
    if len(alive) == 1:
        return Target(alive[0].link, None)
    if len(alive) > 1:
        names = ", ".join(f.device for f in alive)
        raise _Usage(f"several daemons run here ({names}): name one with --device ID")
    if os.path.exists(DEFAULT_CONFIG):
        return _from_config(DEFAULT_CONFIG)
    where = ", ".join(str(d) for d in runtime_dir.candidate_dirs())
    stale = "".join(f"; {f.link} is stale (its daemon stopped)" for f in found)
    raise _Usage(f"no running edge-agent daemon found (looked in {where}{stale}) and no "
                 f"{DEFAULT_CONFIG}: start one (./scripts/run-sim.sh) or give --config PATH")


def _from_config(path: str) -> Target:
    from edge_agent.config import load_config

    try:
        cfg = load_config(path, sim=True)  # the daemon may run with --sim: no link.port
    except ConfigError as exc:
        raise _BadConfig(str(exc) if exc.source else f"{path}: {exc}") from None
    from edge_agent.comms.client import MqttTarget
    from edge_agent.comms.mqtt_common import TlsOptions

    m = cfg.mqtt
    tls = None
    if m.tls.enabled:
        tls = TlsOptions(ca_file=_str(m.tls.ca_file), cert_file=_str(m.tls.cert_file),
                         key_file=_str(m.tls.key_file), server_hostname_check=not m.tls.insecure)
    mqtt = MqttTarget(device_id=cfg.device.id, host=m.host, port=m.port, username=m.username,
                      password=m.password.reveal() if m.password else None, tls=tls,
                      topic_prefix=m.topic_prefix, protocol=m.protocol)
    return Target(cfg.state_dir / "control.sock", mqtt)


def _str(p: object) -> str | None:
    return None if p is None else str(p)
