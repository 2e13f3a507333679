"""Benchmark: what a shadow candidate costs the control loop — shadow off vs on, same run.

    python -m hil.bench_shadow [--pairs 4] [--candidate PATH] [--set control.decision_hz=200]

Starts `edge-agent run --sim` with the trained model acting and runs pick-and-place tasks back to
back in alternating windows: a task with no shadow, then a task with `model.shadow` running a
candidate (default: a copy of the shipped model — the same network, so the same work as the
acting model per decision; `--candidate` for another), started before and stopped after that
task (a shadow is started and stopped between tasks). Per window, at the robot: the COMMAND
frames' arrival times from the simulated robot (period error |Δt − period|, missed periods ≥ 1.5
periods, as hil/bench_control_loop.py); in the daemon: each acting decision's latency from the
decision journal (the router's request → decision, on the control thread). Prints median, P99
and max for both sets of windows and the ratio on/off, and the shadow's own figures (dropped,
candidate latency). `--in-process` measures the seam alone, without the robot: a 200 Hz loop
thread in this process (absolute deadlines, as the control loop) that hands a recorded decision
to `ShadowRunner.offer()` every tick (SCHED_FIFO 20 as sim.toml's control thread, `--priority`),
in alternating 2 s windows with no shadow, and with the
shadow's worker running the candidate; it prints the ticks' lateness and what `offer()` itself
took on the loop thread. Alternating windows in one run keep the VM's minute-to-minute noise out of
the comparison; on a 2-core shared VM the ratio still moves by some tens of percent run to run.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import tempfile
from pathlib import Path
from typing import Any

from hil.bench_control_loop import period_errors
from hil.bench_stats import figure, write_json
from hil.bench_stats import fmt as _fmt
from hil.bench_stats import ratio as _ratio
from hil.bench_stats import stats as _stats
from hil.daemon_proc import ROOT, Control, request, start_sim_daemon, stop_daemon, wait_for

SHIPPED = ROOT / "models" / "pick-place-policy.onnx"


def _decision_latencies(state_dir: Path, t0: float, t1: float) -> list[float]:
    from edge_agent.store.decisions import journal_dir, read_decisions

    return [d.latency_ms for d in read_decisions(journal_dir(state_dir))
            if t0 <= d.t <= t1 and d.latency_ms == d.latency_ms]


def in_process(candidate: Path, windows: int, window_s: float = 2.0,
               rate_hz: float = 200.0, worker_priority: int = 1, priority: int = 20) -> None:
    """The seam alone (see the module docstring)."""
    import os
    import sys
    import threading
    import time

    import numpy as np

    from edge_agent.inference.assembly import ACTION_LABELS, OBS_FIELD_UNITS
    from edge_agent.inference.backend import DecisionRecord
    from edge_agent.inference.model_cache import ModelCache
    from edge_agent.inference.model_card import ModelCard
    from edge_agent.inference.shadow import ShadowRunner
    from edge_agent.policy_seam import OBS_DIM

    sys.setswitchinterval(0.0002)  # as the daemon sets it (daemon/app.py)
    tmp = Path(tempfile.mkdtemp(prefix="edge-bench-shadow-ip-"))
    cache = ModelCache(tmp, fields=OBS_FIELD_UNITS, labels=ACTION_LABELS)
    data = candidate.read_bytes()
    card_path = candidate.with_suffix(".card.json")
    card = ModelCard.load(card_path) if card_path.exists() else None
    session, card = cache.verify(data, card, sha256=hashlib.sha256(data).hexdigest())[:2]
    rng = np.random.default_rng(0)
    recs = [DecisionRecord(0.0, "approach", tuple(float(x) for x in rng.uniform(-1, 1, OBS_DIM)),
                           "continue", "local", 0.2, "ok", ()) for _ in range(256)]
    period = 1.0 / rate_hz
    late: dict[bool, list[float]] = {False: [], True: []}
    offer: dict[bool, list[float]] = {False: [], True: []}
    runner: ShadowRunner | None = None
    fifo_refused: list[str] = []
    for k in range(2 * windows):
        on = k % 2 == 1
        runner = (ShadowRunner(session, card, report_after=0, priority=worker_priority)
                  if on else None)
        if runner is not None:
            runner.start()  # from this thread: SCHED_OTHER, as the daemon's command worker

        def loop(on: bool = on, runner: ShadowRunner | None = runner) -> None:
            if priority > 0:  # this thread only, as the daemon's control thread
                try:
                    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
                except OSError as exc:
                    fifo_refused.append(str(exc))
            deadline = time.monotonic() + period
            end = deadline + window_s
            i = 0
            while deadline < end:
                rem = deadline - time.monotonic()
                if rem > 0:
                    time.sleep(rem)
                late[on].append(max(0.0, time.monotonic() - deadline) * 1e3)
                t0 = time.perf_counter()
                if runner is not None:
                    runner.offer(recs[i % len(recs)])
                offer[on].append((time.perf_counter() - t0) * 1e3)
                i += 1
                deadline += period

        t = threading.Thread(target=loop, name="loop")
        t.start()
        t.join()
        if runner is not None:
            s = runner.stop()
            print(f"  window {k + 1}: shadow compared {s['decisions']}, dropped {s['dropped']}, "
                  f"candidate P99 {s['latency']['shadow_p99_ms']} ms")
    shutil.rmtree(tmp, ignore_errors=True)
    a, b = _stats(late[False]), _stats(late[True])
    how = f"SCHED_FIFO {priority}" if priority > 0 and not fifo_refused else "SCHED_OTHER"
    print(f"in-process {rate_hz:g} Hz loop thread ({how}; shadow worker "
          f"{'SCHED_FIFO ' + str(worker_priority) if worker_priority else 'SCHED_OTHER'}), "
          f"{windows} + {windows} windows of {window_s:g} s, a decision offered every tick; "
          f"candidate {candidate.name}" + (f"; FIFO refused: {fifo_refused[0]}"
                                           if fifo_refused else ""))
    print(_fmt("  tick lateness, shadow off", a))
    print(_fmt("  tick lateness, shadow on ", b))
    print(_fmt("  offer() on the loop thread, shadow on", _stats(offer[True])))
    print(f"  ratio on/off: lateness P99 {_ratio(b, a, 'p99')}, median {_ratio(b, a, 'p50')}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4, help="off/on task pairs (default 4)")
    ap.add_argument("--candidate", type=Path, default=None,
                    help="the shadow's model (default: a copy of the shipped model)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra daemon config override (repeatable), e.g. "
                         "control.decision_hz=100 with inference.deadline_ms=10 (five times "
                         "sim.toml's decisions, and shadow runs)")
    ap.add_argument("--in-process", action="store_true",
                    help="the seam alone: a 200 Hz loop thread offering every tick, no daemon")
    ap.add_argument("--worker-priority", type=int, default=1,
                    help="--in-process: the shadow worker's SCHED_FIFO, as "
                         "inference.shadow_priority (0: SCHED_OTHER)")
    ap.add_argument("--priority", type=int, default=20,
                    help="--in-process: the loop thread's SCHED_FIFO priority, as "
                         "control.priority (0: SCHED_OTHER)")
    ap.add_argument("--json", metavar="PATH",
                    help="write the figure records here (hil.bench; the daemon run only)")
    a = ap.parse_args(argv)
    if a.in_process:
        in_process(a.candidate or SHIPPED, a.pairs, worker_priority=a.worker_priority,
                   priority=a.priority)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="edge-bench-shadow-"))
    drop = tmp / "drop"
    drop.mkdir(mode=0o755)
    src = a.candidate or SHIPPED
    cand = drop / "candidate.onnx"
    shutil.copyfile(src, cand)
    card = src.with_suffix(".card.json")
    if card.exists():
        shutil.copyfile(card, cand.with_suffix(".card.json"))
    sha = hashlib.sha256(cand.read_bytes()).hexdigest()
    daemon = start_sim_daemon(tmp, ("mqtt.port=1", "device.id=bench-shadow",
                                    f"inference.update_dir={drop}",
                                    "inference.shadow_report_after=0",
                                    "link.deadman_ms=250", *a.set))
    rig, ctl = tmp / "rig.sock", Control(tmp)
    err: dict[bool, list[float]] = {False: [], True: []}
    missed: dict[bool, int] = {False: 0, True: 0}
    lat: dict[bool, list[float]] = {False: [], True: []}
    seconds: dict[bool, float] = {False: 0.0, True: 0.0}
    ok_tasks: dict[bool, int] = {False: 0, True: 0}
    shadows: list[dict[str, Any]] = []
    try:
        def up() -> bool:
            if daemon.poll() is not None:
                raise SystemExit("the daemon exited: " + (tmp / "daemon.log").read_text()[-600:])
            return bool(ctl.status()["link_up"])

        wait_for(up, 180, "the daemon's link up")
        wait_for(lambda: (ctl.status()["inference"] or {}).get("model"), 120, "the model")
        st = ctl.status()
        period = 1.0 / float(st["loop"]["rate_hz"]) if st.get("loop") else 1 / 200
        for k in range(2 * a.pairs):
            on = k % 2 == 1
            if on:
                r = ctl.call("model.shadow", uri=str(cand), sha256=sha)
                if not r.get("ok"):
                    raise SystemExit(f"model.shadow refused: {r}")
            started = ctl.call("task.start")
            if not started.get("ok"):
                raise SystemExit(f"task {k + 1}: task.start refused: {started}")
            t0 = request(rig, {"cmd": "ping"})["t"]
            wait_for(lambda: ctl.status()["mode"] != "running", 120, f"task {k + 1}", poll_s=0.5)
            t1 = request(rig, {"cmd": "ping"})["t"]
            ok_tasks[on] += ctl.status()["mode"] == "idle"
            if ctl.status()["mode"] != "idle":
                ctl.call("reset")
                wait_for(lambda: ctl.status()["mode"] in ("idle", "holding"), 30, "a reset")
                if ctl.status()["mode"] == "holding":
                    ctl.call("task.cancel")
            if on:
                stopped = ctl.call("model.shadow", stop=True)
                shadows.append(stopped.get("result") or {})
            rec = request(rig, {"cmd": "record", "type": "COMMAND", "since": t0,
                                "limit": 10**6}, timeout=60)
            times = sorted(f["t"] for f in rec["frames"] if f["t"] <= t1)
            e, m, _ = period_errors(times, period)
            err[on] += e
            missed[on] += m
            seconds[on] += t1 - t0
            lat[on] += _decision_latencies(tmp, t0, t1)
    finally:
        stop_daemon(daemon)
    print(f"{2 * a.pairs} tasks alternating shadow off/on, control period {period * 1e3:g} ms; "
          f"candidate {src.name} (sha256 {sha[:12]}); overrides {a.set or 'none'}")
    per: dict[bool, dict[str, float]] = {}
    dec: dict[bool, dict[str, float]] = {}
    for on in (False, True):
        per[on], dec[on] = _stats(err[on]), _stats(lat[on])
        name = "shadow on " if on else "shadow off"
        print(f"{name}: {seconds[on]:.1f} s of tasks, {ok_tasks[on]}/{a.pairs} succeeded")
        print(_fmt("  COMMAND period error at the robot", per[on],
                   f"  missed {missed[on]}"))
        print(_fmt("  acting decision latency          ", dec[on]))
    print(f"ratio on/off: period error P99 {_ratio(per[True], per[False], 'p99')}, median "
          f"{_ratio(per[True], per[False], 'p50')}; decision latency P99 "
          f"{_ratio(dec[True], dec[False], 'p99')}, median {_ratio(dec[True], dec[False], 'p50')}")
    n = sum(int(s.get("decisions") or 0) for s in shadows)
    dropped = sum(int(s.get("dropped") or 0) for s in shadows)
    p99 = [s["latency"]["shadow_p99_ms"] for s in shadows if (s.get("latency") or {}).get(
        "shadow_p99_ms") is not None]
    agree = [s["agreement"] for s in shadows if s.get("agreement") is not None]
    print(f"shadow: {n} decisions compared, {dropped} dropped, candidate P99 per window "
          f"{', '.join(f'{x:.3f}' for x in p99)} ms, agreement "
          f"{', '.join(f'{100 * x:.1f} %' for x in agree)}")
    print(f"logs: {tmp / 'daemon.log'}")
    note = f"{ok_tasks[True]}/{a.pairs} tasks succeeded (off {ok_tasks[False]}/{a.pairs})"
    write_json(a.json, [
        figure("control loop mid-task, shadow on: COMMAND period error", "ms", err[True],
               baseline=("shadow off, same run", err[False]),
               notes=f"missed {missed[True]} (off {missed[False]}); {note}"),
        figure("acting decision latency, shadow on (decision journal)", "ms", lat[True],
               baseline=("shadow off, same run", lat[False]),
               notes=f"shadow compared {n} decisions, dropped {dropped}")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
