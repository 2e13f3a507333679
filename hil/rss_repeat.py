"""Does a fault's memory stay? The daemon's RSS around the same fault, injected again and again.

    python -m hil.rss_repeat [--fault link:unplug] [--rounds 6] [--gap-s 20] [--set KEY=VALUE]

One `edge-agent run --sim` daemon (hil/daemon_proc.py, `debug.failure_injection = true`, no
broker: reports go to disk). After `--warm-s` idle, the same `failure.inject` every `--gap-s`
seconds; before each the operator's part of the last one (the e-stop released, `reset`). Printed
per round: RSS and its anonymous (the heap) and file-backed (mapped libraries) parts, MB, read
from /proc at the end of the gap, and the recordings and reports written so far.

A first time that costs memory and repeats that cost none is warm-up (lazy work, buffers sized
by a first peak: the allocator keeps what a peak took); memory that grows with every round is a
leak. hil.soak measures growth after every fault kind's first time for this reason.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from hil.daemon_proc import Control, start_sim_daemon, stop_daemon, wait_for

MB = 1024 * 1024


def memory(pid: int) -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of `pid`, MB."""
    fields = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines()
                  if ":" in ln)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "RssAnon", "RssFile")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fault", default="link:unplug", help="TARGET:MODE of failure.inject")
    ap.add_argument("--duration-s", type=float, default=2.0, help="the fault's duration_s")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--gap-s", type=float, default=20.0, help="from one fault to the next")
    ap.add_argument("--warm-s", type=float, default=30.0, help="idle after READY, first")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra daemon config override (repeatable), e.g. sim.gpu=true")
    a = ap.parse_args(argv)
    target, _, mode = a.fault.partition(":")
    state = Path(tempfile.mkdtemp(prefix="rss-repeat-"))
    proc = start_sim_daemon(state, ["debug.failure_injection=true", "mqtt.port=1", *a.set])
    ctl = Control(state)
    try:
        wait_for(lambda: ctl.status()["link_up"], 60, "the daemon's link")
        time.sleep(a.warm_s)
        print(f"{a.fault} every {a.gap_s:g} s, {a.rounds} rounds; daemon pid {proc.pid}")
        print("round      RSS    anon    file  recordings  reports")
        row(proc.pid, ctl, "warm")
        for i in range(1, a.rounds + 1):
            args: dict[str, object] = {"target": target, "mode": mode}
            if target != "estop":
                args["duration_s"] = a.duration_s
            r = ctl.call("failure.inject", **args)
            if not r.get("ok"):
                raise SystemExit(f"failure.inject {a.fault}: {r.get('error')}")
            time.sleep(a.gap_s / 2)
            if target == "estop":
                ctl.call("failure.inject", target="estop", mode="release")
            wait_for(lambda: ctl.status()["link_up"], 60, "the link back")
            ctl.call("reset")  # the operator's part; refused (harmless) when nothing latched
            time.sleep(a.gap_s / 2)
            row(proc.pid, ctl, str(i))
    finally:
        stop_daemon(proc)
        shutil.rmtree(state, ignore_errors=True)
    return 0


def row(pid: int, ctl: Control, label: str) -> None:
    m, st = memory(pid), ctl.status()
    rec = (st.get("observe") or {}).get("recorder") or {}
    print(f"{label:>5} {m['VmRSS']:8.1f} {m['RssAnon']:7.1f} {m['RssFile']:7.1f} "
          f"{rec.get('written', '-'):>11} {(st.get('reports') or {}).get('built', '-'):>8}",
          flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
