"""Benchmark: the daemon's control loop at 500 Hz mid-task, measured at the robot.

    python3 -m hil.bench_control_loop [--rate-hz 500] [--seconds 6] [--mqtt-port 1883]

Starts `edge-agent run --sim` with `control.rate_hz` set, runs a pick-and-place task (telemetry
on when a broker answers), and reads back from the simulated robot the arrival times of the
COMMAND frames it received (time.monotonic, the same clock for every process on the machine)
while the task moved. Period error = |Δt − period|; a missed period is a gap of ≥ 1.5 periods.
Same-run baseline: a bare Python loop in its own process (absolute deadlines, sleep + short spin,
nothing else to do) timing its own ticks. Targets (issue): P99 period error ≤ 0.5 ms and missed
periods ≤ 1e-4.
"""

from __future__ import annotations

import argparse
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hil.bench_daemon_estop import _request, _wait

ROOT = Path(__file__).resolve().parents[1]

BARE_LOOP = r"""
import sys, time
period = 1.0 / float(sys.argv[1]); n = int(sys.argv[2]); spin = 0.0002
out = []; mono = time.monotonic; deadline = mono() + period
for _ in range(n):
    rem = deadline - mono()
    if rem > spin:
        time.sleep(rem - spin)
    while mono() < deadline:
        pass
    out.append(mono())
    deadline += period
print(" ".join(repr(t) for t in out))
"""


def period_stats(times: list[float], period: float) -> dict[str, float]:
    gaps = [b - a for a, b in itertools.pairwise(times)]
    if not gaps:
        return {"n": 0}
    err = sorted(abs(g - period) * 1e3 for g in gaps)
    missed = sum(max(0, round(g / period) - 1) for g in gaps if g >= 1.5 * period)
    expected = (times[-1] - times[0]) / period
    return {"n": len(gaps), "p50_ms": err[len(err) // 2], "p99_ms": err[int(0.99 * len(err))],
            "max_ms": err[-1], "missed": missed, "missed_ratio": missed / max(1.0, expected)}


def fmt(name: str, s: dict[str, float]) -> str:
    if not s.get("n"):
        return f"{name}: no samples"
    return (f"{name}: n={s['n']:.0f}  period error P50 {s['p50_ms']:.3f} ms  P99 "
            f"{s['p99_ms']:.3f} ms  max {s['max_ms']:.3f} ms  missed {s['missed']:.0f} "
            f"({s['missed_ratio']:.2e})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate-hz", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=6.0, help="measurement window mid-task")
    ap.add_argument("--mqtt-port", type=int, default=1883)
    args = ap.parse_args(argv)
    period = 1.0 / args.rate_hz
    tmp = Path(tempfile.mkdtemp(prefix="edge-bench-loop-"))
    cmd = [sys.executable, "-m", "edge_agent.cli", "run", "--config",
           str(ROOT / "configs" / "sim.toml"), "--sim"]
    for s in (f"state_dir={tmp}", f"mqtt.port={args.mqtt_port}", "device.id=bench-loop",
              f"control.rate_hz={args.rate_hz}", "mqtt.telemetry_hz=20",
              "link.hello_timeout_s=10", "sim.rig_priority=40"):
        cmd += ["--set", s]
    log = open(tmp / "daemon.log", "w")  # noqa: SIM115 - lives as long as the daemon
    daemon = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                              start_new_session=True)
    rig, ctl = tmp / "rig.sock", tmp / "control.sock"

    def call(name: str, **kw: object) -> dict[str, object]:
        return _request(ctl, {"cmd": name, "v": 1, "id": os.urandom(6).hex(), **kw})

    try:
        _wait(lambda: call("status")["result"]["link_up"], 60, "the daemon's link up")  # type: ignore[index]
        started = call("task.start")
        if not started.get("ok"):
            raise SystemExit(f"task.start refused: {started}")
        _wait(lambda: call("status")["result"]["mode"] == "running", 30, "running")  # type: ignore[index]
        t0 = _request(rig, {"cmd": "ping"})["t"]
        time.sleep(args.seconds)
        t1 = _request(rig, {"cmd": "ping"})["t"]
        st = call("status")["result"]
        rec = _request(rig, {"cmd": "record", "type": "COMMAND", "since": t0, "limit": 10**6},
                       timeout=60)
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
    arrivals = sorted(f["t"] for f in rec["frames"] if f["t"] <= t1)
    n = max(10, round(args.seconds * args.rate_hz))
    bare = subprocess.run([sys.executable, "-c", BARE_LOOP, str(args.rate_hz), str(n)],
                          capture_output=True, text=True, check=True)
    bare_times = [float(x) for x in bare.stdout.split()]
    print(f"rate {args.rate_hz:g} Hz (period {period * 1e3:.2f} ms), window {args.seconds:g} s "
          f"mid-task; executor state at the end: {st['state']}")  # type: ignore[index]
    print(fmt("daemon, COMMAND arrivals at the robot", period_stats(arrivals, period)))
    print(fmt("bare Python loop, own tick times     ", period_stats(bare_times, period)))
    print(f"daemon loop counters: {st['loop']}")  # type: ignore[index]
    print(f"logs: {tmp / 'daemon.log'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
