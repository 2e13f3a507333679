"""Benchmark of the simulated robot: lock-step speed and the pty rig's CPU use.

    python3 -m hil.sim.bench [--seconds 10] [--skip-pty] [--fleet 20]

Lock-step: a host streaming 200 Hz position + gripper commands, the firmware at its 1 ms tick,
STATUS at 1 ms and at 5 ms; speed = simulated seconds per CPU second of this process (CPU time,
not wall time: the machine is shared). Same-run baseline: one STATUS encode + decode.
Pty: `python -m hil.rig` at 1 kHz with one host (HELLO 1 ms, 200 Hz commands) and, with
--fleet N, N robots at a 5 ms tick; the rig process's CPU comes from /proc/<pid>/stat.
"""

from __future__ import annotations

import argparse
import math
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from edge_agent.link.codec import (
    Command,
    Enable,
    FrameDecoder,
    GripperMode,
    Hello,
    Mode,
    Status,
    StatusFlag,
    decode_frame,
    encode,
)
from edge_agent.robot import RobotDescription, load_robot
from hil.lockstep import Lockstep
from hil.sim.control import request

ROOT = Path(__file__).resolve().parents[2]
ROBOT = ROOT / "configs/robot/edge-arm-4.toml"


def baseline_us(n: int = 2000) -> float:
    st = Status(1, StatusFlag(0), 0, (0.1,) * 4, (0.0,) * 4, (0.5,) * 4, 0.04, 0.1, 1.0)
    t0 = time.process_time()
    for i in range(n):
        decode_frame(encode(st, i)[1:-1])
    return (time.process_time() - t0) / n * 1e6


def lockstep_speed(robot: RobotDescription, status_us: int, sim_s: float) -> float:
    r = Lockstep(robot, seed=1)
    r.send(Hello(1, 50, status_us))
    r.send(Enable(True))
    r.run_for(0.02)
    home = robot.home
    t0 = time.process_time()
    k = 0
    while r.now < sim_s:
        s = 0.3 * math.sin(2 * math.pi * 0.5 * r.now)
        r.send(Command(Mode.POSITION, (home[0] + s, home[1] + s / 2, home[2] - s, home[3]),
                       GripperMode.POSITION, 0.04 + 0.03 * s, 0.8))
        r.run_for(0.005)
        k += 1
    return sim_s / (time.process_time() - t0)


def proc_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pty_cpu(n: int, seconds: float, tick_us: int | None, status_us: int,
            spin_us: int) -> dict[str, Any]:
    sock = f"/tmp/hil-bench-{os.getpid()}.sock"
    cmd = [sys.executable, "-m", "hil.rig", "--robot", str(ROBOT), "--ptys", str(n),
           "--control-socket", sock, "--spin-us", str(spin_us)]
    if tick_us:
        cmd += ["--tick-us", str(tick_us)]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        paths = [proc.stdout.readline().split()[1] for _ in range(n)]
        idle0, t_idle = proc_cpu_s(proc.pid), time.monotonic()
        time.sleep(min(3.0, seconds / 3))
        idle = (proc_cpu_s(proc.pid) - idle0) / (time.monotonic() - t_idle)
        fds = [os.open(p, os.O_RDWR | os.O_NOCTTY) for p in paths]
        decs = [FrameDecoder() for _ in fds]
        stop = threading.Event()
        statuses = [0]

        def reader() -> None:
            while not stop.is_set():
                ready, _, _ = select.select(fds, [], [], 0.05)
                for fd in ready:
                    frames = decs[fds.index(fd)].feed(os.read(fd, 65536))
                    statuses[0] += sum(isinstance(f.msg, Status) for f in frames)

        th = threading.Thread(target=reader, daemon=True)
        th.start()
        for fd in fds:
            os.write(fd, encode(Hello(1, 100, status_us), 0) + encode(Enable(True), 1))
        time.sleep(0.2)
        home = load_robot(ROBOT).home
        c0, t0 = proc_cpu_s(proc.pid), time.monotonic()
        seq, nxt = 2, time.monotonic()
        while time.monotonic() - t0 < seconds:
            s = 0.2 * math.sin(time.monotonic())
            frame = encode(Command(Mode.POSITION, (home[0] + s, *home[1:]), ttl_ms=200), seq)
            for fd in fds:
                os.write(fd, frame)
            seq += 1
            nxt += 0.005
            time.sleep(max(0.0, nxt - time.monotonic()))
        busy = (proc_cpu_s(proc.pid) - c0) / (time.monotonic() - t0)
        info = request(sock, {"cmd": "status"})["rig"]
        stop.set()
        th.join()
        for fd in fds:
            os.close(fd)
        return {"robots": n, "tick_us": info["tick_us"], "idle_cpu_pct": 100 * idle,
                "busy_cpu_pct": 100 * busy, "overruns": info["overruns"],
                "max_late_ms": info["max_late_ms"], "statuses_read": statuses[0]}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--skip-pty", action="store_true")
    p.add_argument("--fleet", type=int, default=0, help="also run N robots at a 5 ms tick")
    p.add_argument("--spin-us", type=int, default=50, help="the rig's --spin-us")
    a = p.parse_args()
    robot = load_robot(ROBOT)
    print(f"baseline: STATUS encode+decode {baseline_us():.1f} us (CPU)")
    for status_us in (1000, 5000):
        runs = sorted(lockstep_speed(robot, status_us, a.seconds / 2) for _ in range(3))
        print(f"lock-step, status every {status_us} us: {runs[1]:.1f}x real time per CPU "
              f"(min {runs[0]:.1f}, max {runs[2]:.1f})")
    if not a.skip_pty:
        r = pty_cpu(1, a.seconds, None, 1000, a.spin_us)
        print(f"pty rig (spin {a.spin_us} us), 1 robot, 1 kHz status, 200 Hz commands: "
              f"{r['busy_cpu_pct']:.1f} % CPU "
              f"(idle, no session: {r['idle_cpu_pct']:.1f} %), overruns {r['overruns']}, "
              f"max late {r['max_late_ms']:.1f} ms")
        if a.fleet:
            r = pty_cpu(a.fleet, a.seconds, 5000, 5000, a.spin_us)
            print(f"pty rig, {a.fleet} robots, tick {r['tick_us']} us, 200 Hz commands each: "
                  f"{r['busy_cpu_pct']:.1f} % CPU (idle {r['idle_cpu_pct']:.1f} %), "
                  f"overruns {r['overruns']}, max late {r['max_late_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
