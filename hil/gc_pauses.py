"""Garbage-collection pauses after start-up: GIL holds or a preempted collecting thread?

    python -m hil.gc_pauses [--tasks 20] [--load 0] [--estop-every 0] [--set KEY=VALUE ...]

One real `edge-agent run --sim` daemon (hil/daemon_proc.py, no broker); once its start-up work
is done (the `after_startup` window of `status.loop.gc` opens), `--tasks` pick-and-place tasks
on the control socket, while `--load` busy processes (plain `while True: pass`, nice 0) compete
for the CPUs (`--estop-every N`: a software e-stop in every Nth task — a repair report and its
flight-recorder file — then reset and resume). Then `status.loop.gc.after_startup` per
generation: collections, the longest on the wall clock (`perf_counter` in the gc callback: how
long the GIL was held) and on the collecting thread's own CPU clock (`thread_time`: how long it
scanned), how many were over 5 ms on the wall, how many of those also over 5 ms of CPU (real
work) and how many under half of their wall time on CPU (the collecting thread was preempted
while it held the GIL), and the thread that ran the longest. Beside it the control loop's late
ticks and missed periods.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

from hil.daemon_proc import ROOT, Control, request, start_sim_daemon, stop_daemon, wait_for
from hil.steal import StealMeter


def busy(n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def estop_and_resume(ctl: Control, task_id: str) -> None:
    """A software e-stop mid-task (a repair report and its flight-recorder file), then the
    operator's reset and resume."""
    time.sleep(1.5)
    ctl.call("estop")
    wait_for(lambda: ctl.status().get("stop"), 10, "the e-stop latched")
    time.sleep(0.5)
    wait_for(lambda: ctl.call("reset")["ok"], 30, "reset")
    ctl.call("resume", task_id=task_id)


def run_tasks(ctl: Control, state: Path, n: int, seed: int, estop_every: int
              ) -> dict[str, int]:
    rig = tomllib.loads((ROOT / "configs" / "rig" / "default.toml").read_text())["object"]
    rng = random.Random(seed)
    out: dict[str, int] = {}
    for i in range(n):
        xyz = [rng.uniform(rig["box_min_m"][0], rig["box_max_m"][0]),
               rng.uniform(rig["box_min_m"][1], rig["box_max_m"][1]), rig["size_m"] / 2]
        request(state / "rig.sock", {"cmd": "set", "key": "object_xyz", "value": xyz})
        time.sleep(1.0)
        r = ctl.call("task.start")
        if not r.get("ok"):
            key = f"refused {r['error']['code']}"
            out[key] = out.get(key, 0) + 1
            if ctl.status().get("stop"):
                wait_for(lambda: ctl.call("reset")["ok"], 30, "reset")
            continue
        if estop_every and i % estop_every == 0:
            estop_and_resume(ctl, str(r["result"]["task_id"]))
        wait_for(lambda: ctl.status()["mode"] != "running", 120, "the task's end", poll_s=0.2)
        st = ctl.status()
        key = "stopped" if st.get("stop") else "done"
        out[key] = out.get(key, 0) + 1
        if st.get("stop"):
            wait_for(lambda: ctl.call("reset")["ok"], 30, "reset")
    return out


def table(gc: dict[str, Any]) -> str:
    rows = ["gen  collections  max wall ms  max cpu ms (freed)  >5ms wall  >5ms cpu  preempted  "
            "longest in"]
    for g in range(3):
        rows.append(f"{g:>3}  {gc['collections'][g]:>11}  {gc['max_ms'][g]:>11.3f}  "
                    f"{gc['max_cpu_ms'][g]:>10.3f} ({gc['max_cpu_collected'][g]:>5})  "
                    f"{gc['over_5ms'][g]:>9}  "
                    f"{gc['cpu_over_5ms'][g]:>8}  {gc['preempted_5ms'][g]:>9}  "
                    f"{gc['max_thread'][g]}")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=20)
    ap.add_argument("--load", type=int, default=0, help="busy processes beside the daemon")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--estop-every", type=int, default=0, metavar="N",
                    help="a software e-stop in every Nth task (its report and recording), "
                         "then reset and resume (0: none)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="gc-pauses-") as tmp:
        state = Path(tmp)
        proc = start_sim_daemon(state, ["mqtt.port=1", "link.deadman_ms=1000", *a.set])
        ctl = Control(state)
        hogs: list[subprocess.Popen[bytes]] = []
        steal = StealMeter()
        try:
            wait_for(lambda: ctl.status()["link_up"], 90, "the link")
            wait_for(lambda: ((ctl.status().get("loop") or {}).get("gc") or {}).get(
                "after_startup") is not None, 120, "the start-up work's end")
            load0 = os.getloadavg()[0]
            hogs = busy(a.load)
            steal.start()
            t0 = time.monotonic()
            outcomes = run_tasks(ctl, state, a.tasks, a.seed, a.estop_every)
            wall = time.monotonic() - t0
            load1 = os.getloadavg()[0]
            steal.stop()
            st = ctl.status()
        finally:
            for h in hogs:
                h.kill()
                h.wait()
            stop_daemon(proc)
    loop = st.get("loop") or {}
    gc = loop["gc"]
    print(f"{a.tasks} tasks in {wall:.0f} s ({outcomes}); {a.load} busy processes; load average "
          f"{load0:.2f} before, {load1:.2f} after, {os.cpu_count()} CPUs; {steal.describe()}")
    print("after start-up (automatic collections):")
    print(table(gc["after_startup"]))
    print(f"idle (the daemon's own full collections at safe points): "
          f"{gc['idle']['collections']}, max {max(gc['idle']['max_ms']):.1f} ms wall, "
          f"{max(gc['idle']['max_cpu_ms']):.1f} ms cpu; frozen objects {gc['frozen']}")
    print("control loop: " + ", ".join(f"{k} {loop.get(k)}" for k in (
        "ticks", "missed_periods", "overruns", "late_p99_ms", "max_late_ms") if k in loop))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
