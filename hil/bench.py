"""One bench: every performance figure with its same-run baseline, as JSON and a table.

    python -m hil.bench [--quick] [--only NAME[,NAME]] [--list] [--out hil/results/] [--page]

Runs each bench of hil/bench_suite.py in turn, as its own process (`python -m hil.bench_X …
--json PATH`), and measures around it the host's steal (hil/steal.py), the load average and
the wall time. `--quick` takes small samples (minutes on a 2-core VM); the full run is the one
for docs/PERFORMANCE.md. Writes `OUT/bench-<UTC date>-<commit>[-quick].json`: the machine (CPU,
cores, kernel, Python, onnxruntime, load average before and after, steal over the run), the
commit and whether the tree was dirty, and per bench its figures — each with median, P99, max,
n, its baseline's median and P99, the ratio, the target and whether it is met, the steal % and
the wall time of its bench's window, and notes. A bench that fails is recorded with its exit
code and the tail of its output; the others still run. `--page` then renders the page
(`python -m hil.bench_page`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from hil.bench_suite import AREAS, BENCHES, Bench, by_name
from hil.daemon_proc import stop_group
from hil.steal import StealMeter

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "hil" / "results"


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def commit() -> dict[str, Any]:
    """The checkout's commit and whether tracked files differ from it (results excluded)."""
    dirty = _git("status", "--porcelain", "--untracked-files=no", "--", ".",
                 ":(exclude)hil/results", ":(exclude)docs/PERFORMANCE.md", ":(exclude)docs/perf")
    return {"commit": _git("rev-parse", "HEAD"), "short": _git("rev-parse", "--short", "HEAD")
            or "nogit", "subject": _git("log", "-1", "--format=%s"), "dirty": bool(dirty)}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu or platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "kernel": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "onnxruntime": _version("onnxruntime") or _version("onnxruntime-gpu")}


def _load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def run_one(b: Bench, quick: bool, logs: Path, timeout_s: float) -> dict[str, Any]:
    """Run one bench in its own process; its figures with the window's steal, load, wall."""
    out = logs / f"{b.name}.json"
    log = logs / f"{b.name}.log"
    argv = [sys.executable, *b.argv(quick), "--json", str(out)]
    rec: dict[str, Any] = {"name": b.name, "module": b.module, "area": b.area, "what": b.what,
                           "argv": argv[1:], "load_before": _load()}
    steal = StealMeter()
    steal.start()
    t0 = time.monotonic()
    with log.open("w") as f:
        proc: subprocess.Popen[bytes] | None = None
        try:
            proc = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = -9
        finally:  # timed out, or this runner stopped (Ctrl-C): the bench goes with it
            if proc is not None:  # SIGINT first: the bench's `finally` stops what it started
                stop_group(proc)
    steal.stop()
    rec["wall_s"] = round(time.monotonic() - t0, 1)
    rec["rc"] = rc
    rec["load_after"] = _load()
    rec["steal_pct"] = None if steal.fraction is None else round(100 * steal.fraction, 2)
    data: dict[str, Any] = {}
    if out.exists():
        try:
            data = json.loads(out.read_text())
        except ValueError:
            data = {}
    figures = data.get("figures") or []
    for fig in figures:
        fig.update(steal_pct=rec["steal_pct"], wall_s=rec["wall_s"], bench=b.name)
    rec["figures"] = figures
    rec["extra"] = data.get("extra") or {}
    lines = log.read_text(errors="replace").splitlines()
    if rc != 0 or not figures:
        rec["error"] = ("timed out" if rc == -9 else f"exit code {rc}") + (
            "" if figures else ", no figures")
        rec["output_tail"] = lines[-25:]
    rec["log"] = str(log)
    return rec


def _num(x: Any, unit: str = "") -> str:
    if x is None:
        return "-"
    if isinstance(x, float):
        x = f"{x:.3g}" if abs(x) < 10 else f"{x:.1f}"
    return f"{x}{unit}"


def table(benches: list[dict[str, Any]]) -> str:
    """The printed table: one row a figure."""
    rows = [f"{'figure':<58} {'n':>6} {'median':>8} {'P99':>8} {'max':>8} {'unit':<6} "
            f"{'base P99':>8} {'ratio':>6} {'met':>4} {'steal':>6}"]
    for b in benches:
        if b.get("error"):
            rows.append(f"{b['name']}: {b['error']} (log {b['log']})")
        for f in b["figures"]:
            if f.get("skipped"):
                rows.append(f"{f['name'][:58]:<58} skipped: {f['skipped'][:70]}")
                continue
            met = (f.get("target") or {}).get("met")
            rows.append(f"{f['name'][:58]:<58} {f['n']:>6} {_num(f['median']):>8} "
                        f"{_num(f['p99']):>8} {_num(f['max']):>8} {f['unit'][:6]:<6} "
                        f"{_num((f.get('baseline') or {}).get('p99')):>8} "
                        f"{_num(f.get('ratio')):>6} "
                        f"{'-' if met is None else 'yes' if met else 'NO':>4} "
                        f"{_num(f.get('steal_pct'), '%'):>6}")
    return "\n".join(rows)


def _write(path: Path, res: dict[str, Any], t0: float) -> None:
    """The results so far, replaced atomically (a stop mid-write leaves the last whole file)."""
    from edge_agent.store.atomic import write_atomic

    res["wall_s"] = round(time.monotonic() - t0, 1)
    write_atomic(path, (json.dumps(res, indent=1, ensure_ascii=False) + "\n").encode(),
                 mode=0o644)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hil.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small samples: minutes, not the page's")
    ap.add_argument("--only", metavar="NAME[,NAME]", help="run only these benches (--list)")
    ap.add_argument("--list", action="store_true", help="name every bench and exit")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results folder (hil/results/)")
    ap.add_argument("--page", action="store_true", help="then render docs/PERFORMANCE.md")
    ap.add_argument("--timeout-s", type=float, default=None,
                    help="per bench (default: 600 quick, 14400 full)")
    a = ap.parse_args(argv)
    if a.list:
        for area in AREAS:
            for b in BENCHES:
                if b.area == area:
                    print(f"{b.name:<15} {b.module:<26} {area}: {b.what}"
                          + (" (full run only)" if b.full_only else ""))
        return 0
    chosen = by_name(a.only, a.quick)
    a.out.mkdir(parents=True, exist_ok=True)
    started = dt.datetime.now(dt.UTC)
    git = commit()
    res: dict[str, Any] = {"kind": "quick" if a.quick else "full",
                           "started_utc": started.isoformat(timespec="seconds"), **git,
                           "machine": machine(), "only": a.only}
    res["machine"]["load_before"] = _load()
    logs = Path(tempfile.mkdtemp(prefix="edge-bench-all-"))
    print(f"{len(chosen)} bench(es), {res['kind']}; logs in {logs}; load average "
          f"{res['machine']['load_before']}", flush=True)
    steal = StealMeter()
    steal.start()
    t0 = time.monotonic()
    benches: list[dict[str, Any]] = []
    res["benches"] = benches
    name = f"bench-{started:%Y-%m-%d}-{git['short']}" + ("-quick" if a.quick else "")
    path = a.out / f"{name}.json"
    for b in chosen:
        print(f"-- {b.name}: python {' '.join(b.argv(a.quick))}", flush=True)
        benches.append(run_one(b, a.quick, logs, a.timeout_s or (600 if a.quick else 14400)))
        r = benches[-1]
        print(f"   {r['wall_s']} s, steal {_num(r['steal_pct'], ' %')}, load "
              f"{r['load_after'][0]}" + (f"; {r['error']}" if r.get("error") else ""),
              flush=True)
        # after each bench: a run stopped later (Ctrl-C, a timeout) keeps what it measured
        res["partial"] = (f"{len(benches)} of {len(chosen)} benches: the run stopped after "
                          f"{b.name}")
        _write(path, res, t0)
    steal.stop()
    res.pop("partial")
    res["machine"]["load_after"] = _load()
    res["machine"]["steal_pct"] = None if steal.fraction is None else round(
        100 * steal.fraction, 2)
    _write(path, res, t0)
    print()
    print(table(benches))
    print(f"\n{res['wall_s']:.0f} s; load average {res['machine']['load_before']} → "
          f"{res['machine']['load_after']}; steal {_num(res['machine']['steal_pct'], ' %')}; "
          f"wrote {path}")
    if a.page:
        from hil.bench_page import render

        print(f"wrote {render(path)}")
    return 1 if any(b.get("error") for b in benches) else 0


if __name__ == "__main__":
    raise SystemExit(main())
