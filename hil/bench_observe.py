"""Benchmark: what the observers cost the control loop — metrics endpoint and live Foxglove view
on (a Prometheus scraper and a Foxglove client subscribed to every channel) vs off, same run.

    python -m hil.bench_observe [--rounds 2] [--window 20] [--scrape-s 1]

Each round starts a daemon with both observers off, then one with both on (`--set
observe.metrics_port=... observe.foxglove_port=...`), the arms alternating on the same loaded
machine. In the "on" arm this process scrapes /metrics every `--scrape-s` seconds (Prometheus
scrapes every 15 s by default: 1 s is 15 times worse) and a Foxglove protocol client
(hil/foxglove_client.py) subscribes to every channel and reads all it is sent. Per arm: the
control loop's lateness P99 and max and its tick P99 (status.loop, since start-up; each arm
equally long), overruns; in the "on" arm: messages received by the viewer and the scrape's
duration (median, P99, max). Prints one JSON line per arm and a summary with on/off ratios.

`--estop-edges N` adds, per round, the robot-side e-stop reaction off vs on: `hil.bench_daemon_estop
--edges N` (button edge -> STOP frame at the robot, through the guardian) with and without the
observers' ports, the scraper and the viewer attached as in the loop arms.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.exceptions import ConnectionClosed

from hil.bench_stats import figure, write_json
from hil.daemon_proc import Control, start_sim_daemon, stop_daemon, wait_for
from hil.foxglove_client import FoxgloveClient


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pct(xs: list[float], q: float) -> float | None:
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))], 3) if s else None


def scraper(port: int, every_s: float, stop: threading.Event, took_ms: list[float]) -> None:
    url = f"http://127.0.0.1:{port}/metrics"
    while not stop.wait(every_s):
        t0 = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                r.read(8 << 20)
        except OSError:
            continue
        took_ms.append((time.perf_counter() - t0) * 1e3)


def viewer(port: int, stop: threading.Event, counts: dict[str, int]) -> None:
    client = FoxgloveClient(f"ws://127.0.0.1:{port}").open()
    try:
        client.subscribe(sorted(client.channels))
        while not stop.is_set():
            for m in client.receive(0.5):
                counts[m.topic] = counts.get(m.topic, 0) + 1
    except ConnectionClosed:
        pass  # the daemon stopped first (the e-stop arm ends on its own)
    finally:
        client.close()


def pump_cpu_s(port: int) -> float | None:
    """The live view's pump thread CPU seconds, from the metrics endpoint."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read(8 << 20).decode()
    m = re.search(r"^edge_agent_liveview_cpu_seconds_total (\S+)$", text, re.M)
    return round(float(m[1]), 3) if m else None


def attach(mport: int, fport: int, scrape_s: float, stop: threading.Event, took: list[float],
           counts: dict[str, int]) -> list[threading.Thread]:
    """The scraper and the viewer, once both ports answer (the daemon starts them after READY)."""
    def up() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics", timeout=5):
                pass
            socket.create_connection(("127.0.0.1", fport), timeout=5).close()
        except OSError:
            return False
        return True

    wait_for(up, 90, "the observers' ports")
    threads = [threading.Thread(target=scraper, args=(mport, scrape_s, stop, took)),
               threading.Thread(target=viewer, args=(fport, stop, counts))]
    for t in threads:
        t.start()
    return threads


def estop_arm(on: bool, edges: int, scrape_s: float) -> dict[str, Any]:
    """hil.bench_daemon_estop with the observers off or on (ports, scraper, viewer)."""
    mport, fport = free_port(), free_port()
    cmd = [sys.executable, "-m", "hil.bench_daemon_estop", "--edges", str(edges)]
    if on:
        cmd += ["--set", f"observe.metrics_port={mport}", "--set", f"observe.foxglove_port={fport}"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop, took, counts = threading.Event(), [], {}  # type: ignore[var-annotated]
    threads = attach(mport, fport, scrape_s, stop, took, counts) if on else []
    out, _ = proc.communicate(timeout=edges * 0.01 + 300)
    stop.set()
    for t in threads:
        t.join(10)
    m = re.search(r"at the robot \(daemon running\): n=(\d+)\s+P50 ([\d.]+) ms\s+"
                  r"P99 ([\d.]+) ms\s+P99.9 ([\d.]+) ms\s+max ([\d.]+) ms", out)
    if m is None:
        raise SystemExit(f"bench_daemon_estop said:\n{out[-2000:]}")
    return {"arm": "estop_" + ("on" if on else "off"), "n": int(m[1]), "p50_ms": float(m[2]),
            "p99_ms": float(m[3]), "max_ms": float(m[5]),
            "viewer_messages": sum(counts.values()) if on else None,
            "scrapes": len(took) if on else None}


def arm(on: bool, window_s: float, scrape_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-observe-") as tmp:
        state = Path(tmp) / "state"
        state.mkdir()
        mport, fport = free_port(), free_port()
        sets = ["mqtt.port=1"]  # no broker: the same in both arms
        if on:
            sets += [f"observe.metrics_port={mport}", f"observe.foxglove_port={fport}"]
        proc = start_sim_daemon(state, sets)
        ctl = Control(state)
        stop = threading.Event()
        took: list[float] = []
        counts: dict[str, int] = {}
        threads: list[threading.Thread] = []
        try:
            wait_for(lambda: ctl.status()["link_up"], 60, "the link up")
            wait_for(lambda: (ctl.status().get("inference") or {}).get("backend_in_use")
                     or (ctl.status().get("model") or {}).get("current"), 60, "the model")
            if on:
                threads = [threading.Thread(target=scraper, args=(mport, scrape_s, stop, took)),
                           threading.Thread(target=viewer, args=(fport, stop, counts))]
                wait_for(lambda: urllib.request.urlopen(
                    f"http://127.0.0.1:{mport}/metrics", timeout=5).status == 200, 30, "metrics")
                for t in threads:
                    t.start()
            time.sleep(window_s)
            loop = ctl.status()["loop"]
            pump_cpu = pump_cpu_s(mport) if on else None
        finally:
            stop.set()
            for t in threads:
                t.join(10)
            stop_daemon(proc)
    return {"arm": "on" if on else "off", "window_s": window_s,
            "late_p99_ms": loop["late_p99_ms"], "max_late_ms": loop["max_late_ms"],
            "tick_p99_ms": loop["tick_p99_ms"], "ticks": loop["ticks"],
            "overruns": loop["overruns"],
            "viewer_messages": dict(sorted(counts.items())) if on else None,
            # CPU seconds of the daemon's live-view pump thread since it started
            "pump_cpu_s": pump_cpu,
            "scrapes": len(took) if on else None,
            "scrape_ms": {"p50": pct(took, 0.5), "p99": pct(took, 0.99),
                          "max": round(max(took), 3) if took else None} if on else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--window", type=float, default=20.0, help="seconds per arm")
    p.add_argument("--scrape-s", type=float, default=1.0, help="seconds between scrapes")
    p.add_argument("--estop-edges", type=int, default=0,
                   help="per round, also the e-stop reaction off vs on over N press edges")
    p.add_argument("--json", metavar="PATH", help="write the figure records here (hil.bench)")
    args = p.parse_args(argv)
    rows, estops = [], []
    for _ in range(args.rounds):
        for on in (False, True):
            rows.append(arm(on, args.window, args.scrape_s))
            print(json.dumps(rows[-1]), flush=True)
            if args.estop_edges:
                estops.append(estop_arm(on, args.estop_edges, args.scrape_s))
                print(json.dumps(estops[-1]), flush=True)

    def med(name: str, key: str) -> float:
        xs = sorted(r[key] for r in rows if r["arm"] == name)
        return float(xs[len(xs) // 2])

    summary = {k: {"off": med("off", k), "on": med("on", k),
                   "ratio": round(med("on", k) / med("off", k), 2) if med("off", k) else None}
               for k in ("late_p99_ms", "max_late_ms", "tick_p99_ms")}
    for key in ("p99_ms", "max_ms"):
        off = sorted(r[key] for r in estops if r["arm"] == "estop_off")
        on_ = sorted(r[key] for r in estops if r["arm"] == "estop_on")
        if off and on_:
            a, b = off[len(off) // 2], on_[len(on_) // 2]
            summary["estop_" + key] = {"off": a, "on": b, "ratio": round(b / a, 2) if a else None}
    print(json.dumps({"summary": summary, "rounds": args.rounds}))
    on = [r for r in rows if r["arm"] == "on"]
    scrape = sorted(x for r in on for x in [(r["scrape_ms"] or {}).get("p99")] if x is not None)
    write_json(args.json, [figure(
        "idle control loop lateness, metrics scraped every "
        f"{args.scrape_s:g} s + live view subscribed to every channel", "ms",
        st={"n": len(on), "p50": None, "p99": summary["late_p99_ms"]["on"],
            "max": summary["max_late_ms"]["on"]},
        baseline=("observers off, same run", {"n": len(rows) - len(on), "p50": None,
                                              "p99": summary["late_p99_ms"]["off"]}),
        notes=f"status.loop's lateness P99 and max, median over {args.rounds} round(s) of "
              f"{args.window:g} s arms; n = arms; scrape P99 "
              f"{scrape[len(scrape) // 2] if scrape else '-'} ms")], summary=summary)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
