"""What a flight recorder starved of CPU costs in memory, and keeps.

    sudo python -m hil.starve_recorder [--starve-s 40] [--quota-us 1000] [--period-us 1000000]

One `edge-agent run --sim` daemon (hil/daemon_proc.py, no broker). After it is loaded and its
ring full, an on-demand capture opens and the recorder's thread alone (found by name with
`py-spy dump`) is throttled by a cgroup v1 `cpu` group (`cpu.cfs_quota_us` per
`cpu.cfs_period_us`: 0.1 % of a CPU by default) for `--starve-s`; the control thread and the
link reader (SCHED_FIFO) go on publishing. Then the thread is let go, the capture stopped.
Printed: the daemon's anonymous memory (its heap) before, at the peak, and kept 20 s after the
capture was written; the recorder's tap items dropped and backlog items shed.

It is what a CPU hog beside the daemon did in a soak (hil/results/soak-notes.md, 12-07 13:33):
the recorder's queues grew while it got no CPU, and the process kept the memory after it caught
up (pymalloc arenas left partly used). Needs root, the cgroup v1 `cpu` hierarchy at
/sys/fs/cgroup/cpu and py-spy (the dev extra).
"""

from __future__ import annotations

import argparse
import contextlib
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from hil.daemon_proc import Control, start_sim_daemon, stop_daemon, wait_for
from hil.rss_repeat import memory

CPU_CG = Path("/sys/fs/cgroup/cpu")


def recorder_tid(pid: int) -> str:
    """The OS thread id of the daemon's `flight-recorder` thread (py-spy names Python threads)."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("py-spy not found: pip install py-spy (the dev extra)")
    dump = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True,
                          timeout=60, check=False)
    m = re.search(r'Thread (\d+) \([^)]*\): "flight-recorder"', dump.stdout)
    if m is None:
        raise SystemExit(f"no flight-recorder thread in py-spy's dump: {dump.stderr[-300:]}")
    return m.group(1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--starve-s", type=float, default=40.0)
    ap.add_argument("--quota-us", type=int, default=1000, help="cpu.cfs_quota_us (min 1000)")
    ap.add_argument("--period-us", type=int, default=1_000_000, help="cpu.cfs_period_us")
    a = ap.parse_args(argv)
    if not (CPU_CG / "tasks").exists():
        raise SystemExit(f"{CPU_CG}: no cgroup v1 cpu hierarchy here (or not root)")
    group = CPU_CG / "edge-agent-starve"
    state = Path(tempfile.mkdtemp(prefix="starve-recorder-"))
    proc = start_sim_daemon(state, ["mqtt.port=1"])
    ctl = Control(state)
    tid: str | None = None
    try:
        wait_for(lambda: ctl.status()["link_up"], 60, "the daemon's link")
        wait_for(lambda: (ctl.status()["inference"] or {}).get("model"), 60, "the model")
        time.sleep(20)  # the ring full (record_pre_s + 5 s), start-up work done
        tid = recorder_tid(proc.pid)
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(a.period_us))
        (group / "cpu.cfs_quota_us").write_text(str(a.quota_us))
        m0 = memory(proc.pid)
        if not ctl.call("record.start").get("ok"):
            raise SystemExit("record.start refused")
        (group / "tasks").write_text(tid)
        t0, peak = time.monotonic(), m0["RssAnon"]
        while time.monotonic() - t0 < a.starve_s:
            time.sleep(1.0)
            peak = max(peak, memory(proc.pid)["RssAnon"])
        (CPU_CG / "tasks").write_text(tid)
        time.sleep(20)
        rec = (ctl.call("record.stop").get("result") or {}).get("recorder") or {}
        time.sleep(20)
        m1 = memory(proc.pid)
    finally:
        if tid is not None:
            with contextlib.suppress(OSError):  # the thread is gone
                (CPU_CG / "tasks").write_text(tid)
        stop_daemon(proc)
        shutil.rmtree(state, ignore_errors=True)
        with contextlib.suppress(OSError):
            group.rmdir()
    pct = 100 * a.quota_us / a.period_us
    print(f"recorder thread {tid} at {pct:g} % of a CPU for {a.starve_s:g} s, a capture open")
    print(f"heap (anonymous) before {m0['RssAnon']:.1f} MB, peak {peak:.1f} "
          f"(+{peak - m0['RssAnon']:.1f}), kept {m1['RssAnon']:.1f} "
          f"(+{m1['RssAnon'] - m0['RssAnon']:.1f}) 20 s after the capture was written")
    print(f"tap items dropped {rec.get('dropped')}, backlog items shed "
          f"{rec.get('backlog_dropped')}, files written {rec.get('written')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
