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
candidate latency). Alternating windows in one run keep the VM's minute-to-minute noise out of
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
from hil.daemon_proc import ROOT, Control, request, start_sim_daemon, stop_daemon, wait_for

SHIPPED = ROOT / "models" / "pick-place-policy.onnx"


def _stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    if not s:
        return {"n": 0}
    return {"n": len(s), "p50": s[len(s) // 2], "p99": s[min(len(s) - 1, int(0.99 * len(s)))],
            "max": s[-1]}


def _fmt(name: str, s: dict[str, float], extra: str = "") -> str:
    if not s.get("n"):
        return f"{name}: no samples"
    return (f"{name}: n={s['n']:.0f}  median {s['p50']:.3f} ms  P99 {s['p99']:.3f} ms  "
            f"max {s['max']:.3f} ms{extra}")


def _ratio(on: dict[str, float], off: dict[str, float], key: str) -> str:
    if not on.get("n") or not off.get("n") or not off[key]:
        return "—"
    return f"{on[key] / off[key]:.2f}"


def _decision_latencies(state_dir: Path, t0: float, t1: float) -> list[float]:
    from edge_agent.store.decisions import journal_dir, read_decisions

    return [d.latency_ms for d in read_decisions(journal_dir(state_dir))
            if t0 <= d.t <= t1 and d.latency_ms == d.latency_ms]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=4, help="off/on task pairs (default 4)")
    ap.add_argument("--candidate", type=Path, default=None,
                    help="the shadow's model (default: a copy of the shipped model)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra daemon config override (repeatable), e.g. "
                         "control.decision_hz=100 with inference.deadline_ms=10 (five times "
                         "sim.toml's decisions, and shadow runs)")
    a = ap.parse_args(argv)
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
            if not ctl.call("task.start").get("ok"):
                raise SystemExit(f"task {k + 1}: task.start refused")
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
