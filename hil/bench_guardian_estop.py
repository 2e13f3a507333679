"""Benchmark: the link guardian's e-stop reaction on a real pty, with a busy daemon beside it.

    python3 -m hil.bench_guardian_estop [--edges 10000] [--priority 30] [--no-load]

A firmware peer process (`python -m hil.peer`) on the pty master streams STATUS at 1 kHz and
toggles the e-stop input (SCHED_FIFO by default: real firmware does not queue for a host CPU, so
its scheduling is kept out of the figures); it times each press from writing ESTOP_EDGE to reading
the STOP frame back. This process is the daemon side: a GuardianClient, a 200 Hz POSITION command
stream, a reset + ENABLE after every release, `sys.setswitchinterval(0.0005)`, and a CPU-bound
Python thread (unless --no-load). Same-run baseline: the pty round trip, the same peer and load
with a bare echo process (same scheduling) in the guardian's place. Target: guardian P99 ≤ 1 ms.
The guardian's own share (select() returning → STOP written) comes from its exit log. The machine
is shared: read the figures beside the baseline, not alone.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
import tty
from pathlib import Path
from typing import Any

from edge_agent.link.codec import Command, Enable, Frame, GripperMode, GState, Mode
from edge_agent.link.guardian_client import GuardianClient
from edge_agent.link.guardian_rules import GuardianFlag
from edge_agent.link.transport import PortLost, open_transport
from hil.bench_stats import figure, stats, target, write_json

ROOT = Path(__file__).resolve().parents[1]
ROBOT = ROOT / "configs" / "robot" / "edge-arm-4.toml"


# --------------------------------------------------------------------------- shared helpers


def percentile(sorted_ms: list[float], p: float) -> float:
    if not sorted_ms:
        return math.nan
    return sorted_ms[max(0, math.ceil(p / 100 * len(sorted_ms)) - 1)]


def summary_row(name: str, lat_ns: list[int], extra: str = "") -> str:
    ms = sorted(x / 1e6 for x in lat_ns)
    return (f"{name:<22} {len(ms):>7} {percentile(ms, 50):>8.3f} {percentile(ms, 99):>8.3f} "
            f"{percentile(ms, 99.9):>9.3f} {ms[-1] if ms else math.nan:>8.3f}  {extra}")


HEADER = f"{'':<22} {'n':>7} {'P50 ms':>8} {'P99 ms':>8} {'P99.9 ms':>9} {'max ms':>8}"


class CpuLoad:
    """A CPU-bound pure-Python thread in this (daemon-side) process: holds the GIL in turns."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._spin, name="cpu-load", daemon=True)
        self._t.start()

    def _spin(self) -> None:
        while not self._stop.is_set():
            sum(i * i for i in range(20000))

    def stop(self) -> None:
        self._stop.set()
        self._t.join()


def make_pty() -> tuple[int, int, str]:
    """A raw pty: (master, slave, slave path). Keep the slave open so the pty outlives reopens."""
    master, slave = os.openpty()
    tty.setraw(slave)
    return master, slave, os.ttyname(slave)


def start_peer(master: int, *args: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-m", "hil.peer", "--fd", str(master), *args],
                            pass_fds=(master,), stdout=subprocess.PIPE, text=True, cwd=ROOT)
    os.close(master)
    return proc


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# --------------------------------------------------------------------------- phases


def run_echo(path: str, priority: int) -> int:
    """The baseline's stand-in for the guardian: every byte from the tty goes straight back."""
    if priority > 0:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    t = open_transport(path)
    try:
        while True:
            select.select([t.fileno()], [], [])
            data = t.read()
            if data:
                t.write(data, urgent=False)
    except PortLost:
        return 0
    finally:
        t.close()


def baseline(args: argparse.Namespace) -> dict[str, Any]:
    master, slave, path = make_pty()
    echo = subprocess.Popen([sys.executable, "-m", "hil.bench_guardian_estop", "--echo", path,
                             "--priority", str(args.priority)], cwd=ROOT)
    peer = start_peer(master, "--priority", str(args.peer_priority),
                      "--edges", str(args.baseline_edges), "--reply", "echo",
                      "--warmup-s", "1.0", "--gap-ms", *map(str, args.gap_ms))
    out, _ = peer.communicate()
    echo.terminate()
    echo.wait()
    os.close(slave)
    res: dict[str, Any] = json.loads(out)
    return res


def guardian(args: argparse.Namespace) -> dict[str, Any]:
    master, slave, path = make_pty()
    peer = start_peer(master, "--priority", str(args.peer_priority),
                      "--edges", str(args.edges), "--reply", "stop",
                      "--warmup-s", "2.0", "--gap-ms", *map(str, args.gap_ms))
    done = threading.Event()
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 (the guardian's log; closed below)
    info: dict[str, Any] = {"states": 0, "resets": 0, "enables": 0, "send_errors": 0}
    client: GuardianClient

    def on_frame(f: Frame) -> None:
        s = f.msg
        if not isinstance(s, GState):
            return
        info["states"] += 1
        info["realtime"] = bool(s.flags & GuardianFlag.REALTIME)
        if done.is_set():
            return
        try:
            if s.latched and not s.estop_input and s.link_up:
                client.reset()
                info["resets"] += 1
            elif not s.latched and s.flags & GuardianFlag.NEED_ENABLE:
                client.send(Enable(True))
                info["enables"] += 1
        except Exception as exc:
            info["send_errors"] += 1
            info["last_send_error"] = repr(exc)

    client = GuardianClient(path, args.robot, 0.05, on_frame=on_frame, priority=args.priority,
                            stderr=log.fileno())
    client.start()

    def stream() -> None:
        cmd = Command(Mode.POSITION, (0.125, 1.0, -1.0, 0.0), GripperMode.POSITION, 0.03, 0.75)
        period = 1.0 / args.rate_hz
        nxt = time.monotonic()
        while not done.is_set():
            try:
                client.send(cmd)
            except Exception as exc:
                info["send_errors"] += 1
                info["last_send_error"] = repr(exc)
            nxt += period
            time.sleep(max(0.0, nxt - time.monotonic()))

    streamer = threading.Thread(target=stream, name="commands", daemon=True)
    streamer.start()
    pid = client.pid
    cpu0, t0 = cpu_seconds(pid or 0), time.monotonic()
    out, _ = peer.communicate()
    info["guardian_cpu_pct"] = 100 * (cpu_seconds(pid or 0) - cpu0) / (time.monotonic() - t0)
    done.set()
    streamer.join()
    client.stop()
    os.close(slave)
    res: dict[str, Any] = json.loads(out)
    res.update(info)
    log.seek(0)
    for line in log:
        rec = json.loads(line)
        if rec.get("event") == "exit":
            res["own_share"] = rec["stop_reaction"]
        if args.verbose:
            print("guardian log:", line.strip())
    log.close()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m hil.bench_guardian_estop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--edges", type=int, default=10000, help="press edges through the guardian")
    p.add_argument("--baseline-edges", type=int, default=None, help="default: --edges")
    p.add_argument("--priority", type=int, default=30, help="SCHED_FIFO for guardian and echo")
    p.add_argument("--peer-priority", type=int, default=30,
                   help="SCHED_FIFO for the firmware peer (real firmware does not wait for a "
                        "host CPU); 0: an ordinary process")
    p.add_argument("--rate-hz", type=float, default=200.0, help="daemon command rate")
    p.add_argument("--gap-ms", type=float, nargs=2, default=(1.0, 3.0),
                   help="random pause after each press and release")
    p.add_argument("--no-load", action="store_true", help="no CPU-bound thread")
    p.add_argument("--robot", default=str(ROBOT))
    p.add_argument("-v", "--verbose", action="store_true", help="print the guardian's log")
    p.add_argument("--json", metavar="PATH", help="write the figure records here (hil.bench)")
    p.add_argument("--echo", metavar="PATH", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.echo:
        return run_echo(args.echo, args.priority)
    if args.baseline_edges is None:
        args.baseline_edges = args.edges
    sys.setswitchinterval(0.0005)
    load = None if args.no_load else CpuLoad()
    try:
        base = baseline(args)
        g = guardian(args)
    finally:
        if load is not None:
            load.stop()
    print(f"\nE-stop reaction: ESTOP_EDGE written at the firmware peer -> STOP read back there "
          f"(CPU-bound thread in the daemon process: {'no' if args.no_load else 'yes'}; "
          f"commands {args.rate_hz:g} Hz; {os.cpu_count()} CPUs, load avg "
          f"{os.getloadavg()[0]:.2f}; shared machine)")
    print(HEADER)
    print(summary_row("baseline: pty echo", base["lat_ns"], f"misses {base['misses']}"))
    print(summary_row("guardian", g["lat_ns"], f"misses {g['misses']}"))
    own = g.get("own_share", {})
    if own.get("n"):
        print(f"{'  its own share':<22} {own['n']:>7} {own['p50_ms']:>8.3f} {own['p99_ms']:>8.3f} "
              f"{'':>9} {own['max_ms']:>8.3f}  (select() returned -> STOP written, in-process)")
    print(f"guardian: SCHED_FIFO {'granted' if g.get('realtime') else 'not granted'} "
          f"(asked {args.priority}; peer {args.peer_priority or 'SCHED_OTHER'}); "
          f"CPU {g['guardian_cpu_pct']:.1f}% of one core; "
          f"POSITION commands forwarded to the tty {g['position_commands']}; "
          f"resets {g['resets']}, enables {g['enables']}, send errors {g['send_errors']} "
          f"{g.get('last_send_error', '')}")
    lat = [x / 1e6 for x in g["lat_ns"]]
    write_json(args.json, [figure(
        "guardian e-stop: ESTOP_EDGE → STOP at the peer (pty, CPU-bound thread beside)", "ms",
        lat, baseline=("pty echo round trip", [x / 1e6 for x in base["lat_ns"]]),
        tgt=target("P99 ≤ 1 ms", 1.0, stats(lat).get("p99")), samples=True,
        notes=f"misses {g['misses']} (baseline {base['misses']}); SCHED_FIFO "
              f"{'granted' if g.get('realtime') else 'not granted'}; the guardian's own share "
              f"(select() → STOP written) P99 "
              + (f"{own['p99_ms']:.3f} ms" if own.get("n") else "not logged"))])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
