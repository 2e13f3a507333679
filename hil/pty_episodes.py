"""Pick-and-place episodes through the whole daemon over a real pty, to compare with lock-step.

    python3 -m hil.pty_episodes [--n 50] [--seed 1]

One `edge-agent run --sim` daemon; before each episode the simulated robot's cube is placed at a
seeded random pose inside the rig's object box (configs/rig/default.toml), then `task.start`
goes through the control socket and the episode ends with the daemon's `task_done` event (read
from its JSON log). Prints the success rate beside the lock-step runner's on as many episodes
(`hil.episodes`, same robot, same rig config) measured in the same run, and the protective stops
the daemon latched (`stop` events by cause: a `deadman` one means a pause past link.deadman_ms
while the robot moved — issue 15's target is none over 100 episodes with telemetry on:
`--mqtt-port 1883` with a broker there, as hil.bench_control_loop).
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from hil.daemon_proc import Control, request, start_sim_daemon, stop_daemon, wait_for

ROOT = Path(__file__).resolve().parents[1]


def _events(log: Path, name: str) -> list[dict[str, Any]]:
    out = []
    for line in log.read_text().splitlines():
        if '"task_done"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("type") == name:
            out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=50)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--timeout-s", type=float, default=60.0, help="per episode")
    ap.add_argument("--mqtt-port", type=int, default=1,
                    help="a broker's port: telemetry on (20 Hz); 1 (default): no broker")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra daemon config override (repeatable), e.g. control.rate_hz=500")
    args = ap.parse_args(argv)
    rig_cfg = tomllib.loads((ROOT / "configs" / "rig" / "default.toml").read_text())
    lo, hi = rig_cfg["object"]["box_min_m"], rig_cfg["object"]["box_max_m"]
    half = rig_cfg["object"]["size_m"] / 2
    rng = random.Random(args.seed)
    tmp = Path(tempfile.mkdtemp(prefix="edge-pty-episodes-"))
    log = tmp / "daemon.log"
    daemon = start_sim_daemon(tmp, (f"mqtt.port={args.mqtt_port}", "mqtt.telemetry_hz=20",
                                    "device.id=pty-episodes", *args.set))
    rig = tmp / "rig.sock"
    call = Control(tmp).call

    outcomes: list[str] = []
    t_start = time.monotonic()
    try:
        wait_for(lambda: call("status")["result"]["link_up"], 60, "link up")
        if call("status")["result"]["mode"] != "idle":
            wait_for(lambda: call("reset")["ok"], 30, "reset")
        for i in range(args.n):
            xyz = [rng.uniform(lo[0], hi[0]), rng.uniform(lo[1], hi[1]), half]
            request(rig, {"cmd": "set", "key": "object_xyz", "value": xyz})
            time.sleep(1.0)  # the camera estimate settles on the new pose (30 Hz, 50 ms latency)
            before = len(_events(log, "task_done"))
            r = call("task.start")
            if not r.get("ok"):
                outcomes.append(f"refused:{r['error']['code']}")
                print(f"episode {i}: refused {r['error']}", flush=True)
                if call("status")["result"]["mode"] not in ("idle", "holding"):
                    wait_for(lambda: call("reset")["ok"], 30, "reset")  # as an operator would
                continue
            try:
                wait_for(lambda b=before: len(_events(log, "task_done")) > b, args.timeout_s,
                         "task_done")
                done = _events(log, "task_done")[-1]
                outcomes.append(str(done["outcome"]))
            except SystemExit:
                outcomes.append("timeout")
                call("task.cancel")
            print(f"episode {i}: {outcomes[-1]}", flush=True)
            mode = call("status")["result"]["mode"]
            if mode not in ("idle", "holding"):
                wait_for(lambda: call("reset")["ok"], 30, "reset")
    finally:
        stop_daemon(daemon)
    wall = time.monotonic() - t_start
    ok = outcomes.count("success")
    print(f"pty: {ok}/{len(outcomes)} = {100 * ok / max(1, len(outcomes)):.1f} % success "
          f"({wall:.0f} s wall); outcomes: "
          f"{ {o: outcomes.count(o) for o in sorted(set(outcomes))} }")
    stops: dict[str, int] = {}
    for line in log.read_text().splitlines():
        if '"type": "stop"' in line:
            try:
                cause = str(json.loads(line).get("cause"))
            except ValueError:
                continue
            stops[cause] = stops.get(cause, 0) + 1
    print(f"stops latched (by cause): {stops or 'none'}; deadman stops: {stops.get('deadman', 0)}")
    ls = subprocess.run([sys.executable, "-m", "hil.episodes", "--n", str(args.n), "--seed",
                         str(args.seed)], capture_output=True, text=True, cwd=ROOT)
    print("lock-step, same count:", (ls.stdout.strip().splitlines() or ["(no output)"])[-1])
    print(f"logs: {log}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
