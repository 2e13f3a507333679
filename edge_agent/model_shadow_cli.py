"""`edge-agent model shadow`: start or stop a shadow candidate on the running daemon.

    edge-agent model shadow /var/lib/edge-agent-models/c.onnx --sha256 HEX [--version V]
    edge-agent model shadow --stop

Sends `model.shadow` (`{"uri", "sha256", "version"?}` or `{"stop": true}`) the way
`edge-agent cmd` does (its local control socket, else MQTT; `--config` / `--device` pick the
daemon) and prints the reply; exit codes as `edge-agent cmd` (0 ok, 1 refused, 2 usage, 3 no
reply). A relative path is made absolute here (the daemon takes absolute paths only).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from edge_agent.comms.cmd_cli import EXIT_USAGE, add_target_options


def add_parser(msub: Any) -> None:
    sh = msub.add_parser(
        "shadow", help="run a candidate beside the policy on the robot, never acting "
                       "(model.shadow)",
        description="Start a shadow: the daemon verifies the candidate as model.update would "
                    "(sha256, signature, meaning, a smoke run) and runs it on every decision's "
                    "observation without acting; status.model.shadow shows the agreement, a "
                    "report follows after inference.shadow_report_after decisions and at "
                    "--stop. Refused while a task runs.")
    sh.add_argument("model", nargs="?", metavar="MODEL",
                    help="the candidate .onnx (inside inference.update_dir on the robot)")
    sh.add_argument("--sha256", metavar="HEX", help="the candidate's sha256 (required to start)")
    sh.add_argument("--version", help="its version (a signed card's version must match)")
    sh.add_argument("--stop", action="store_true", help="stop the shadow and file its report")
    add_target_options(sh)


def run(a: argparse.Namespace) -> int:
    from edge_agent.comms.cmd_cli import run as run_cmd

    args: dict[str, Any]
    if a.stop:
        if a.model or a.sha256 or a.version:
            print("error: --stop takes no MODEL, --sha256 or --version", file=sys.stderr)
            return EXIT_USAGE
        args = {"stop": True}
    else:
        if not a.model or not a.sha256:
            print("error: give MODEL and --sha256 to start a shadow, or --stop",
                  file=sys.stderr)
            return EXIT_USAGE
        args = {"uri": os.path.abspath(a.model), "sha256": a.sha256.lower()}
        if a.version:
            args["version"] = a.version
    ns = argparse.Namespace(**{**vars(a), "command": "cmd", "name": "model.shadow",
                               "args": json.dumps(args)})
    return run_cmd(ns)
