"""hil.soak's result: what the run saw, gathered into the dict hil/results/soak.json holds
(`collect`), and its verdicts, Markdown, file and plots (`finish`)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from hil.daemon_proc import ROOT
from hil.soak_caps import caps_from_config
from hil.soak_faults import NOT_DRAWN
from hil.soak_ops import LogFollower, Operator
from hil.soak_sample import Sampler
from hil.soak_verdict import markdown, verdicts
from hil.webhook_receiver import Receiver


def commit_now() -> str:
    """The checkout's commit, `-dirty` when it has uncommitted changes: what the daemon started
    from (taken at the start: a long soak outlives the commits made meanwhile)."""
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, text=True, capture_output=True,
                              check=False).stdout.strip()

    dirty = git("status", "--porcelain", "--untracked-files=no", "--", "edge_agent", "hil")
    return git("rev-parse", "--short", "HEAD") + ("-dirty" if dirty else "")


def collect(a: argparse.Namespace, counts: dict[str, Any], sampler: Sampler, log: LogFollower,
            op: Operator, recv: Receiver, disk_ids: list[str], st: dict[str, Any], pid: int,
            exit_code: int | None, started: str, load0: tuple[float, float, float],
            commit: str) -> dict[str, Any]:
    cpu = ""
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(ln.split(":", 1)[1].strip() for ln in
                   Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("model name"))
    return {
        "command": " ".join(["python -m hil.soak", *sys.argv[1:]]),
        "minutes": a.minutes, "seed": a.seed, "interval_s": a.interval_s,
        # growth after the first minutes and every fault kind's first time (Soak.deck)
        "warmup_s": max(a.warmup_min * 60, counts.get("every_kind_s") or 0.0),
        "warmup_min_s": a.warmup_min * 60, "every_kind_s": counts.get("every_kind_s"),
        "started_utc": started, "commit": commit,
        "machine": f"{os.cpu_count()} CPUs ({cpu}), {os.uname().release}",
        "load_at_start": load0, "load_at_end": os.getloadavg(),
        "daemon": {"pid": pid, "pid_unchanged": all(
            s["procs"].get("daemon", {}).get("pid") == pid for s in sampler.samples[:-1]),
            "exit_code": exit_code, "tracebacks": log.tracebacks, "errors": log.errors[:20],
            "boot_id": st.get("boot_id"), "uptime_s": st.get("uptime_s")},
        "counts": counts,
        "reports": {"built_ids": sorted(set(log.built_ids)),
                    "built_count": st["reports"]["built"], "status": st["reports"],
                    "sinks": {"disk": disk_ids, "mqtt": op.reports(),
                              "webhook": recv.report_ids()},
                    "webhook_requests": len(recv.snapshot())},
        "caps": caps_from_config(),
        "loop_gc": (st.get("loop") or {}).get("gc"),
        "not_injected": NOT_DRAWN,
        "samples": sampler.samples,
    }


def finish(a: argparse.Namespace, result: dict[str, Any]) -> int:
    from hil.soak_plot import plot_all

    result["verdicts"] = verdicts(result)
    result["markdown"] = markdown(result)
    a.results.parent.mkdir(parents=True, exist_ok=True)
    a.results.write_text(json.dumps(result, indent=1) + "\n")
    if a.results.resolve() != (a.out / "soak.json").resolve():
        shutil.copy(a.results, a.out / "soak.json")
    plot_all(result, a.plots)
    print(result["markdown"])
    print(f"results: {a.results}; plots: {a.plots}/soak-*.png; logs: {a.out}")
    return 0 if all(v["ok"] for v in result["verdicts"]) else 1
