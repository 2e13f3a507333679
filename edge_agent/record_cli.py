"""`edge-agent record start|stop|list`: the flight recorder's on-demand captures (docs/OBSERVE.md).

    edge-agent record start [--name NAME]   # record.start on the running daemon
    edge-agent record stop                  # record.stop: the file is finished
    edge-agent record list [--config PATH | --state-dir D] [--json]

`start` and `stop` send the command the way `edge-agent cmd` does (its local control socket,
else MQTT; `--config` / `--device` pick the daemon) and print the reply; exit codes as
`edge-agent cmd` (0 ok, 1 refused, 2 usage, 3 no reply). `list` reads
`<state_dir>/recordings/` (daemon running or not): one line per MCAP file, oldest first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from edge_agent.comms.cmd_cli import EXIT_FAIL, EXIT_OK, add_target_options


def add_parser(sub: Any, default_config: str) -> None:
    p = sub.add_parser("record", help="the flight recorder: start/stop a capture, list files",
                       description=(__doc__ or "").splitlines()[0])
    rsub = p.add_subparsers(dest="record_command", metavar="ACTION", required=True)
    start = rsub.add_parser("start", help="start an on-demand capture (record.start)")
    start.add_argument("--name", help="in the file's name: [a-z0-9][a-z0-9_-]{0,39}")
    add_target_options(start)
    stop = rsub.add_parser("stop", help="end the on-demand capture (record.stop)")
    add_target_options(stop)
    lst = rsub.add_parser("list", help="the MCAP files in <state_dir>/recordings")
    lst.add_argument("--state-dir", metavar="D", default=None,
                     help="read D/recordings instead of the config's state_dir's")
    lst.add_argument("--json", action="store_true", help="print JSON")
    lst.add_argument("--config", metavar="PATH",
                     default=os.environ.get("EDGE_AGENT_CONFIG", default_config),
                     help="the daemon's config, for state_dir (default: $EDGE_AGENT_CONFIG, "
                          "else %(default)s)")


def run(a: argparse.Namespace) -> int:
    if a.record_command == "list":
        return _list(a)
    from edge_agent.comms.cmd_cli import run as run_cmd

    name = f"record.{a.record_command}"
    args = {"name": a.name} if a.record_command == "start" and a.name else {}
    ns = argparse.Namespace(**{**vars(a), "command": "cmd", "name": name,
                               "args": json.dumps(args)})
    return run_cmd(ns)


def _list(a: argparse.Namespace) -> int:
    if a.state_dir:
        state_dir = Path(a.state_dir)
    else:
        from edge_agent.config import load_config
        from edge_agent.errors import ConfigError

        try:
            state_dir = Path(load_config(a.config, sim=True).state_dir)
        except (ConfigError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_FAIL
    from edge_agent.daemon.recording import recordings_dir

    rows: list[dict[str, Any]] = []
    for p in sorted(recordings_dir(state_dir).glob("*.mcap")):
        try:
            st = p.stat()
        except OSError:
            continue
        rows.append({"path": str(p), "bytes": st.st_size, "modified": st.st_mtime,
                     "finished": _finished(p)})
    if a.json:
        print(json.dumps(rows, indent=2))
    elif not rows:
        print(f"no recordings in {recordings_dir(state_dir)}")
    for r in rows if not a.json else ():
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["modified"]))
        print(f"{when}Z  {r['bytes'] / 1e6:8.2f} MB  {'' if r['finished'] else '(open) '}"
              f"{r['path']}")
    return EXIT_OK


def _finished(p: Path) -> bool:
    """The writer wrote the footer (MCAP's closing magic): a file still open, or torn by a
    kill, has none (`mcap.stream_reader.StreamReader` reads its complete chunks)."""
    try:
        with p.open("rb") as f:
            f.seek(-8, os.SEEK_END)
            return f.read(8) == b"\x89MCAP0\r\n"
    except OSError:
        return False
