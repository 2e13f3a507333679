"""Benchmark: pick-and-place under each single degradable fault, and the Kalman prediction error.

    python3 -m hil.bench_degraded [--n 100] [--faults camera,wrist_force,...] [--mqtt-port 0]

Part 1 — one real `edge-agent run --sim` daemon (hil/daemon_proc.py, as the other benches;
`health.period_s` from `--period-s`; its private Mosquitto is tests/mosquitto.py's).
Before each task the simulated cube is put at a seeded random pose in the rig's object box
(configs/rig/default.toml, as hil.pty_episodes), `task.start` goes over the local control socket,
and `--inject-at-s` later the fault is injected with `failure.inject` for its duration (broker
loss: the private Mosquitto is stopped and started again). Per fault: the success rate (target
≥ 95 %) beside the no-fault baseline's of the same run, task duration (median / P99 / max and the
ratio of medians to the baseline), fault → mode latency (injection → the daemon's `degraded`
event, wall clock: the event's log stamp), recovery latency (the fault's end → `recovered`), and
the modes seen. A fault whose injector this daemon lacks, or whose part is not configured (a GPU
— `--sim-gpu` gives the daemon its simulated one —, a Triton server: `--triton`), is skipped with
the reason printed. Before the next task the bench waits for
`state.degraded` to empty again. A fault that is not degradable (a stuck encoder: the safe answer
is the `sensor_bound` protective stop) is measured as fault → stop latency, and its task counts
as a success when it completes after the operator's part: the fault gone, `reset`, `resume`.

Part 2 — Kalman prediction RMSE against the rig's ground truth for dropouts of 50, 200 and
1,000 ms, in lock-step (hil/kalman_rmse.py, also `python3 -m hil.kalman_rmse`).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from hil import kalman_rmse
from hil.bench_stats import write_json
from hil.daemon_proc import Control, request, start_sim_daemon, stop_daemon, wait_for
from hil.degraded_faults import FAULTS, Fault, storm_rig_config
from hil.degraded_tally import Run, figures, report
from hil.steal import StealMeter

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the private broker of the daemon tests

from mosquitto import Mosquitto  # noqa: E402
from triton_server import TritonServer, triton_unavailable  # noqa: E402

MQTT_USER, MQTT_PASSWORD = "dev1", "dev1-secret-pw"


def log_time(rec: dict[str, Any]) -> float:
    """A JSON log line's wall time in seconds."""
    ts = rec.get("ts")
    if isinstance(ts, int | float):
        return float(ts)
    return dt.datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()


class Daemon:
    """The daemon process, its control socket, its rig's socket and the events in its log."""

    def __init__(self, state_dir: Path, sets: list[str]) -> None:
        self.dir = state_dir
        self.proc = start_sim_daemon(state_dir, sets)
        self.ctl = Control(state_dir)
        self._log = state_dir / "daemon.log"
        self._offset = 0
        self._events: list[dict[str, Any]] = []

    def socket_cmd(self, name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
        return self.ctl.call(name, **(args or {}))

    def rig(self, req: dict[str, Any]) -> dict[str, Any]:
        return request(self.dir / "rig.sock", req)

    def events(self) -> list[dict[str, Any]]:
        """Every event the daemon logged so far (read on from where the last call stopped)."""
        with open(self._log, "rb") as f:
            f.seek(self._offset)
            chunk = f.read()
        end = chunk.rfind(b"\n") + 1  # a line being written waits for the next call
        self._offset += end
        for line in chunk[:end].splitlines():
            if b'"event": "event"' not in line:
                continue
            with contextlib.suppress(ValueError):
                self._events.append(json.loads(line))
        return self._events


def events(d: Daemon, kind: str, since: float) -> list[dict[str, Any]]:
    return [e for e in d.events() if e.get("type") == kind and log_time(e) >= since]


def status(d: Daemon) -> dict[str, Any]:
    r = d.socket_cmd("status")
    if not r.get("ok"):
        raise RuntimeError(f"status refused: {r}")
    return r["result"]  # type: ignore[no-any-return]


class Bench:
    """The daemon, its broker and the seeded cube poses."""

    def __init__(self, d: Daemon, broker: Mosquitto | None, args: argparse.Namespace) -> None:
        self.d, self.broker, self.args = d, broker, args
        rig_cfg = tomllib.loads((ROOT / "configs" / "rig" / "default.toml").read_text())
        self.lo, self.hi = rig_cfg["object"]["box_min_m"], rig_cfg["object"]["box_max_m"]
        self.half = rig_cfg["object"]["size_m"] / 2
        self.rng = random.Random(args.seed)

    def skip_reason(self, f: Fault) -> str | None:
        """Why this fault cannot be run on this daemon (None: it can)."""
        if f.target == "broker":
            return None if self.broker is not None else (
                "broker loss needs the private Mosquitto (--mqtt-port 0 and mosquitto installed)")
        inference = status(self.d).get("inference") or {}
        if f.target == "triton" and not json.dumps(inference).count("triton"):
            return "no Triton server configured (inference.triton_url unset)"
        if f.target == "gpu" and "CUDAExecutionProvider" not in json.dumps(inference):
            return "no GPU execution provider configured (CPU-only inference)"
        return None

    def settle(self) -> None:
        """Idle, no mode in force: the previous task's fault is gone."""
        wait_for(lambda: status(self.d)["degraded"] == [], 60, "no mode in force")
        st = status(self.d)
        if st["mode"] not in ("idle", "holding") or st.get("stop"):
            wait_for(lambda: self.d.socket_cmd("reset")["ok"], 30, "reset")

    def inject(self, f: Fault) -> tuple[float, float] | str:
        """Inject `f`; (wall time of injection, wall time of its end) or the refusal."""
        t0 = time.time()
        if f.target == "broker":
            assert self.broker is not None
            broker = self.broker
            broker.stop()
            end = time.time() + f.duration_s
            back = threading.Timer(f.duration_s, broker.start)
            back.daemon = True  # never a broker started after the bench has ended
            back.start()
            return t0, end
        args: dict[str, Any] = {"target": f.target, "mode": f.mode, "duration_s": f.duration_s}
        if f.severity is not None:
            args["severity"] = f.severity
        r = self.d.socket_cmd("failure.inject", args)
        if not r.get("ok"):
            return str(r.get("error"))
        return t0, time.time() + f.duration_s

    def task(self, f: Fault | None, run: Run) -> None:
        xyz = [self.rng.uniform(self.lo[0], self.hi[0]), self.rng.uniform(self.lo[1], self.hi[1]),
               self.half]
        self.d.rig({"cmd": "set", "key": "object_xyz", "value": xyz})
        time.sleep(1.0)  # the camera estimate settles on the new pose (as hil.pty_episodes)
        t_start = time.time()
        r = self.d.socket_cmd("task.start")
        if not r.get("ok"):
            run.outcomes.append(f"refused:{r['error']['code']}")
            return
        task_id = str(r["result"]["task_id"])
        window: tuple[float, float] | None = None
        if f is not None:
            time.sleep(self.args.inject_at_s)  # a running task, mid-motion
            got = self.inject(f)
            if isinstance(got, str):
                run.outcomes.append(f"inject refused: {got}")
                return
            window = got
        try:
            if f is not None and f.stop is not None and window is not None:
                self.stopped(f, window, task_id, run)
            wait_for(lambda: bool(events(self.d, "task_done", t_start)), self.args.timeout_s,
                     "task_done")
            done = events(self.d, "task_done", t_start)[0]
            run.outcomes.append(str(done["outcome"]))
            if done["outcome"] != "success":
                why = str(done.get("message"))[:120]
                run.failures[why] = run.failures.get(why, 0) + 1
            run.durations.append(float(done["duration_s"]))
        except SystemExit:  # wait_for's timeout
            run.outcomes.append("timeout")
            self.d.socket_cmd("task.cancel")
        for e in events(self.d, "stop", t_start):  # protective stops latched during the task
            run.stops[str(e.get("cause"))] = run.stops.get(str(e.get("cause")), 0) + 1
        for e in events(self.d, "degraded", t_start):  # every mode entered during the task
            key = f"{e.get('mode')}/{e.get('subject') or '-'}"
            run.modes[key] = run.modes.get(key, 0) + 1
        if window is not None:
            self.latencies(f, window, run)  # type: ignore[arg-type]

    def stopped(self, f: Fault, window: tuple[float, float], task_id: str, run: Run) -> None:
        """A non-degradable fault: its protective stop, then the operator's reset and resume once
        the fault is gone (the task's own task_done then tells whether it completed)."""
        assert f.stop is not None
        t_inj, t_end = window
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            stops = [e for e in events(self.d, "stop", t_inj) if e.get("cause") == f.stop]
            if stops:
                run.to_stop.append(log_time(stops[0]) - t_inj)
                break
            time.sleep(0.01)
        else:
            run.missed_stop += 1
            return
        time.sleep(max(0.0, t_end - time.time()))
        wait_for(lambda: self.d.socket_cmd("reset")["ok"], 30, "reset after the fault")
        r = self.d.socket_cmd("resume", {"task_id": task_id})
        if not r.get("ok"):
            raise RuntimeError(f"resume refused: {r}")

    def latencies(self, f: Fault, window: tuple[float, float], run: Run) -> None:
        """Every mode entered from the injection to the task's end (counted by mode/subject);
        for a fault with an expected mode, its latencies."""
        t_inj, t_end = window
        if f.expect is None:
            return

        def expected() -> list[dict[str, Any]]:
            return [e for e in events(self.d, "degraded", t_inj)
                    if (e.get("mode"), e.get("subject") or "") == f.expect]

        deadline = time.monotonic() + max(10.0, 8 * self.args.period_s + f.duration_s)
        while not expected() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not expected():
            run.missed_mode += 1
            return
        deg = expected()[0]
        run.to_mode.append(log_time(deg) - t_inj)
        deadline += 30
        while time.monotonic() < deadline:
            rec = [e for e in events(self.d, "recovered", log_time(deg))
                   if (e.get("mode"), e.get("subject")) == (deg.get("mode"), deg.get("subject"))]
            if rec:
                run.to_recovered.append(log_time(rec[0]) - t_end)
                return
            time.sleep(0.05)
        run.missed_recovery += 1

    def run(self, f: Fault | None) -> Run:
        out = Run([], [], [], [], {}, {}, {})
        n = self.args.n if f is not None or self.args.baseline_n is None else self.args.baseline_n
        for i in range(n):
            self.settle()
            self.task(f, out)
            print(f"  {f.name if f else 'baseline'} task {i}: {out.outcomes[-1]}", flush=True)
        return out


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100, help="tasks per fault (and for the baseline)")
    ap.add_argument("--baseline-n", type=int, default=None,
                    help="no-fault tasks (default: --n); a run in parts needs one baseline")
    ap.add_argument("--faults", default=",".join(FAULTS),
                    help=f"comma-separated, of: {', '.join(FAULTS)}")
    ap.add_argument("--mqtt-port", type=int, default=0,
                    help="0 (default): a private Mosquitto (broker loss stops it); a port: that "
                         "broker (broker loss skipped: a shared broker is not stopped)")
    ap.add_argument("--period-s", type=float, default=0.5, help="health.period_s")
    ap.add_argument("--inject-at-s", type=float, default=1.0, help="after task.start")
    ap.add_argument("--timeout-s", type=float, default=60.0, help="per task")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rmse-reps", type=int, default=5, help="dropouts per length (0: skip)")
    ap.add_argument("--triton", action="store_true",
                    help="serve the trained policy from a real pytriton server (tests/"
                         "triton_server.py) that the daemon tries first: the triton fault runs")
    ap.add_argument("--sim-gpu", action="store_true",
                    help="the trained policy on the daemon's simulated GPU (sim.gpu = true, "
                         "CUDA then CPU providers): the gpu fault runs without a GPU")
    ap.add_argument("--spike-probability", type=float, default=0.5,
                    help="the rig's chance per sample of an outlier under the spikes fault "
                         "(configs/rig/default.toml: 0.05, under any max_ratio)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra daemon config override (repeatable)")
    ap.add_argument("--json", metavar="PATH", help="write the figure records here (hil.bench)")
    args = ap.parse_args(argv)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]  # a log file
    # a SIGTERM unwinds like ^C: the daemon (its own session) and the broker are stopped
    # (KeyboardInterrupt, not SystemExit: a task takes wait_for's SystemExit for a timeout)
    signal.signal(signal.SIGTERM, _interrupt)
    faults = [FAULTS[n] for n in args.faults.split(",") if n]
    tmp = Path(tempfile.mkdtemp(prefix="edge-bench-degraded-"))
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} "
          f"{os.getloadavg()[2]:.2f} on {os.cpu_count()} CPUs; health.period_s={args.period_s}")
    broker: Mosquitto | None = None
    sets = [f"health.period_s={args.period_s}", f"device.id={MQTT_USER}", *args.set]
    if args.sim_gpu:
        sets += ["sim.gpu=true", f"inference.model={ROOT / 'models' / 'pick-place-policy.onnx'}",
                 'inference.providers=["CUDAExecutionProvider","CPUExecutionProvider"]']
    if "spikes" in args.faults.split(","):
        storm = storm_rig_config(tmp / "rig-storm.toml", args.spike_probability)
        sets.append(f'sim.rig_config="{storm}"')
    if args.mqtt_port == 0:
        with contextlib.suppress(FileNotFoundError, OSError):
            broker = Mosquitto(tmp / "mosquitto", {MQTT_USER: MQTT_PASSWORD})
            broker.start()
    port = broker.port if broker is not None else (args.mqtt_port or 1)  # 1: no broker
    sets += [f"mqtt.port={port}", f'mqtt.password="{MQTT_PASSWORD}"']
    triton: TritonServer | None = None
    if args.triton:
        why_not = triton_unavailable()
        trained = ROOT / "models" / "pick-place-policy.onnx"
        if why_not is None:
            triton = TritonServer(trained, tmp / "triton.log")
            try:
                triton.start()
                triton.wait_ready(120.0)
            except Exception as exc:  # the run goes on without it: the fault is skipped
                why_not = f"{type(exc).__name__}: {exc} (see {tmp / 'triton.log'})"
                triton.stop()
                triton = None
        if triton is not None:
            sets += [f"inference.triton_url={triton.url}", f"inference.model={trained}"]
        else:
            print(f"--triton: no server ({why_not})", flush=True)
    d: Daemon | None = None
    t0 = time.monotonic()
    steal = StealMeter()
    try:
        steal.start()
        d = Daemon(tmp, sets)
        wait_for(lambda: status(d)["link_up"], 60, "the daemon's link up")
        bench = Bench(d, broker, args)
        if triton is not None:  # the first decisions may miss the deadline: Triton warms up
            wait_for(lambda: (status(d).get("inference") or {}).get("preferred_ready")
                     == "triton", 120, "Triton ready at the daemon")
        base = bench.run(None)
        report("baseline (no fault)", base, None)  # each as it ends: a cut-short run tells too
        results: list[tuple[str, Run]] = []
        skipped: dict[str, str] = {}
        for f in faults:
            why = bench.skip_reason(f)
            if why is not None:
                print(f"{f.name}: skipped: {why}", flush=True)
                skipped[f.name] = why
                continue
            results.append((f.name, bench.run(f)))
            report(f.name, results[-1][1], base)
    finally:
        steal.stop()
        if d is not None:
            stop_daemon(d.proc)
        if broker is not None:
            broker.stop()
        if triton is not None:
            triton.stop()
    print(f"\n{args.n} task(s) per fault, {time.monotonic() - t0:.0f} s wall; load average now "
          f"{os.getloadavg()[0]:.2f}; {steal.describe()}")
    report("baseline (no fault)", base, None)
    for name, r in results:
        report(name, r, base)
    write_json(args.json, figures(base, results), skipped=skipped)
    if args.rmse_reps > 0:
        kalman_rmse.main(args.rmse_reps, tmp)
    print(f"logs: {tmp}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
