"""`edge-agent`: the command-line entry point — run the daemon, check a config, send a command.

    edge-agent run --config PATH [--sim] [--eager] [--set KEY=VALUE ...]
    edge-agent check-config PATH [--sim] [--set KEY=VALUE ...] [--print]
    edge-agent cmd NAME [JSON] [--config PATH | --device ID] [--json] [--timeout S]
    edge-agent status [--config PATH | --device ID] [--json]
    edge-agent doctor [--config PATH] [--json]
    edge-agent journal export --state-dir D --out DIR | journal drift --state-dir D
    edge-agent journal episodes|labels --state-dir D | journal label --state-dir D TASK VERDICT
    edge-agent watch [--config PATH] [--device ID|+] [--json] [--count N]
    edge-agent model keygen --out KEY | model sign MODEL --key KEY | model verify MODEL ...
    edge-agent fleet status|estop|rollout MODEL ...   (every robot on the broker; FLEET.md)
    edge-agent version

Exit codes:
    0    success (check-config: valid; cmd: the reply says ok)
    1    check-config: the config is invalid; cmd: refused (reply ok=false) or bad config
    2    usage error (arguments, JSON), or a part this build does not have yet
    2    cmd: several daemons run here and none was named (--device ID), or none was found
    3    cmd: no reply (daemon not reachable, timeout)
    doctor: 0 all ok, 1 a warning, 2 an error (edge_agent/doctor/)
    75   run: another daemon holds the state dir's lock (the message names its pid); nothing
         in the state dir was touched
    78   run: the config is invalid (EX_CONFIG; the unit's RestartPreventExitStatus=78 keeps
         systemd from restart-looping on a config that can never start), or the state dir is
         unsafe (owned by another user, writable by group or others)
    130  interrupted (Ctrl-C)
    run otherwise exits with the daemon's own status.

Errors are one line on stderr (`error: <file>: <key> = <value>: <why>`), never a traceback.
Heavy parts (the daemon, the MQTT client, logging set-up) are imported only by the subcommand
that needs them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from edge_agent import __version__
from edge_agent.errors import ConfigError

if TYPE_CHECKING:
    from edge_agent.config import Config
    from edge_agent.link.guardian_spawn import Spawned

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_NO_REPLY, EXIT_CONFIG, EXIT_INTERRUPTED = 0, 1, 2, 3, 78, 130
EXIT_BUSY = 75  # EX_TEMPFAIL: another daemon holds the state dir
DEFAULT_CONFIG = "/etc/edge-agent/edge-agent.toml"

_SET_HELP = ("override a config key for this run, e.g. --set mqtt.port=1884, --set "
             "link.port=/dev/ttyACM0, --set debug.failure_injection=true (VALUE is read as TOML "
             "when it parses, else as text; relative paths are relative to the working directory); "
             "repeatable")
_EPILOG = """\
examples:
  edge-agent run --config configs/sim.toml --sim          simulated robot on a pty
  edge-agent run --config /etc/edge-agent/edge-agent.toml real robot (as the systemd service does)
  edge-agent check-config /etc/edge-agent/edge-agent.toml validate before restarting the service
  edge-agent doctor --config /etc/edge-agent/edge-agent.toml  check this machine, with fixes
  edge-agent status                                       the running daemon's state (= cmd status)
  edge-agent cmd estop                                    e-stop (the hardware button still rules)
  edge-agent cmd task.start '{"task": "pick_place"}'

exit codes: 0 ok, 1 invalid config / command refused, 2 usage, 3 no reply, 78 run: invalid config
            (doctor: 0 ok, 1 warning, 2 error)
"""


def _parser(run_only: bool = False) -> argparse.ArgumentParser:
    """The whole command line; `run_only`: only the `run` subcommand, for `edge-agent run ...`
    (its parsing, help and errors are the same; the other subcommands' modules stay unimported:
    ~10 ms of the daemon's start-up)."""
    p = argparse.ArgumentParser(
        prog="edge-agent", epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Fault-tolerant runtime daemon for a robot controller: MQTT commands, a "
                    "state-machine executor, an e-stop latch and graceful degradation.")
    p.add_argument("--version", action="version", version=f"edge-agent {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)

    run = sub.add_parser(
        "run", help="run the daemon in the foreground",
        description="Run the daemon in the foreground (systemd Type=notify). It comes up even "
                    "without the serial device: in a protective stop, with a link_fault event, "
                    "retrying the port. Logs are JSON lines on stdout unless stdout is a terminal.")
    run.add_argument("--config", required=True, metavar="PATH", help="the TOML configuration")
    run.add_argument("--sim", action="store_true",
                     help="start the simulated robot (python -m hil.rig) on a pty and use it as "
                          "link.port")
    run.add_argument("--eager", action="store_true",
                     help="load everything (policy model, Kalman estimators, calibration) before "
                          "READY instead of in the background, to compare start-up paths")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    if run_only:
        return p

    chk = sub.add_parser(
        "check-config", help="validate a config and its robot description",
        description="Validate a configuration (and the robot description it names) without "
                    "starting anything. Prints OK with the config hash that `status` will "
                    "publish, or the bad key, its value and why.")
    chk.add_argument("path", metavar="PATH", help="the TOML configuration")
    chk.add_argument("--sim", action="store_true", help="check as `run --sim` would (link.port "
                                                        "may be absent)")
    chk.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help=_SET_HELP)
    chk.add_argument("--print", action="store_true", dest="show",
                     help="also print the effective config as JSON (secrets as ***)")

    from edge_agent.comms.cmd_cli import add_parsers as add_cmd_parsers

    add_cmd_parsers(sub)  # `cmd`, `status` (edge_agent/comms/cmd_cli.py)
    sub.add_parser("version", help="print the version, wire protocol and config schema")
    from edge_agent.journal_cli import add_parser as add_journal_parser

    add_journal_parser(sub)  # `journal export|drift|episodes|label|labels` (journal_cli.py)
    from edge_agent.comms.watch_cli import add_parser as add_watch_parser

    add_watch_parser(sub)  # `watch` (edge_agent/comms/watch_cli.py)
    from edge_agent.model_cli import add_parser as add_model_parser

    add_model_parser(sub)  # `model keygen|sign|verify` (edge_agent/model_cli.py)
    from edge_agent.doctor.cli import add_parser as add_doctor_parser

    add_doctor_parser(sub)  # `doctor` (edge_agent/doctor/)
    from edge_agent.reports.cli import add_parser as add_reports_parser

    add_reports_parser(sub, DEFAULT_CONFIG)  # `reports list|show` (edge_agent/reports/cli.py)
    from edge_agent.record_cli import add_parser as add_record_parser

    add_record_parser(sub, DEFAULT_CONFIG)  # `record start|stop|list` (edge_agent/record_cli.py)
    from edge_agent.fleet.cli import add_parser as add_fleet_parser

    add_fleet_parser(sub)  # `fleet status|estop|rollout` (edge_agent/fleet/cli.py)
    return p


def _config_error(exc: ConfigError, path: str) -> str:
    return f"error: {exc}" if exc.source else f"error: {path}: {exc}"


def _cmd_run(a: argparse.Namespace) -> int:
    from edge_agent.daemon.procstart import pause_gc, resume_gc

    pause_gc()  # until READY (HeapKeeper.ready collects once and resumes it)
    try:
        return _run_daemon(a)
    finally:
        resume_gc()  # the daemon stopped before READY (or a test runs main() in-process)


def _run_daemon(a: argparse.Namespace) -> int:
    from edge_agent.daemon.procstart import mark

    mark("cli")
    from edge_agent.config import load_config

    try:
        cfg = load_config(a.config, a.set, sim=a.sim)
    except ConfigError as exc:
        print(_config_error(exc, a.config), file=sys.stderr)
        return EXIT_CONFIG
    mark("config")
    from edge_agent.store.statelock import StateDirBusy, StateDirLock, StateDirUnsafe

    # Before anything in the state dir is read or written, and before the guardian opens the
    # tty: a second daemon on the same state dir leaves at once, having touched nothing.
    try:
        lock = StateDirLock.acquire(cfg.state_dir)
    except StateDirBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BUSY
    except StateDirUnsafe as exc:
        print(f"error: {a.config}: state_dir: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    mark("state_lock")
    early = None if a.sim else _spawn_guardian_early(cfg)
    mark("guardian_early")
    from edge_agent.logsetup import configure_logging

    # Logging is configured here, once, before the daemon starts (it logs cfg.warnings itself).
    configure_logging(cfg.log.level, cfg.log.format, cfg.secret_values())
    mark("logging")
    try:
        from edge_agent.daemon.app import run as daemon_run
    except BaseException:
        if early is not None:
            early.abandon()  # the daemon cannot start: do not leave its guardian behind
        raise
    mark("daemon_import")
    rc = daemon_run(cfg, sim=a.sim, eager=a.eager, prespawned=early)
    lock.release()  # after the clean-shutdown marker is gone (exit would release it too)
    return int(rc) if isinstance(rc, int) else EXIT_OK


def _spawn_guardian_early(cfg: Config) -> Spawned | None:
    """Start the link guardian now, beside the daemon's imports (the daemon adopts it); None
    when it cannot start — the daemon then tries itself and reports why."""
    from edge_agent.errors import LinkError
    from edge_agent.link.guardian_spawn import spawn, spec_from_config

    if not cfg.link.port:
        return None
    try:
        return spawn(spec_from_config(cfg, cfg.link.port))
    except LinkError:
        return None


def _cmd_check(a: argparse.Namespace) -> int:
    from edge_agent.config import load_config

    try:
        cfg = load_config(a.path, a.set, sim=a.sim)
    except ConfigError as exc:
        print(_config_error(exc, a.path), file=sys.stderr)
        return EXIT_FAIL
    except Exception as exc:  # never a traceback for an operator; this is a bug, say so
        print(f"error: {a.path}: unexpected {type(exc).__name__}: {exc} (please report)",
              file=sys.stderr)
        return EXIT_FAIL
    if cfg.mqtt.tls.enabled:  # load the files the way the daemon's MQTT bridge will
        from edge_agent.comms.mqtt_common import TlsOptions

        try:
            TlsOptions.from_config(cfg.mqtt.tls).context()
        except ConfigError as exc:
            print(_config_error(exc, a.path), file=sys.stderr)
            return EXIT_FAIL
    from edge_agent.model_cli import configured_gate_warning, configured_model_problem

    why = configured_model_problem(cfg.inference)  # the daemon would refuse to load it
    if why is not None:
        print(f"error: {a.path}: inference.model = {str(cfg.inference.model)!r}: {why}",
              file=sys.stderr)
        return EXIT_FAIL
    for w in [*cfg.warnings, *filter(None, [configured_gate_warning(cfg.inference)])]:
        print(f"warning: {a.path}: {w}", file=sys.stderr)
    r = cfg.robot
    print(f"OK: {a.path} (device {cfg.device.id}, robot {r.name} {r.n_joints} joints, "
          f"hash {cfg.hash})")
    if a.show:
        print(json.dumps(cfg.as_dict(), indent=2))
    return EXIT_OK


def _cmd_cmd(a: argparse.Namespace) -> int:
    from edge_agent.comms.cmd_cli import run as cmd_run

    return cmd_run(a)


def _cmd_version(a: argparse.Namespace) -> int:
    from edge_agent.config import SCHEMA_VERSION
    from edge_agent.link.codec import PROTO_VERSION

    py = ".".join(map(str, sys.version_info[:3]))
    print(f"edge-agent {__version__} (wire protocol {PROTO_VERSION}, config schema "
          f"{SCHEMA_VERSION}, python {py})")
    return EXIT_OK


def _cmd_watch(a: argparse.Namespace) -> int:
    from edge_agent.comms.watch_cli import run as watch_run

    return watch_run(a)


def _cmd_model(a: argparse.Namespace) -> int:
    from edge_agent.model_cli import run as model_run

    return model_run(a)


def _cmd_doctor(a: argparse.Namespace) -> int:
    from edge_agent.doctor.cli import run as doctor_run

    return doctor_run(a)


def _cmd_journal(a: argparse.Namespace) -> int:
    from edge_agent.journal_cli import run as journal_run

    return journal_run(a)


def _cmd_record(a: argparse.Namespace) -> int:
    from edge_agent.record_cli import run as record_run

    return record_run(a)


def _cmd_fleet(a: argparse.Namespace) -> int:
    from edge_agent.fleet.cli import run as fleet_run

    return fleet_run(a)


def _cmd_reports(a: argparse.Namespace) -> int:
    from edge_agent.reports.cli import run as reports_run

    return reports_run(a)


_HANDLERS = {"run": _cmd_run, "check-config": _cmd_check, "cmd": _cmd_cmd, "journal": _cmd_journal,
             "model": _cmd_model, "version": _cmd_version, "watch": _cmd_watch, "status": _cmd_cmd,
             "doctor": _cmd_doctor, "reports": _cmd_reports, "record": _cmd_record,
             "fleet": _cmd_fleet}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `edge-agent` console script; returns the exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    a = _parser(run_only=args[:1] == ["run"]).parse_args(args)
    try:
        return _HANDLERS[a.command](a)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `edge-agent check-config --print ... | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
