"""Benchmark: a frame's round trip through the guardian (daemon → guardian → tty → back).

    python3 -m hil.bench_relay [--pings 5000] [--priority 30] [--load]

A firmware peer process (`python -m hil.peer --mode pong`) on the pty master streams STATUS at 1
kHz and answers each PING with a PONG (SCHED_FIFO by default, as in bench_guardian_estop). Guardian
path: this process sends PING through a GuardianClient and times it until the PONG comes back
through its reader thread (the relay path the daemon's link reader sees, with the 1 kHz STATUS
relayed alongside). Same-run baseline: a bare pyserial port on the same kind of pty, PING written
and PONG read by this process directly. --load adds a CPU-bound Python thread to this process for
both. The machine is shared.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import threading
import time
from typing import Any

import serial

from edge_agent.link.codec import Frame, FrameDecoder, GState, Ping, Pong, SeqCounter, encode
from edge_agent.link.guardian_client import GuardianClient
from edge_agent.link.guardian_rules import GuardianFlag
from hil.bench_guardian_estop import HEADER, ROBOT, CpuLoad, make_pty, start_peer, summary_row
from hil.bench_stats import figure, write_json


def _gap(rng: random.Random, gap_ms: tuple[float, float]) -> None:
    time.sleep(rng.uniform(*gap_ms) / 1000)


def bare_pyserial(args: argparse.Namespace) -> dict[str, Any]:
    master, slave, path = make_pty()
    peer = start_peer(master, "--mode", "pong", "--warmup-s", "0", "--priority",
                      str(args.peer_priority))
    ser: Any = serial.Serial(path, baudrate=1_000_000, timeout=1.0)
    dec, seq, rng = FrameDecoder(), SeqCounter(), random.Random(2)
    lat: list[int] = []
    misses = 0
    try:
        for i in range(args.pings):
            t0 = time.perf_counter_ns()
            ser.write(encode(Ping(i), seq.next()))
            found = False
            deadline = time.monotonic() + 1.0
            while not found and time.monotonic() < deadline:
                data = ser.read(max(1, ser.in_waiting))
                t1 = time.perf_counter_ns()
                found = any(isinstance(f.msg, Pong) and f.msg.host_time_us == i
                            for f in dec.feed(data))
            if found:
                lat.append(t1 - t0)
            else:
                misses += 1
            _gap(rng, args.gap_ms)
    finally:
        ser.close()
        peer.kill()
        peer.wait()
        os.close(slave)
    return {"lat_ns": lat, "misses": misses}


def through_guardian(args: argparse.Namespace) -> dict[str, Any]:
    master, slave, path = make_pty()
    peer = start_peer(master, "--mode", "pong", "--warmup-s", "0", "--priority",
                      str(args.peer_priority))
    cond = threading.Condition()
    got: dict[int, int] = {}
    info: dict[str, Any] = {"relayed": 0}

    def on_frame(f: Frame) -> None:
        t = time.perf_counter_ns()
        info["relayed"] += 1
        if isinstance(f.msg, Pong):
            with cond:
                got[f.msg.host_time_us] = t
                cond.notify()
        elif isinstance(f.msg, GState):
            info["realtime"] = bool(f.msg.flags & GuardianFlag.REALTIME)
            info["up"] = f.msg.link_up

    client = GuardianClient(path, args.robot, 0.05, on_frame=on_frame, priority=args.priority,
                            stderr=subprocess.DEVNULL).start()
    rng = random.Random(2)
    lat: list[int] = []
    misses = 0
    try:
        deadline = time.monotonic() + 10
        while not info.get("up") and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(args.pings):
            t0 = time.perf_counter_ns()
            client.send(Ping(i))
            with cond:
                ok = cond.wait_for(lambda: i in got, timeout=1.0)  # noqa: B023 (used at once)
                t1 = got.pop(i, 0)
            if ok:
                lat.append(t1 - t0)
            else:
                misses += 1
            _gap(rng, args.gap_ms)
    finally:
        client.stop()
        peer.kill()
        peer.wait()
        os.close(slave)
    return {"lat_ns": lat, "misses": misses, **info}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hil.bench_relay", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pings", type=int, default=5000)
    p.add_argument("--priority", type=int, default=30, help="the guardian's SCHED_FIFO")
    p.add_argument("--peer-priority", type=int, default=30,
                   help="SCHED_FIFO for the firmware peer; 0: an ordinary process")
    p.add_argument("--gap-ms", type=float, nargs=2, default=(1.0, 2.0))
    p.add_argument("--load", action="store_true", help="a CPU-bound thread in this process")
    p.add_argument("--robot", default=str(ROBOT))
    p.add_argument("--json", metavar="PATH", help="write the figure records here (hil.bench)")
    args = p.parse_args(argv)
    sys.setswitchinterval(0.0005)
    load = CpuLoad() if args.load else None
    try:
        base = bare_pyserial(args)
        g = through_guardian(args)
    finally:
        if load is not None:
            load.stop()
    print(f"\nPING -> PONG round trip with STATUS at 1 kHz alongside (CPU-bound thread: "
          f"{'yes' if args.load else 'no'}; {os.cpu_count()} CPUs, load avg "
          f"{os.getloadavg()[0]:.2f}; shared machine)")
    print(HEADER)
    print(summary_row("baseline: bare pyserial", base["lat_ns"], f"misses {base['misses']}"))
    print(summary_row("through the guardian", g["lat_ns"], f"misses {g['misses']}"))
    print(f"guardian: SCHED_FIFO {'granted' if g.get('realtime') else 'not granted'} "
          f"(asked {args.priority}); frames relayed to the daemon {g['relayed']}")
    write_json(args.json, [figure(
        "link round trip: PING → PONG through the guardian (STATUS 1 kHz alongside)", "ms",
        [x / 1e6 for x in g["lat_ns"]], samples=True,
        baseline=("bare pyserial on a pty", [x / 1e6 for x in base["lat_ns"]]),
        notes=f"misses {g['misses']} (baseline {base['misses']}); CPU-bound thread "
              f"{'yes' if args.load else 'no'}; SCHED_FIFO "
              f"{'granted' if g.get('realtime') else 'not granted'}")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
