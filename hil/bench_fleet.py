"""Benchmark: a fleet of N real daemons behind a 3-node broker cluster (bridged Mosquittos, or
a NATS cluster with its MQTT gateway: `--cluster nats`).

    python -m hil.bench_fleet [--daemons 5,10,15] [--brokers 3] [--trials 15] [--period-s 1.5]
                              [--cluster mosquitto|nats] [--back-to-back]

For each N (growing; it stops growing when a fleet e-stop is missed or the fleet's own
processes use more than --max-cpu % of all CPUs: the load average also counts other work),
hil/fleet_proc.py starts the cluster (node 0 bridged to nodes 1 and 2; daemon i on node
i % 3; with `--cluster nats` three routed nats-servers, JetStream clustered, MQTT 3.1.1), one
rig process serving N ptys and N daemons in the no-spin fleet profile. Then:

- broker time (same-run baseline): an operator's publish on node 1 → a subscriber on node 2
  (Mosquitto: two bridge hops through node 0; NATS: one route) and on node 1 itself, round
  trips, median / P99 / max;
- fleet e-stop fan-out, per robot: one publish on the fleet topic (node 1) per trial, then for
  every robot the first STOP frame its pty received (the rig stamps frames with the same
  monotonic clock). The broker part is measured on the same message: a probe subscribed on
  each node stamps its arrival there; daemon reaction = STOP frame − arrival on the robot's
  node. Misses: robots with no STOP within --settle-s. Between trials every robot is reset,
  then the bench waits until every robot is at rest by its `status` (the last stop's report
  and recording done: hil/fleet_rest.py says why; `--back-to-back` does not wait);
- status aggregation: `FleetBus` (what `edge-agent fleet status` uses) connecting to node 0:
  time until every robot's retained status and state arrived, and until every robot's `status`
  command was answered; and the CLI's wall time (`edge-agent fleet status --json`, a process);
- per-process CPU % and RSS (daemons, rig, brokers), messages per second per robot at idle.

At the end: the largest N that ran with no miss, and a paper projection to 1,000 robots from
the measured per-robot figures and a published broker figure (EMQX: 50k msg/s fan-out on
4 vCPU at P99 8.6 ms). Heavy: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from edge_agent.comms.mqtt_common import Topics
from hil.bench_fleet_estop import cpu_s, first_stops, rss_mb
from hil.bench_stats import fmt, ratio, stats
from hil.fleet_proc import KINDS, ROOT, Fleet, wait
from hil.fleet_rest import RestWatch

FLEET_TOPIC = Topics("edge/+").fleet_estop  # the daemons' default mqtt.fleet_topic
ALL = Topics("edge/+")  # every robot's topics (edge_agent/comms/mqtt_common.py)
EMQX_MSG_S, EMQX_P99_MS, EMQX_VCPU = 50_000, 8.6, 4


class Probes:
    """One subscriber per node on the fleet topic and an echo topic: arrival times there."""

    def __init__(self, fleet: Fleet) -> None:
        self.arrivals: dict[int, list[float]] = {}
        self.echo: dict[int, list[float]] = {}
        self.lock = threading.Lock()
        self.clients = []
        for node in range(len(fleet.ports)):
            c = fleet.client(node, f"bench-probe-{node}")
            c.on_message = lambda c, u, m, node=node: self._on(node, m)
            c.subscribe([(FLEET_TOPIC, 1), ("edge/bench/echo", 1)])
            self.clients.append(c)
        self.pub = fleet.client(1 % len(fleet.ports), "bench-publisher")
        time.sleep(0.5)

    def _on(self, node: int, m: Any) -> None:
        now = time.monotonic()
        with self.lock:
            book = self.arrivals if m.topic == FLEET_TOPIC else self.echo
            book.setdefault(node, []).append(now)

    def round_trips(self, n: int, far: int) -> tuple[list[float], list[float]]:
        """ms from a publish on the publisher's node to its arrival at node `far` / locally."""
        near = 1 % len(self.clients)
        out_far, out_near = [], []
        for _ in range(n):
            with self.lock:
                self.echo = {}
            t0 = time.monotonic()
            self.pub.publish("edge/bench/echo", b"x", qos=1)
            wait(lambda: far in self.echo and near in self.echo, 5, "the echo")
            with self.lock:
                out_far.append((self.echo[far][0] - t0) * 1e3)
                out_near.append((self.echo[near][0] - t0) * 1e3)
        return out_far, out_near

    def close(self) -> None:
        for c in [*self.clients, self.pub]:
            c.loop_stop()
            c.disconnect()


def aggregation(fleet: Fleet) -> dict[str, float]:
    """Seconds to every robot's retained status+state and to every `status` answer (FleetBus)."""
    from edge_agent.comms.client import MqttTarget
    from edge_agent.fleet.bus import FleetBus

    n = fleet.n
    t0 = time.monotonic()
    bus = FleetBus(MqttTarget("+", "127.0.0.1", fleet.ports[0], "operator", "operator-pw",
                              protocol=fleet.protocol))
    bus.start()
    try:
        wait(lambda: sum(bool(r.status and r.state) for r in bus.snapshot()) >= n, 30,
             "every retained status and state", interval=0.002)
        t_retained = time.monotonic() - t0
        t1 = time.monotonic()
        robots = bus.snapshot()
        bus.query_all(robots, timeout=30)
        t_query = time.monotonic() - t1
        answered = sum(r.details is not None for r in robots)
    finally:
        bus.close()
    t2 = time.monotonic()
    subprocess.run([sys.executable, "-m", "edge_agent.cli", "fleet", "status", "--json",
                    *fleet.operator_args(0)], capture_output=True, cwd=ROOT, check=True)
    return {"retained_s": t_retained, "query_s": t_query, "answered": answered,
            "cli_s": time.monotonic() - t2}


def idle_rate(fleet: Fleet, seconds: float = 5.0) -> float:
    """Messages per second per robot under edge/ at idle (the broker's steady load)."""
    count = [0]
    c = fleet.client(0, "bench-rate")
    c.on_message = lambda c, u, m: count.__setitem__(0, count[0] + 1)
    c.subscribe(f"{ALL.prefix}/#", 0)
    time.sleep(1.0)
    count[0] = 0
    time.sleep(seconds)
    c.loop_stop()
    c.disconnect()
    return count[0] / seconds / fleet.n


def step(n: int, args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix=f"edge-bench-fleet{n}-"))
    with Fleet(tmp, n=n, brokers=args.brokers, kind=args.cluster) as fleet:
        fleet.start_brokers()
        fleet.start_rig(fifo=args.rig_fifo)
        up_s = fleet.start_daemons([], batch=4)
        ops = fleet.client(0, "bench-operator")
        states: dict[str, dict[str, Any]] = {}
        ops.on_message = lambda c, u, m: states.__setitem__(m.topic.split("/")[1],
                                                            json.loads(m.payload))
        ops.subscribe(ALL.state, 1)
        rest = RestWatch(ops)  # hil/fleet_rest.py: why the trials wait for robots at rest
        if not rest.wait(fleet.devices, 300)[1]:
            raise SystemExit("timed out after 300 s waiting for the daemons' background "
                             "start-up (model, calibration)")
        agg = aggregation(fleet)
        rate = idle_rate(fleet)
        probes = Probes(fleet)
        time.sleep(0.5)
        procs = [*fleet.daemons, *fleet.brokers, *([fleet.rig] if fleet.rig else [])]
        cpu0 = {p.pid: cpu_s(p.pid) for p in procs}
        w0 = time.monotonic()
        sock = str(tmp / "rig.sock")
        per_robot, broker_ms, react_ms, fleet_last = [], [], [], []
        misses = 0
        still: list[int] = []  # robots still latched when a trial's e-stop went out
        rest_waits: list[float] = []
        not_at_rest = 0  # trials sent with a robot still busy after --rest-timeout-s
        for trial in range(args.trials):
            t_next = time.monotonic() + args.period_s
            reset_end = time.monotonic() + 15.0  # resets are rate-limited: retry each 1.1 s
            for attempt in range(100):
                latched = sorted(d for d, s in states.items() if s.get("stop"))
                if not latched or time.monotonic() > reset_end:
                    break
                for d in latched:
                    ops.publish(Topics(f"edge/{d}").cmd("reset"), json.dumps(
                        {"v": 1, "id": f"reset-{trial}-{attempt}-{d}", "reason": "bench"}),
                        qos=1)
                time.sleep(1.1)
            if not args.back_to_back:
                waited, rested = rest.wait(fleet.devices, args.rest_timeout_s)
                rest_waits.append(waited)
                not_at_rest += not rested
            still.append(sum(bool(s.get("stop")) for s in states.values()))
            with probes.lock:
                probes.arrivals = {}
            t0 = time.monotonic()
            probes.pub.publish(FLEET_TOPIC, json.dumps({"v": 1, "reason": f"bench {trial}"}),
                               qos=1)
            time.sleep(args.settle_s)
            got = first_stops(sock, t0, n)
            misses += n - len(got)
            with probes.lock:
                arrive = {node: xs[0] for node, xs in probes.arrivals.items()}
            for i, dt in got.items():
                per_robot.append(dt * 1e3)
                node = i % len(fleet.ports)
                if node in arrive:
                    broker_ms.append((arrive[node] - t0) * 1e3)
                    react_ms.append((t0 + dt - arrive[node]) * 1e3)
            if len(got) == n:
                fleet_last.append(max(got.values()) * 1e3)
            time.sleep(max(0.0, t_next - time.monotonic()))
        wall = time.monotonic() - w0
        far, near = probes.round_trips(100, far=2 % len(fleet.ports))
        cpu = {p.pid: (cpu_s(p.pid) - cpu0[p.pid]) / wall * 100 for p in procs}
        d_cpu = [cpu[p.pid] for p in fleet.daemons]
        d_rss = [rss_mb(p.pid) for p in fleet.daemons]
        load = os.getloadavg()[0]
        probes.close()
        ops.loop_stop()
        ops.disconnect()
    return {"n": n, "up_s": up_s, "agg": agg, "rate": rate, "per_robot": stats(per_robot),
            "fleet_last": stats(fleet_last), "broker": stats(broker_ms),
            "react": stats(react_ms), "far": stats(far), "near": stats(near), "misses": misses,
            "still_latched": max(still, default=0), "trials": args.trials,
            "rest_waits": stats([w * 1e3 for w in rest_waits]), "not_at_rest": not_at_rest,
            "daemon_cpu": sum(d_cpu) / n, "daemon_rss": sum(d_rss) / n,
            "broker_cpu": [cpu[p.pid] for p in fleet.brokers],
            "rig_cpu": cpu[fleet.rig.pid] if fleet.rig else 0.0, "load": load,
            "fleet_cpu": sum(cpu.values())}


def report(r: dict[str, Any]) -> None:
    n, a = r["n"], r["agg"]
    print(f"\nN = {r['n']} daemons ({r['trials']} fleet e-stops; up in {r['up_s']:.1f} s; "
          f"load average {r['load']:.2f} on {os.cpu_count()} CPUs at the end)")
    print("  " + fmt("broker pub→sub, node 1 → node 2 (baseline; Mosquitto: 2 bridge hops, "
                     "NATS: 1 route)", r["far"]))
    print("  " + fmt("broker pub→sub, same node", r["near"]))
    print("  " + fmt("e-stop → STOP frame, per robot", r["per_robot"],
                     f"  (ratio of median to the node 1 → node 2 broker median: "
                     f"{ratio(r['per_robot'], r['far'], 'p50')})"))
    print("  " + fmt("  of which broker (publish → the robot's node)", r["broker"]))
    print("  " + fmt("  of which daemon reaction (node → STOP frame)", r["react"]))
    print("  " + fmt("e-stop → last robot's STOP (fleet)", r["fleet_last"]))
    print(f"  misses: {r['misses']} of {n * r['trials']}; robots still latched when an e-stop "
          f"went out (a reset not through yet): max {r['still_latched']}")
    if r["rest_waits"]["n"]:
        print("  " + fmt("wait for the robots at rest before a trial (ms)", r["rest_waits"],
                         f"; trials sent with a robot still busy: {r['not_at_rest']}"))
    else:
        print("  back to back: trials every --period-s, robots at rest or not")
    print(f"  status aggregation: retained status+state of {n} robots in "
          f"{a['retained_s'] * 1e3:.0f} ms; {a['answered']}/{n} status answers in "
          f"{a['query_s'] * 1e3:.0f} ms; `edge-agent fleet status --json` {a['cli_s']:.2f} s "
          f"wall (a process: interpreter, imports, the settle wait)")
    print(f"  per daemon: CPU {r['daemon_cpu']:.1f} %, RSS {r['daemon_rss']:.0f} MB; brokers "
          f"CPU {', '.join(f'{c:.1f}' for c in r['broker_cpu'])} %; rig CPU "
          f"{r['rig_cpu']:.1f} %; all of the fleet's processes {r['fleet_cpu']:.0f} % of one "
          f"CPU; {r['rate']:.1f} messages/s per robot at idle")


def projection(r: dict[str, Any]) -> None:
    """A paper projection to 1,000 robots (each daemon on its own robot's computer)."""
    m = 1000
    fan_ms = m / EMQX_MSG_S * 1e3
    react = r["react"].get("p99", float("nan"))
    idle = r["rate"] * m
    print(f"\nprojection to {m} robots (paper; from N = {r['n']}; EMQX published figure "
          f"{EMQX_MSG_S:,} msg/s fan-out on {EMQX_VCPU} vCPU at P99 {EMQX_P99_MS} ms):")
    print(f"  e-stop: {m} deliveries at {EMQX_MSG_S:,}/s = {fan_ms:.0f} ms to hand them all out, "
          f"+ broker P99 {EMQX_P99_MS} ms + daemon reaction P99 {react:.1f} ms (measured, one "
          f"robot per computer) ≈ last robot within {fan_ms + EMQX_P99_MS + react:.0f} ms")
    print(f"  steady load: {r['rate']:.1f} msg/s per robot × {m} = {idle:,.0f} msg/s in, "
          f"{idle / EMQX_MSG_S * 100:.1f} % of that broker's fan-out figure")
    q = r["agg"]["query_s"] / max(1, r["n"]) * m
    ret = r["agg"]["retained_s"] / max(1, r["n"]) * m
    print(f"  fleet status: {r['n']} robots' retained status+state arrived in "
          f"{r['agg']['retained_s'] * 1e3:.0f} ms and their status answers in "
          f"{r['agg']['query_s'] * 1e3:.0f} ms (all asked at once); linear in N (one paho "
          f"thread decodes them) ≈ {ret:.1f} s + {q:.1f} s at {m} (status answers are a few "
          f"kB each: --no-query keeps to the retained messages)")

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--daemons", default="5,10,15", help="N per step, growing (comma list)")
    ap.add_argument("--brokers", type=int, default=3)
    ap.add_argument("--cluster", choices=KINDS, default="mosquitto",
                    help="bridged Mosquittos or a NATS cluster (MQTT gateway, 3.1.1)")
    ap.add_argument("--trials", type=int, default=15)
    ap.add_argument("--period-s", type=float, default=1.5)
    ap.add_argument("--back-to-back", action="store_true", help="do not wait for every robot "
                    "at rest (the last stop's report and recording done) before a trial")
    ap.add_argument("--rest-timeout-s", type=float, default=60.0)
    ap.add_argument("--settle-s", type=float, default=1.0)
    ap.add_argument("--rig-fifo", type=int, default=40)
    ap.add_argument("--max-cpu", type=float, default=90.0,
                    help="stop growing when the fleet's own processes (daemons, rig, brokers) "
                         "use more than this %% of all CPUs")
    args = ap.parse_args(argv)
    print(f"load average at the start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
          f"cluster: {args.brokers} x {args.cluster}")
    results = []
    for n in [int(x) for x in args.daemons.split(",")]:
        r = step(n, args)
        report(r)
        results.append(r)
        if r["misses"]:
            print(f"  → misses at N = {n}: stop growing")
            break
        used = r["fleet_cpu"] / (os.cpu_count() or 1)
        if used > args.max_cpu:
            print(f"  → the fleet's processes use {used:.0f} % of all CPUs (> {args.max_cpu:g}): "
                  "stop growing")
            break
    ok = [r for r in results if not r["misses"]]
    print(f"\nlargest N with no missed e-stop: {ok[-1]['n'] if ok else 'none'} "
          f"(tried {', '.join(str(r['n']) for r in results)})")
    if ok:
        projection(ok[-1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
