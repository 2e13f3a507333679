"""Footprint: a loaded daemon's memory per part, its idle CPU, and what each optional feature costs.

    python -m hil.footprint [--quick] [--samples 5] [--idle-s 30] [--tasks 3] [--features all]

Each configuration starts a real `edge-agent run --sim` (configs/sim.toml, a private Mosquitto on
a free loopback port, the daemon under `python -X importtime`), loads it — the model session
built, `--tasks` pick-and-place tasks run (decisions journalled), and at least the flight
recorder's whole ring span (record_pre_s + 5 s) since READY — then reads /proc: RSS, PSS and
USS (smaps_rollup; the median of `--samples` reads 1 s apart), the address space by part
(hil/footprint_probe.py: shared objects by package, malloc arenas, thread stacks, pymalloc and
other anonymous memory), threads, and idle CPU (utime + stime over `--idle-s`, the daemon and
its link guardian apart; the simulated robot is not counted). The recorder's own counters
(ring messages, its estimate of their encoded bytes) come from a `record.start`/`record.stop`
after the samples.

Attribution by import: a fresh interpreter imports the modules the base daemon imported, in the
daemon's order (from its `-X importtime` lines), reading its RSS after each, then builds the
policy session the daemon builds and runs it 1000 times. Its total is not the daemon's: the
daemon also holds its threads, buffers and the ring.

Configurations: `base` (sim.toml as shipped: recorder on, no metrics, no live view, no shadow,
no Triton), then one optional feature changed at a time: `recorder_off`
(observe.record=false), `metrics` (observe.metrics_port), `foxglove` (observe.foxglove_port),
`shadow` (model.shadow running a copy of the shipped model), `triton` (inference.triton_url at a
closed local port: the client imported and retrying; no server), and `no_model` (no
`inference.model`: the rule-based expert decides, onnxruntime and numpy never load); and
`no_spin` (control.no_spin=true, as sim.toml advises for many daemons on one machine: the loop
sleeps to each deadline instead of busy-waiting its last 0.2 ms), for idle CPU. The table
prints each one's median RSS/PSS/USS and the difference to `base`. JSON:
hil/results/footprint-<UTC time>.json. `run(quick)` returns the same dict (hil.bench calls it).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hil import footprint_probe as probe
from hil.bench_daemon_estop import private_broker
from hil.daemon_proc import (
    BENCH_SETS,
    ROOT,
    SIM_CONFIG,
    Control,
    stop_daemon,
    wait_for,
    with_parent,
)

SHIPPED = ROOT / "models" / "pick-place-policy.onnx"
RESULTS = ROOT / "hil" / "results"
FEATURES = ("base", "recorder_off", "metrics", "foxglove", "shadow", "triton", "no_model",
            "no_spin")
MB = 1 << 20


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(state_dir: Path, sets: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    """As hil/daemon_proc.start_sim_daemon, under `python -X importtime`."""
    cmd = [sys.executable, "-X", "importtime", "-m", "edge_agent.cli", "run", "--config",
           str(SIM_CONFIG), "--sim"]
    for s in (f"state_dir={state_dir}", *BENCH_SETS, *sets):
        cmd += ["--set", s]
    with open(state_dir / "daemon.log", "w") as log:
        return subprocess.Popen(with_parent(cmd), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                start_new_session=True, env=env)


def _to_idle(ctl: Control, timeout: float = 60.0) -> bool:
    """Reset (again while its cause is present; resets are rate-limited) until idle or holding
    (a task may start from either); whether it got there (a saturated machine may keep its
    loop stalling)."""
    def reset() -> bool:
        if str(ctl.status()["mode"]) in ("idle", "holding"):
            return True
        ctl.call("reset")
        time.sleep(1.2)
        return False

    try:
        wait_for(reset, timeout, "idle after a reset")
    except SystemExit:
        return False
    return True


def _run_task(ctl: Control, k: int) -> bool:
    """One pick-and-place task from idle; whether it succeeded (a loaded machine may stop it)."""
    if not _to_idle(ctl) or not ctl.call("task.start").get("ok"):
        print(f"  task {k}: not started (mode {ctl.status()['mode']})", file=sys.stderr)
        return False
    wait_for(lambda: ctl.status()["mode"] != "running", 180, f"task {k}", poll_s=0.25)
    ok = str(ctl.status()["mode"]) == "idle"  # a task that ended well leaves the robot idle
    _to_idle(ctl)
    return ok


def _feature_sets(feature: str, tmp: Path) -> tuple[list[str], str | None]:
    """The --set overrides of `feature` and, for `shadow`, the candidate's path."""
    if feature == "recorder_off":
        return ["observe.record=false"], None
    if feature == "no_model":
        return ["inference.model="], None
    if feature == "no_spin":
        return ["control.no_spin=true"], None
    if feature == "metrics":
        return [f"observe.metrics_port={_free_port()}"], None
    if feature == "foxglove":
        return [f"observe.foxglove_port={_free_port()}"], None
    if feature == "triton":
        return [f"inference.triton_url=127.0.0.1:{_free_port()}"], None
    if feature == "shadow":
        drop = tmp / "drop"
        drop.mkdir(mode=0o755)
        cand = drop / "candidate.onnx"
        shutil.copyfile(SHIPPED, cand)
        card = SHIPPED.with_suffix(".card.json")
        if card.exists():
            shutil.copyfile(card, cand.with_suffix(".card.json"))
        return [f"inference.update_dir={drop}"], str(cand)
    return [], None


def loaded(feature: str, *, tasks: int, samples: int, idle_s: float,
           env: dict[str, str] | None = None, extra: list[str] | None = None) -> dict[str, Any]:
    """One daemon with `feature`, loaded, measured (see the module doc)."""
    tmp = Path(tempfile.mkdtemp(prefix="edge-footprint-"))
    broker, port = private_broker(tmp)
    sets, candidate = _feature_sets(feature, tmp)
    sets = [f"mqtt.port={port}", f"device.id=fp-{feature}".replace("_", "-"),
            "link.deadman_ms=250", *sets,
            *(extra or [])]
    proc = _start(tmp, sets, {**os.environ, **(env or {})})
    ctl = Control(tmp)
    out: dict[str, Any] = {"feature": feature, "sets": sets, "env": env or {}}
    try:
        def up() -> bool:
            if proc.poll() is not None:
                raise SystemExit("the daemon exited: " + (tmp / "daemon.log").read_text()[-800:])
            return bool(ctl.status()["link_up"])

        wait_for(up, 180, "the daemon's link up")
        t_ready = time.monotonic()
        out["ready"] = probe.rollup(proc.pid)
        if feature != "no_model":
            wait_for(lambda: (ctl.status()["inference"] or {}).get("model"), 120, "the model")
        if candidate is not None:
            sha = hashlib.sha256(Path(candidate).read_bytes()).hexdigest()
            r = ctl.call("model.shadow", uri=candidate, sha256=sha)
            if not r.get("ok"):
                raise SystemExit(f"model.shadow refused: {r}")
        out["tasks_ok"] = sum(_run_task(ctl, k + 1) for k in range(tasks))
        out["tasks"] = tasks
        # the ring spans record_pre_s + 5 s (observe/recorder.py): full by then
        time.sleep(max(0.0, 15.5 - (time.monotonic() - t_ready)))
        kids = probe.children(proc.pid)
        pids = {"daemon": proc.pid, **{k: v for k, v in kids.items() if k == "guardian"}}
        c0 = {k: probe.cpu_s(p) for k, p in pids.items()}
        t0 = time.monotonic()
        time.sleep(idle_s)
        secs = time.monotonic() - t0
        out["idle_cpu_pct"] = {k: round(100 * (probe.cpu_s(p) - c0[k]) / secs, 2)
                               for k, p in pids.items()}
        out["idle_s"] = round(secs, 1)
        reads = []
        for _ in range(samples):
            reads.append(probe.rollup(proc.pid))
            time.sleep(1.0)
        out["median"] = {k: int(statistics.median(r[k] for r in reads)) for k in reads[0]}
        out["samples"] = [r["rss"] for r in reads]
        out["parts"] = probe.parts(proc.pid)
        out["threads"] = probe.threads(proc.pid)
        if "guardian" in pids:
            out["guardian"] = probe.rollup(pids["guardian"])
        st = ctl.status()
        out["model"] = (st.get("inference") or {}).get("model")
        if feature != "recorder_off" and ctl.call("record.start").get("ok"):
            rec = ctl.call("record.stop").get("result", {}).get("recorder", {})
            out["recorder"] = {k: rec.get(k) for k in ("ring_messages", "ring_bytes",
                                                       "dropped", "cpu_s")}
        out["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    finally:
        stop_daemon(proc)
        broker.terminate()
        broker.wait(10)
    out["importtime_modules"] = probe.importtime_modules((tmp / "daemon.log").read_text())
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def run(quick: bool, features: tuple[str, ...] = FEATURES, *, samples: int | None = None,
        idle_s: float | None = None, tasks: int | None = None,
        env: dict[str, str] | None = None) -> dict[str, Any]:
    """Every configuration in `features` (quick: 1 task, 3 samples, 10 s idle, base and
    recorder_off only unless `features` names more), then the import walk; the figures."""
    if quick and features == FEATURES:
        features = ("base", "recorder_off")
    n_tasks = tasks if tasks is not None else (1 if quick else 3)
    n_samples = samples if samples is not None else (3 if quick else 5)
    idle = idle_s if idle_s is not None else (10.0 if quick else 30.0)
    res: dict[str, Any] = {"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                           "cpus": os.cpu_count(), "configs": {}}
    for f in features:
        res["configs"][f] = loaded(f, tasks=n_tasks, samples=n_samples, idle_s=idle, env=env)
    first = res["configs"][features[0]]
    mods = [m for m in first.pop("importtime_modules") if not m.startswith("hil")]
    for c in res["configs"].values():
        c.pop("importtime_modules", None)
    res["imports"] = probe.import_walk(mods, str(SHIPPED), env={**os.environ, **(env or {})})
    res["imports"]["modules"] = len(mods)
    res["imports"]["order"] = mods
    res["loadavg"] = Path("/proc/loadavg").read_text().split()[:3]
    return res


def _mb(b: float | None) -> str:
    return "-" if b is None else f"{b / MB:6.1f}"


def report(res: dict[str, Any]) -> None:
    cfg = res["configs"]
    base = cfg.get("base")
    print(f"footprint {res['when']} ({res['cpus']} CPUs, load average "
          f"{' '.join(res['loadavg'])}); MB = MiB")
    print(f"{'config':14s} {'RSS':>6s} {'PSS':>6s} {'USS':>6s} {'anon':>6s}  {'ΔRSS':>6s} "
          f"{'ΔUSS':>6s} thr  idle CPU % (daemon / guardian)   samples (RSS)")
    for name, c in cfg.items():
        m = c["median"]
        d_rss = m["rss"] - base["median"]["rss"] if base and name != "base" else None
        d_uss = m["uss"] - base["median"]["uss"] if base and name != "base" else None
        cpu = c["idle_cpu_pct"]
        print(f"{name:14s} {_mb(m['rss'])} {_mb(m['pss'])} {_mb(m['uss'])} {_mb(m['anon'])}  "
              f"{_mb(d_rss)} {_mb(d_uss)} {c['threads']:3d}  {cpu.get('daemon', 0):5.2f} / "
              f"{cpu.get('guardian', 0):5.2f}   "
              f"{' '.join(f'{s / MB:.1f}' for s in c['samples'])}")
    if base:
        print(f"base, by part of the address space (RSS, MB; at READY it was "
              f"{base['ready']['rss'] / MB:.1f}):")
        for part, b in sorted(base["parts"].items(), key=lambda kv: -kv[1]):
            if b >= 0.1 * MB:
                print(f"  {part:48s} {_mb(b)}")
        if "guardian" in base:
            g = base["guardian"]
            print(f"  (the link guardian, its own process: RSS {_mb(g['rss'])}, "
                  f"USS {_mb(g['uss'])})")
        if base.get("recorder"):
            r = base["recorder"]
            print(f"  recorder ring: {r['ring_messages']} messages, its estimate of their "
                  f"encoded size {_mb(r['ring_bytes'])} MB")
    imp = res["imports"]
    print(f"fresh interpreter importing the daemon's {imp['modules']} modules in its order "
          f"(RSS, MB; import s):")
    print(f"  {'interpreter (python, site)':32s} {_mb(imp['interpreter'])}")
    for g, v in sorted(imp["groups"].items(), key=lambda kv: -kv[1]["rss"]):
        if v["rss"] >= 0.1 * MB:
            print(f"  {g:32s} {_mb(v['rss'])}  {v['s']:.3f} s  ({int(v['modules'])} modules)")
    print(f"  {'policy session (build)':32s} {_mb(imp['session'])}")
    print(f"  {'1000 decisions':32s} {_mb(imp['runs'])}")
    print(f"  {'total':32s} {_mb(imp['total'])}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="base and recorder_off, 1 task, short")
    ap.add_argument("--features", default="all",
                    help=f"comma-separated, from {','.join(FEATURES)} (default all)")
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--idle-s", type=float, default=None)
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment of the daemons (and the walk), e.g. MALLOC_ARENA_MAX=2")
    a = ap.parse_args(argv)
    feats = FEATURES if a.features == "all" else tuple(a.features.split(","))
    env = dict(e.split("=", 1) for e in a.env)
    res = run(a.quick, feats, samples=a.samples, idle_s=a.idle_s, tasks=a.tasks, env=env)
    report(res)
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"footprint-{res['when'].replace(':', '')}.json"
    path.write_text(json.dumps(res, indent=1) + "\n")
    print(f"JSON: {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
