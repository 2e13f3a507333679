"""`python -m hil.rig`: the simulated robot(s) on real ptys, in real time, until SIGTERM/SIGINT.

    python -m hil.rig --robot configs/robot/edge-arm-4.toml [--rig configs/rig/default.toml]
        [--seed N] [--ptys N] [--tick-us US] [--spin-us US] [--control-socket PATH]
        [--record PATH] [--faults SCHEDULE] [--no-firmware-estop-hold] [--die-with-parent]

stdout: one line `PTY <device>` per robot, flushed once everything (control socket included) is
up — a parent reads exactly that many lines and then opens the devices. Everything else goes to
stderr. Robot i uses seed N+i. With more than 4 robots the default tick is 5 ms (20 robots at
1 kHz are more than one Python thread can step); `--tick-us` overrides.

Link `unplug` on a pty: the firmware goes silent and discards everything it is sent for the
duration (the device node stays; the host sees timeouts, as with a cable pulled at the robot end).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import TextIO

from edge_agent.errors import EdgeAgentError
from edge_agent.robot import load_robot
from hil.sim.config import load_rig
from hil.sim.control import ControlHandler, ControlServer
from hil.sim.faults import FaultError, load_schedule
from hil.sim.firmware import Firmware
from hil.sim.ptyrig import PtyPort, RealTimeRig
from hil.sim.record import FrameRecord

FLEET_TICK_US = 5000


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hil.rig", description=__doc__.splitlines()[0])
    p.add_argument("--robot", required=True, help="robot description (configs/robot/*.toml)")
    p.add_argument("--rig", default=None, help="rig settings (default configs/rig/default.toml)")
    p.add_argument("--seed", type=int, default=0, help="random seed (robot i uses seed+i)")
    p.add_argument("--ptys", type=int, default=1, help="number of independent robots")
    p.add_argument("--tick-us", type=int, default=None, help="firmware tick (status period floor)")
    p.add_argument("--spin-us", type=int, default=50, help="busy-wait before each deadline")
    p.add_argument("--control-socket", default=None, help="Unix socket for faults and queries")
    p.add_argument("--record", default=None, help="JSON-lines file of received frames")
    p.add_argument("--faults", default=None, help="fault schedule (TOML or JSON)")
    p.add_argument("--no-firmware-estop-hold", action="store_true",
                   help="the firmware does not latch on an e-stop press (daemon must stop)")
    p.add_argument("--die-with-parent", action="store_true",
                   help="exit when the parent process dies (Linux)")
    return p


def _die_with_parent() -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.ptys < 1:
        print("rig: --ptys must be >= 1", file=sys.stderr)
        return 2
    if args.die_with_parent:
        _die_with_parent()
    try:
        robot = load_robot(args.robot)
        rig = load_rig(args.rig, robot)
        tick = args.tick_us or (FLEET_TICK_US if args.ptys > 4 else rig.firmware_tick_us)
        rig = rig.replace(firmware_tick_us=tick, firmware_estop_hold=(
            rig.firmware_estop_hold and not args.no_firmware_estop_hold)).check(robot)
        schedule = load_schedule(args.faults) if args.faults else []
    except (EdgeAgentError, FaultError, OSError, ValueError) as exc:
        print(f"rig: {exc}", file=sys.stderr)
        return 2

    # The real-time thread shares the GIL with the control-socket thread: at Python's default
    # 5 ms switch interval a control request (a long `record` reply, say) could hold the
    # real-time thread back by that much, which benchmarks then read as the host's lateness.
    sys.setswitchinterval(0.0002)
    sink: TextIO | None = open(args.record, "w", encoding="utf-8") if args.record else None  # noqa: SIM115
    t0 = time.monotonic()
    fws: list[Firmware] = []
    ports: list[PtyPort] = []
    for i in range(args.ptys):
        rec = FrameRecord(sink=sink, robot=i)
        fw = Firmware(robot, rig, seed=args.seed + i, t0=t0, record=rec)
        fw.faults.schedule([s for s in schedule if s.robot in (None, i)])
        fws.append(fw)
        ports.append(PtyPort())
    lock = threading.Lock()
    rt = RealTimeRig(fws, ports, spin_s=args.spin_us * 1e-6, lock=lock)
    server = None
    if args.control_socket:
        server = ControlServer(args.control_socket, ControlHandler(fws, lock, rt.info))
        server.start()

    stopping: list[int] = []

    def _on_signal(signum: int, frame: object) -> None:
        # Only a flag: Event.set() here deadlocked when the signal interrupted Event.wait()
        # on the same event (the rig then outlived its tests, spinning, for ever).
        stopping.append(signum)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    rt.start()
    for p in ports:
        sys.stdout.write(f"PTY {p.path}\n")
    sys.stdout.flush()
    print(f"rig: {robot.name}, {len(fws)} robot(s), tick {tick} us, seed {args.seed}, "
          f"control {args.control_socket or '-'}", file=sys.stderr, flush=True)
    try:
        while not stopping:
            time.sleep(0.1)  # a signal interrupts it; the handler above has run by then
            if stopping:
                break
            if not rt.running:
                print("rig: real-time thread died", file=sys.stderr)
                return 1
    finally:
        rt.stop()
        if server is not None:
            server.stop()
        for p in ports:
            p.close()
        if sink is not None:
            with contextlib.suppress(OSError):
                sink.close()
        info = rt.info()
        print(f"rig: stopped after {info['uptime_s']:.1f} s, cpu {info['cpu_percent']:.1f} %, "
              f"overruns {info['overruns']}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
