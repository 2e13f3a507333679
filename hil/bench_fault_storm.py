"""Benchmark (issue #19): a fault storm, an e-stop a second, against the control loop and chat.

    python3 -m hil.bench_fault_storm [--seconds 60] [--rate-hz 500] [--mqtt-port 0]

Starts `edge-agent run --sim` with `debug.failure_injection` on and `reports.webhook_url` at a
real local HTTP receiver (hil/webhook_receiver.py, answering as WeCom does). Two windows of
`--seconds` each, in the same run: quiet, then the storm — every second `failure.inject estop
press` on the control socket, the release, and a `reset` (each press is one e-stop report; the
latch and the reset are polled every 50 ms, as an operator's screen might; resets are
rate-limited — `executor.reset_min_interval_s` — so at a fault a second a reset waits for the
previous one's second to pass: the `rate_limited` refusals). The
simulated robot records the arrival time of every COMMAND frame (the daemon streams them at the
control rate also while idle or latched: holds); the period error of that stream in each window
is the control loop's figure (as in hil.bench_control_loop). Then it waits for the outbox to
drain and counts what reached the receiver: messages, the most in any 60 s, and reports carried
(merged repeats count each report they carry).
"""

from __future__ import annotations

import argparse
import itertools
import tempfile
import time
from pathlib import Path
from typing import Any

from hil.bench_control_loop import fmt, period_errors, summarize
from hil.bench_daemon_estop import private_broker
from hil.bench_stats import figure, target, write_json
from hil.daemon_proc import Control, request, start_sim_daemon, stop_daemon, wait_for
from hil.steal import StealMeter
from hil.webhook_receiver import Receiver

TOKEN = "bench-storm-token"


def command_times(rig: Path, t0: float, t1: float) -> list[float]:
    """Arrival times of the COMMAND frames the robot received in [t0, t1]."""
    rec = request(rig, {"cmd": "record", "type": "COMMAND", "since": t0, "limit": 10**6},
                  timeout=60)
    return sorted(f["t"] for f in rec["frames"] if f["t"] <= t1)


def missed_inside(times: list[float], period: float,
                  spans: list[tuple[float, float]]) -> int:
    """Missed periods (gaps ≥ 1.5 periods) that overlap one of `spans` (press → reset done)."""
    n = 0
    for a, b in itertools.pairwise(times):
        if b - a >= 1.5 * period and any(s0 < b and s1 > a for s0, s1 in spans):
            n += max(0, round((b - a) / period) - 1)
    return n


def longest_gaps(times: list[float], spans: list[tuple[float, float]]
                 ) -> list[tuple[float, float]]:
    """Per span: (the longest COMMAND gap overlapping it in ms, where it began in ms after the
    press) — is the stream's silence at the latch, at the reset, or spread out?"""
    out = []
    for s0, s1 in spans:
        gaps = [(b - a, a - s0) for a, b in itertools.pairwise(times) if a < s1 and b > s0]
        g, at = max(gaps, default=(0.0, 0.0))
        out.append((g * 1e3, at * 1e3))
    return out


def reports_carried(body: dict[str, Any], key: str) -> list[str]:
    """The report ids one WeCom markdown message stands for (a merged one names them all)."""
    ids = body.get("report_ids")
    return [str(i) for i in ids] if isinstance(ids, list) else [key]


def most_in_window(times: list[float], window_s: float) -> int:
    """The most arrivals inside any `window_s` (sliding)."""
    times = sorted(times)
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while t - times[lo] > window_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=int, default=60, help="length of each window (faults: one "
                                                            "a second in the storm window)")
    ap.add_argument("--rate-hz", type=float, default=500.0)
    ap.add_argument("--mqtt-port", type=int, default=0, help="0: a private broker")
    ap.add_argument("--drain-s", type=float, default=180.0,
                    help="how long to wait for the outbox to deliver everything after the storm")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra daemon config override (repeatable)")
    ap.add_argument("--json", metavar="PATH", help="write the figure records here (hil.bench)")
    args = ap.parse_args(argv)
    period = 1.0 / args.rate_hz
    tmp = Path(tempfile.mkdtemp(prefix="edge-bench-storm-"))
    recv = Receiver().start()
    broker = None
    if args.mqtt_port == 0:
        broker, args.mqtt_port = private_broker(tmp)
    daemon = start_sim_daemon(tmp, (
        f"mqtt.port={args.mqtt_port}", "device.id=bench-storm", f"control.rate_hz={args.rate_hz}",
        "debug.failure_injection=true", f'reports.webhook_url="{recv.url(TOKEN)}"', *args.set))
    rig, ctl = tmp / "rig.sock", Control(tmp)
    call, status = ctl.call, ctl.status

    steal_quiet, steal_storm = StealMeter(), StealMeter()
    faults, reset_waits = 0, []
    spans: list[tuple[float, float]] = []  # (press sent, reset accepted): the robot is held
    try:
        wait_for(lambda: status()["link_up"], 60, "the daemon's link up")
        wait_for(lambda: {"estimators", "calibration"} <= set(status()["background"]), 60,
                 "the start-up work after READY (estimators, calibration)")
        # quiet window
        steal_quiet.start()
        q0 = request(rig, {"cmd": "ping"})["t"]
        time.sleep(args.seconds)  # not synchronisation: the window's length
        q1 = request(rig, {"cmd": "ping"})["t"]
        steal_quiet.stop()
        # storm window: a fault a second
        steal_storm.start()
        s0 = request(rig, {"cmd": "ping"})["t"]
        t_next = time.monotonic()
        for _ in range(args.seconds):
            time.sleep(max(0.0, t_next - time.monotonic()))  # the storm's own clock
            t_next += 1.0
            t_p = time.monotonic()
            r = call("failure.inject", target="estop", mode="press")
            if not r.get("ok"):
                raise SystemExit(f"failure.inject refused: {r}")
            faults += 1
            wait_for(lambda: status()["mode"] == "estop", 10, "the e-stop latched", poll_s=0.05)
            call("failure.inject", target="estop", mode="release")
            t_r = time.monotonic()
            wait_for(lambda: call("reset")["ok"], 10, "reset accepted", poll_s=0.05)
            reset_waits.append(time.monotonic() - t_r)
            spans.append((t_p, time.monotonic()))
        s1 = request(rig, {"cmd": "ping"})["t"]
        steal_storm.stop()
        quiet_t = command_times(rig, q0, q1)
        storm_t = command_times(rig, s0, s1)
        t_drain = time.monotonic()
        wait_for(lambda: status()["reports"]["pending"] == 0, args.drain_s,
                 "the outbox to deliver every report", poll_s=0.5)
        drain_s = time.monotonic() - t_drain
        st = status()
    finally:
        stop_daemon(daemon)
        if broker is not None:
            broker.terminate()
            broker.wait(5)
        recv.stop()
    reqs = recv.snapshot()
    unique = recv.unique()
    arrivals = [r["at"] for r in reqs]
    ids = [i for k, r in unique.items() if r["body"].get("msgtype") == "markdown"
           for i in reports_carried(r["body"], k)]
    quiet, storm = (summarize(*period_errors(t, period)) for t in (quiet_t, storm_t))
    held = missed_inside(storm_t, period, spans)
    rep = st["reports"]
    print(f"fault storm: {faults} e-stops, one a second over {args.seconds} s "
          f"(failure.inject estop press, release, reset; reset accepted after "
          f"{1e3 * sorted(reset_waits)[len(reset_waits) // 2]:.0f} ms median)")
    print(fmt("control loop, quiet window ", quiet) + f"; {steal_quiet.describe()}")
    print(fmt("control loop, storm window ", storm) + f"; {steal_storm.describe()}")
    print(f"  of the storm's missed periods, {held} overlap a press → reset-accepted span "
          f"({sum(b - a for a, b in spans):.1f} s of {args.seconds} s); the longest gap in "
          "each (ms, began ms after the press; reset accepted ms after the press): "
          + ", ".join(f"{g:.0f}@{at:.0f}/{1e3 * (s1 - s0):.0f}"
                      for (g, at), (s0, s1) in zip(longest_gaps(storm_t, spans), spans,
                                                   strict=True)))
    print(f"reports: built {rep['built']}, delivered {rep['delivered']}, failed attempts "
          f"{rep['failed_attempts']}, dropped {rep['dropped']}; outbox drained "
          f"{drain_s:.1f} s after the storm")
    print(f"webhook receiver: {len(reqs)} requests, {len(unique)} after de-duplication by key; "
          f"most in any 60 s: {most_in_window(arrivals, 60.0)} (limit 20 a minute); reports "
          f"carried: {len(ids)} ({len(set(ids))} distinct) of {rep['built']} built")
    kinds: dict[str, int] = {}
    for r in unique.values():
        k = str(r["body"].get("msgtype"))
        kinds[k] = kinds.get(k, 0) + 1
    print(f"  messages by type: {kinds}")
    print(f"logs: {tmp / 'daemon.log'}")
    most = most_in_window(arrivals, 60.0)
    write_json(args.json, [
        figure("control loop during the storm (an e-stop a second): COMMAND period error",
               "ms", period_errors(storm_t, period)[0],
               series=[(t - storm_t[0], e) for t, e in zip(
                   storm_t[1:], period_errors(storm_t, period)[0], strict=True)],
               baseline=("quiet window, same run", period_errors(quiet_t, period)[0]),
               notes=f"{faults} e-stops; missed periods {storm.get('missed', 0):.0f} (quiet "
                     f"{quiet.get('missed', 0):.0f}), {held} of them while held"),
        figure("webhook messages in any 60 s of the storm", "messages",
               st={"n": 1, "p50": most, "p99": most, "max": most},
               tgt=target("≤ 20 a minute; every report delivered to every sink", 20, most,
                          met=most <= 20 and not rep["dropped"] and all(
                              int(n) >= rep["built"] for n in rep["delivered"].values())),
               notes=f"reports built {rep['built']}, delivered {rep['delivered']}, dropped "
                     f"{rep['dropped']}; carried {len(set(ids))} distinct; outbox drained "
                     f"{drain_s:.1f} s after the storm")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
