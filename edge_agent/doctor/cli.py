"""`edge-agent doctor [--config PATH] [--json]`: run every check, print findings, exit = worst."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge_agent.doctor import Finding, Level, error, worst

if TYPE_CHECKING:
    from edge_agent.config import Config

DEFAULT_CONFIG = "/etc/edge-agent/edge-agent.toml"
_EPILOG = """\
exit codes: 0 every check ok, 1 a warning (the daemon runs, worse than it should),
            2 an error (the daemon will not work: fix it first)
Run it as the service user to see what the service will get:
  sudo -u edge-agent /opt/edge-agent/.venv/bin/edge-agent doctor
"""


def add_parser(sub: Any) -> None:
    """Register `doctor` on the main parser's subparsers."""
    p = sub.add_parser(
        "doctor", help="check what the daemon needs on this machine, and how to fix each miss",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        description="Check the config, the serial tty, real-time scheduling and memory locking, "
                    "the state directory and its filesystem, the broker login, TLS and ACL, the "
                    "model against its card, the providers onnxruntime really gives, and the "
                    "clock. Each miss comes with its fix.")
    p.add_argument("--config", metavar="PATH",
                   default=os.environ.get("EDGE_AGENT_CONFIG", DEFAULT_CONFIG),
                   help="the daemon's config (default: $EDGE_AGENT_CONFIG, else %(default)s)")
    p.add_argument("--sim", action="store_true",
                   help="check as `run --sim` would (no tty: the simulated robot brings its own)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key as `run --set` does (repeatable)")
    p.add_argument("--unit", metavar="PATH", default=None,
                   help="the systemd unit to check (default: the installed edge-agent.service; "
                        "e.g. systemd/edge-agent.service before installing it)")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--timeout", type=float, default=5.0, metavar="S",
                   help="seconds to wait for the broker at each step (default: %(default)s)")


def checks(cfg: Config, *, sim: bool, timeout: float,
           unit: str | None = None) -> list[Callable[[], list[Finding]]]:
    from edge_agent.doctor import broker, host, model
    from edge_agent.doctor import unit as unit_check

    out: list[Callable[[], list[Finding]]] = []
    if not sim:
        out.append(lambda: host.check_tty(cfg))
    out += [lambda: host.check_realtime(cfg), lambda: unit_check.check_unit(cfg, unit),
            host.check_memory,
            lambda: host.check_state_dir(cfg), lambda: broker.check_tls_files(cfg),
            lambda: broker.check_broker(cfg, timeout), lambda: model.check_model(cfg),
            lambda: model.check_providers(cfg), host.check_clock]
    return out


def run(a: argparse.Namespace) -> int:
    """Entry point for `doctor`."""
    from edge_agent.config import load_config
    from edge_agent.errors import ConfigError
    from edge_agent.logsetup import configure_logging

    # The parts' info lines (model_installed...) are noise here; stdout carries the findings.
    configure_logging("warning", "console", stream=sys.stderr)
    findings: list[Finding] = []
    try:
        cfg = load_config(a.config, a.set, sim=a.sim)
    except ConfigError as exc:
        msg = str(exc) if exc.source else f"{a.config}: {exc}"
        findings.append(error("config", msg, "fix that key (`edge-agent check-config PATH` "
                                             "checks the file alone)"))
        return _report(a, findings)
    findings.append(Finding("config", Level.OK, f"{a.config}: valid (device {cfg.device.id}, "
                                                f"hash {cfg.hash})"))
    findings += [Finding("config", Level.WARN, w, "see configs/sim.toml for the key")
                 for w in cfg.warnings]
    for check in checks(cfg, sim=a.sim, timeout=a.timeout, unit=a.unit):
        try:
            findings += check()
        except Exception as exc:  # a check that crashes is a finding, never a traceback
            findings.append(error("doctor", f"a check failed unexpectedly: "
                                            f"{type(exc).__name__}: {exc}", "please report it"))
    return _report(a, findings)


_MARK = {Level.OK: ("ok", "\x1b[32m"), Level.WARN: ("warn", "\x1b[33m"),
         Level.ERROR: ("ERROR", "\x1b[31m")}


def _report(a: argparse.Namespace, findings: list[Finding]) -> int:
    rc = int(worst(findings))
    if a.json:
        print(json.dumps({"exit": rc, "findings": [f.as_dict() for f in findings]}, indent=2))
        return rc
    from edge_agent.console_format import use_color

    color = use_color(sys.stdout)
    width = max(len(f.check) for f in findings)
    for f in findings:
        word, code = _MARK[f.level]
        mark = f"{code}{word:<5}\x1b[0m" if color else f"{word:<5}"
        print(f"{mark} {f.check:<{width}}  {f.message}")
        if f.fix and f.level is not Level.OK:
            print(f"{'':5} {'':<{width}}  fix: {f.fix}")
    n_err = sum(f.level is Level.ERROR for f in findings)
    n_warn = sum(f.level is Level.WARN for f in findings)
    print(f"{n_err} error(s), {n_warn} warning(s): exit {rc}")
    return rc
