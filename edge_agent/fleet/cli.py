"""`edge-agent fleet status|estop|rollout`: its arguments and entry point (docs/FLEET.md).

    edge-agent fleet status [--watch [--interval S]] [--json] [--no-query] [--settle-s S]
    edge-agent fleet estop [--deadline-s S] [--reason TEXT] [--json]
    edge-agent fleet rollout MODEL [--sha256 HEX] --canary N --wave P% --abort-at F%
                             [--previous FILE] [--trial-timeout-s S] [--drive-task T]
                             [--rollback-scope wave|all] [--report PATH] [--robots ID,ID]
    common: [--config PATH] [--host H] [--port P] [--username U] [--password-file F]
            [--pattern edge/+]

The broker is found as `edge-agent watch` finds it (edge_agent/comms/broker_args.py).
Exit codes: 0 ok; 1 a bad config, a robot that did not confirm the e-stop, a rollout aborted
or with a failed robot; 2 usage; 3 broker unreachable or refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

from edge_agent.comms.broker_args import add_broker_arguments

EXIT_OK, EXIT_FAIL, EXIT_USAGE, EXIT_BROKER = 0, 1, 2, 3


def _pct(text: str) -> float:
    v = float(text.rstrip("%"))
    if not 0.0 < v <= 100.0:
        raise argparse.ArgumentTypeError(f"{text}: a percentage in (0, 100]")
    return v


def add_parser(sub: Any) -> None:
    """Register `fleet` on the main parser's subparsers (light: nothing heavy is imported)."""
    p = sub.add_parser("fleet", help="every robot on the broker: status, e-stop, rollout",
                       description="Fleet tools: MQTT clients like `watch` (docs/FLEET.md).")
    fs = p.add_subparsers(dest="fleet_command", metavar="ACTION", required=True)
    st = fs.add_parser("status", help="one line per robot from retained status/state",
                       description="One line per robot: online, mode/state, stop, degraded "
                                   "modes, task, model and trial (from each robot's `status` "
                                   "command), last report, last seen.")
    st.add_argument("--watch", action="store_true", help="refresh until Ctrl-C")
    st.add_argument("--interval", type=float, default=2.0, metavar="S",
                    help="--watch: seconds between refreshes (default %(default)s)")
    st.add_argument("--json", action="store_true", help="a JSON array (one object per robot)")
    st.add_argument("--no-query", action="store_true",
                    help="retained messages only: no `status` command (no model, no trial)")
    st.add_argument("--query-timeout", type=float, default=3.0, metavar="S",
                    help="wait this long for the robots' `status` replies; a robot that has not "
                         "answered shows no model (default %(default)s)")
    es = fs.add_parser("estop", help="the fleet e-stop, with acknowledgements counted",
                       description="Publish the fleet e-stop (mqtt.fleet_topic) and list which "
                                   "robots confirmed it (a `stop` event or a state with "
                                   "estop_fleet) within --deadline-s. Exit 1 when any did not.")
    es.add_argument("--deadline-s", type=float, default=2.0, metavar="S",
                    help="wait this long for confirmations (default %(default)s)")
    es.add_argument("--reason", default="fleet estop (edge-agent fleet estop)")
    es.add_argument("--topic", default=None,
                    help="the fleet e-stop topic (default: the config's mqtt.fleet_topic)")
    es.add_argument("--json", action="store_true", help="the result as one JSON object")
    ro = fs.add_parser("rollout", help="a model to the fleet in waves, with an abort criterion",
                       description="Drive the per-robot model trial across the fleet: a canary "
                                   "wave, then waves of P % of the rest; a wave whose failed "
                                   "fraction reaches F % stops the rollout and rolls its robots "
                                   "back (docs/FLEET.md).")
    ro.add_argument("model", metavar="MODEL", help="the model file, at this path in every "
                    "robot's inference.update_dir (its card beside it)")
    ro.add_argument("--sha256", default=None, metavar="HEX",
                    help="MODEL's sha256 (default: hashed here)")
    ro.add_argument("--canary", type=int, default=1, metavar="N", help="robots in the first "
                    "wave (default %(default)s)")
    ro.add_argument("--wave", type=_pct, default=25.0, metavar="P%", dest="wave_pct",
                    help="each later wave: P %% of the robots after the canary (default 25%%)")
    ro.add_argument("--abort-at", type=_pct, default=50.0, metavar="F%", dest="abort_at_pct",
                    help="abort when a wave's failed fraction reaches F %% (default 50%%)")
    ro.add_argument("--previous", default=None, metavar="FILE",
                    help="the model the fleet runs now (same rules as MODEL): the way back for "
                         "robots that committed before an abort")
    ro.add_argument("--previous-sha256", default=None, metavar="HEX",
                    help="--previous's sha256 (default: hashed here)")
    ro.add_argument("--trial-timeout-s", type=float, default=3600.0, metavar="S",
                    help="a robot whose trial has not ended by then counts as failed")
    ro.add_argument("--drive-task", default=None, metavar="TASK",
                    help="start TASK on a robot on trial whenever it is idle (benches; robots "
                         "with no work of their own)")
    ro.add_argument("--rollback-scope", choices=("wave", "all"), default="wave",
                    help="on abort, roll back the aborted wave's robots or every updated one")
    ro.add_argument("--robots", default=None, metavar="ID,ID",
                    help="only these robots (default: every online robot)")
    ro.add_argument("--report", default=None, metavar="PATH",
                    help="write PATH.md and PATH.json (default rollout-<UTC time>)")
    for q in (st, es, ro):
        add_broker_arguments(q)
        q.add_argument("--pattern", default=None, metavar="PREFIX",
                       help="the robots' topic prefix with + for the device id (default edge/+)")
        q.add_argument("--settle-s", type=float, default=1.5, metavar="S",
                       help="wait at most this long for the retained messages (default "
                            "%(default)s)")


def run(a: argparse.Namespace) -> int:
    """Entry point for the `fleet` subcommand."""
    from edge_agent.comms.broker_args import BrokerArgsError, broker_target, load_optional_config
    from edge_agent.fleet.bus import DEFAULT_PATTERN, FleetBus, FleetError

    try:
        cfg = load_optional_config(a)
        target = broker_target(a, cfg, "+", None)
    except BrokerArgsError as exc:
        print(exc, file=sys.stderr)
        return EXIT_USAGE if exc.usage else EXIT_FAIL
    # the operator's own id is not a robot's: never reuse the config's client id
    target = dataclasses.replace(target, client_id=None)
    try:
        bus = FleetBus(target, a.pattern or DEFAULT_PATTERN)
    except ValueError as exc:
        print(f"error: --pattern: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        bus.start()
    except FleetError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_BROKER
    try:
        bus.settle(a.settle_s)
        if a.fleet_command == "status":
            return _status(bus, a)
        if a.fleet_command == "estop":
            fleet_topic = a.topic or (cfg.mqtt.fleet_topic if cfg is not None else None)
            return _estop(bus, a, fleet_topic)
        return _rollout(bus, a)
    finally:
        bus.close()


def _status(bus: Any, a: argparse.Namespace) -> int:
    from edge_agent.fleet.view import lines, row, summary

    while True:
        robots = bus.snapshot()
        if not a.no_query:
            bus.query_all([r for r in robots if r.online], timeout=a.query_timeout)
        now = time.time()
        rows = [row(r, now) for r in robots]
        if a.json:
            print(json.dumps(rows, default=str), flush=True)
        else:
            if a.watch:
                print("\033[H\033[J", end="")
            print(summary(rows))
            print("\n".join(lines(rows, now)), flush=True)
        if not a.watch:
            return EXIT_OK
        time.sleep(max(0.2, a.interval))


def _estop(bus: Any, a: argparse.Namespace, topic: str | None) -> int:
    from edge_agent.comms.mqtt_common import Topics
    from edge_agent.fleet.estop import fleet_estop, lines

    result = fleet_estop(bus, topic or Topics("").fleet_estop, a.deadline_s, a.reason)
    print(json.dumps(result.as_dict()) if a.json else "\n".join(lines(result)))
    return EXIT_OK if result.confirmed else EXIT_FAIL


def _rollout(bus: Any, a: argparse.Namespace) -> int:
    from edge_agent.fleet.rollout import ModelFile, RolloutPlan, Runner
    from edge_agent.fleet.rollout_report import write

    if a.canary < 0:
        print("error: --canary must be >= 0", file=sys.stderr)
        return EXIT_USAGE
    try:
        model = ModelFile.from_path(a.model, a.sha256)
        previous = (ModelFile.from_path(a.previous, a.previous_sha256) if a.previous else None)
    except OSError as exc:
        print(f"error: {exc.filename}: {exc.strerror} (give --sha256 / --previous-sha256 when "
              "the file is only on the robots)", file=sys.stderr)
        return EXIT_USAGE
    plan = RolloutPlan(model, a.canary, a.wave_pct, a.abort_at_pct, a.trial_timeout_s, previous,
                       a.drive_task, a.rollback_scope)
    robots = bus.snapshot()
    if a.robots:
        wanted = set(a.robots.split(","))
        robots = [r for r in robots if r.device in wanted]
    if not any(r.online for r in robots):
        print("error: no online robot found on the broker", file=sys.stderr)
        return EXIT_FAIL
    ro = Runner(bus, plan, lambda line: print(line, flush=True)).run(robots)
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(ro.started))
    md, js = write(ro, Path(a.report or f"rollout-{stamp}"))
    runs = [r for w in ro.waves for r in w.robots]
    failed = [r.device for r in runs if r.failed]
    done = sum(r.outcome in ("committed", "already") for r in runs)
    print(f"rollout {ro.result}: {done} committed, {len(failed)} failed; report {md} and {js}")
    return EXIT_OK if ro.result == "completed" and not failed else EXIT_FAIL
