"""Benchmark: what the flight recorder costs — the control loop with it off vs on, same run.

    python -m hil.bench_recorder [--rounds 2] [--window-s 20]
    python -m hil.bench_recorder --in-process [--seconds 10]

Default: `edge-agent run --sim` started 3 × `rounds` times in turn, idle (HOLD at the loop's
rate, STATUS at 1 kHz from the simulated robot): `observe.record=false` ("off"), `true` with no
file open ("ring": the usual state, the ring fills), and `true` with an on-demand capture
(`record.start` … `record.stop`) over the whole window ("capture": every message encoded and
written). Per window,
at the robot: the COMMAND frames' arrival times (period error |Δt − period| as
hil/bench_control_loop.py, missed periods). Prints median, P99 and max for off and on and the
ratio to off; the recorder's CPU (its thread's CPU time over the window: record.stop's reply)
and the MCAP bytes per minute of the captures.

`--in-process`: the recorder alone in this process, fed from a 1 kHz thread with STATUS
frames (7 joints) plus the sensor picture at 100 Hz and a COMMAND at 200 Hz (the daemon's
rates in sim.toml), ring only and then ring + an open capture; prints the recorder thread's
CPU per second of stream and the bytes per minute written.
"""

from __future__ import annotations

import argparse
import shutil
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from hil.bench_control_loop import period_errors
from hil.bench_stats import figure, write_json
from hil.bench_stats import fmt as _fmt
from hil.bench_stats import ratio as _ratio
from hil.bench_stats import stats as _stats
from hil.daemon_proc import Control, request, start_sim_daemon, stop_daemon, wait_for


def _span_s(path: Path) -> float | None:
    """A finished file's message span (s) from its statistics; None while it is open."""
    from mcap.reader import make_reader

    try:
        with path.open("rb") as f:
            st = make_reader(f).get_summary()
    except Exception:  # not finished yet
        return None
    if st is None or st.statistics is None:
        return None
    return (st.statistics.message_end_time - st.statistics.message_start_time) / 1e9


def _window(tmp: Path, mode: str, window_s: float, settle_s: float) -> dict[str, Any]:
    on = mode == "capture"
    daemon = start_sim_daemon(tmp, ("mqtt.port=1", "device.id=bench-rec", "link.deadman_ms=250",
                                    "health.period_s=3600",
                                    f"observe.record={str(mode != 'off').lower()}"))
    rig, ctl = tmp / "rig.sock", Control(tmp)
    try:
        def up() -> bool:
            if daemon.poll() is not None:
                raise SystemExit("the daemon exited: " + (tmp / "daemon.log").read_text()[-600:])
            return bool(ctl.status()["link_up"])

        wait_for(up, 180, "the daemon's link up")
        time.sleep(settle_s)  # start-up work (the model's load, calibration) out of the window
        st = ctl.status()
        period = 1.0 / float(st["loop"]["rate_hz"])
        cpu0 = 0.0
        if on:
            r0 = ctl.call("record.start")
            if not r0.get("ok"):
                raise SystemExit(f"record.start refused: {r0}")
            cpu0 = r0["result"]["recorder"]["cpu_s"]
        t0 = request(rig, {"cmd": "ping"})["t"]
        time.sleep(window_s)
        t1 = request(rig, {"cmd": "ping"})["t"]
        out: dict[str, Any] = {"period": period, "seconds": t1 - t0}
        if on:
            r = ctl.call("record.stop")["result"]
            out["recorder"] = r["recorder"]
            out["cpu_s"] = r["recorder"]["cpu_s"] - cpu0  # the recorder thread, this window
            path = Path(r["path"])
            wait_for(lambda: ctl.status() and _span_s(path), 30, "the capture finished")
            out["mcap_bytes"], out["mcap_span_s"] = path.stat().st_size, _span_s(path)
        rec = request(rig, {"cmd": "record", "type": "COMMAND", "since": t0, "limit": 10**6},
                      timeout=60)
        times = sorted(f["t"] for f in rec["frames"] if f["t"] <= t1)
        out["err"], out["missed"], _ = period_errors(times, period)
        return out
    finally:
        stop_daemon(daemon)


MODES = ("off", "ring", "capture")


def daemon_run(rounds: int, window_s: float, settle_s: float) -> list[dict[str, object]]:
    """The default run (see the module docstring); returns its `--json` figure records."""
    err: dict[str, list[float]] = {m: [] for m in MODES}
    missed = dict.fromkeys(MODES, 0)
    cpu, seconds, mcap = [], [], []
    period = 0.0
    for k in range(len(MODES) * rounds):
        mode = MODES[k % len(MODES)]
        tmp = Path(tempfile.mkdtemp(prefix="edge-bench-rec-"))
        try:
            w = _window(tmp, mode, window_s, settle_s)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        period = w["period"]
        err[mode] += w["err"]
        missed[mode] += w["missed"]
        if mode == "capture":
            cpu.append(w["cpu_s"])
            seconds.append(w["seconds"])
            mcap.append((w["mcap_bytes"], w["mcap_span_s"]))
            print(f"  window {k + 1} (capture): recorder CPU {w['cpu_s']:.2f} s over "
                  f"{w['seconds']:.1f} s, tap dropped {w['recorder']['dropped']}, MCAP "
                  f"{w['mcap_bytes'] / 1e6:.2f} MB over {w['mcap_span_s']:.1f} s")
    st = {m: _stats(err[m]) for m in MODES}
    print(f"{len(MODES) * rounds} daemons in turn: recorder off / on (ring only, the usual "
          f"state) / on with a capture open all window; idle, {window_s:g} s windows, control "
          f"period {period * 1e3:g} ms; COMMAND period error at the robot:")
    for m in MODES:
        print(_fmt(f"  {m:8s}", st[m], f"  missed {missed[m]}"))
    for m in MODES[1:]:
        print(f"  ratio {m}/off: P99 {_ratio(st[m], st['off'], 'p99')}, median "
              f"{_ratio(st[m], st['off'], 'p50')}, max {_ratio(st[m], st['off'], 'max')}")
    print(f"  recorder CPU while capturing: {sum(cpu):.2f} s over {sum(seconds):.0f} s "
          f"({100 * sum(cpu) / sum(seconds):.1f} % of a core, the pre_s backlog included); "
          f"MCAP {sum(b for b, _ in mcap) / sum(s for _, s in mcap) * 60 / 1e6:.1f} MB per "
          f"minute of recording")
    what = {"ring": "recorder on (ring only, the usual state)",
            "capture": "recorder on with a capture open"}
    return [figure(f"idle control loop, {what[m]}: COMMAND period error", "ms", err[m],
                   baseline=("recorder off, same run", err["off"]),
                   notes=f"missed {missed[m]} (off {missed['off']})" + (
                       f"; recorder CPU {100 * sum(cpu) / sum(seconds):.1f} % of a core"
                       if m == "capture" else "")) for m in MODES[1:]]


def in_process(seconds: float) -> None:
    from edge_agent.link.messages import Command, Mode, Status, StatusFlag
    from edge_agent.observe import channels as ch
    from edge_agent.observe.recorder import Recorder, RecorderSettings
    from edge_agent.observe.tap import Tap

    sys.setswitchinterval(0.0002)  # as the daemon sets it (daemon/app.py)
    tap = Tap()
    tmp = Path(tempfile.mkdtemp(prefix="edge-bench-rec-ip-"))
    rec = Recorder(tmp, RecorderSettings(pre_s=10.0), tap=tap)
    rec.start()
    stop = threading.Event()
    publish_ns: list[int] = []

    def f32(*x: float) -> tuple[float, ...]:  # what a frame decoded from the wire holds
        return struct.unpack(f"<{len(x)}f", struct.pack(f"<{len(x)}f", *x))

    qs = [f32(*(0.1 * j + 1e-4 * i for j in range(7))) for i in range(1000)]
    grip = f32(0.012345, 0.23456, 3.14159)

    def feed() -> None:
        k, t_next = 0, time.monotonic()
        while not stop.is_set():
            q = qs[k % 1000]
            st = Status(k * 1000, StatusFlag(0), k, q, q, q, *grip)
            t0 = time.perf_counter_ns()
            tap.publish(ch.LINK_STATUS, st)
            publish_ns.append(time.perf_counter_ns() - t0)
            if k % 5 == 0:
                tap.publish(ch.LINK_TX, Command(Mode.POSITION, q))
            if k % 10 == 0:
                tap.publish(ch.EVENTS, {"type": "x", "k": k})
            k += 1
            t_next += 0.001
            time.sleep(max(0.0, t_next - time.monotonic()))

    th = threading.Thread(target=feed)
    th.start()
    try:
        time.sleep(1.0)
        c0 = rec.status()["cpu_s"]
        time.sleep(seconds)
        c1 = rec.status()["cpu_s"]
        path = rec.start_capture("bench")
        time.sleep(seconds)
        c2 = rec.status()["cpu_s"]
        rec.stop_capture()
        time.sleep(0.5)
    finally:
        stop.set()
        th.join()
        rec.stop()
    size = path.stat().st_size if path is not None else 0
    p = _stats([x / 1e3 for x in publish_ns])
    print(f"in-process: STATUS at 1 kHz (+ COMMAND 200 Hz, events 100 Hz), {seconds:g} s each")
    print(f"  recorder CPU, ring only:      {100 * (c1 - c0) / seconds:.1f} % of a core")
    print(f"  recorder CPU, ring + writing: {100 * (c2 - c1) / seconds:.1f} % of a core")
    print(f"  MCAP written: {size / seconds * 60 / 1e6:.1f} MB per minute (lz4)")
    print(f"  tap.publish on the feeding thread: median {p['p50']:.2f} us  P99 "
          f"{p['p99']:.2f} us  max {p['max']:.1f} us; dropped "
          f"{rec.status()['dropped']}")
    shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2,
                    help="rounds of off / ring / capture daemons (default 2)")
    ap.add_argument("--window-s", type=float, default=20.0)
    ap.add_argument("--settle-s", type=float, default=5.0)
    ap.add_argument("--in-process", action="store_true")
    ap.add_argument("--seconds", type=float, default=10.0, help="--in-process: per phase")
    ap.add_argument("--json", metavar="PATH",
                    help="write the figure records here (hil.bench; the default run only)")
    a = ap.parse_args(argv)
    if a.in_process:
        in_process(a.seconds)
    else:
        write_json(a.json, daemon_run(a.rounds, a.window_s, a.settle_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
