"""Kalman prediction RMSE against the rig's ground truth, for dropouts of 50, 200 and 1,000 ms.

    python3 -m hil.kalman_rmse [--reps 5]

The daemon reports no predicted value outside its process, so this runs the daemon's core in
lock-step with the simulated firmware (hil/daemon_lockstep.py: the real Daemon, its SensorHub and
estimators, virtual time): mid-task, with the cube in the gripper (it moves), a dropout of the
channel is injected at the rig, and at every 5 ms of the dropout the hub's value (source
`predicted`) is compared with the rig's true state (`object.xyz`, `gripper.force_n`). Baseline:
the same error of the channel's fresh measurements in the 0.3 s before the dropout. Part 2 of
`hil.bench_degraded`.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Any

RMSE_CHANNELS = {"object_pose": ("object", "xyz"), "wrist_force": ("gripper", "force_n")}


def rmse_lockstep(channel: str, dropout_s: float, seed: int, tmp: Path) -> tuple[
        list[float], list[float], str, int]:
    """Errors (m or N, Euclidean over the channel's axes) of the values the hub gives the
    controller during one dropout of `channel` while usable (the last sample until the channel
    is stale, then the prediction, inside the bound), of its fresh values in the 0.3 s before,
    how the dropout ended, and how many of the dropout's values were predicted."""
    from edge_agent.sensors.readings import Source
    from hil.daemon_lockstep import DaemonLockstep

    h = DaemonLockstep(tmp / f"ls-{channel}-{dropout_s}-{seed}", seed=seed, estop_hold=False)
    d = h.boot()
    try:
        h.run_for(0.5)
        r = h.command("task.start", {})
        if not r.ok:
            return [], [], f"task.start refused: {r}", 0
        group, key = RMSE_CHANNELS[channel]

        def truth() -> tuple[float, ...]:
            v = h.runner.state()[group][key]
            return tuple(v) if isinstance(v, list) else (float(v),)

        def err(source_ok: Any) -> float | None:
            ch = d.hub.snapshot(h.clock.now(), tell=False).channel(channel)
            if ch.reading is None or not ch.usable or not source_ok(ch.reading.source):
                return None
            predicted[0] += ch.reading.source is Source.PREDICTED
            return math.dist(ch.reading.value, truth())

        predicted = [0]

        if not h.runner.run_until_true(lambda: bool(h.runner.state()["object"]["grasped"]), 30,
                                       poll_s=0.01):
            return [], [], "the cube was never grasped", 0
        h.run_for(0.05)
        fresh: list[float] = []
        for _ in range(60):
            h.run_for(0.005)
            e = err(lambda s: s is Source.MEASURED)
            if e is not None:
                fresh.append(e)
        h.runner.inject(f"sensor:{channel}", "dropout", duration_s=dropout_s)
        pred: list[float] = []
        end = h.runner.now + dropout_s
        while h.runner.now < end - 1e-9:
            h.run_for(min(0.005, end - h.runner.now))
            e = err(lambda s: True)  # what the daemon controls with, inside the bound
            if e is not None:
                pred.append(e)
        ch = d.hub.snapshot(h.clock.now(), tell=False).channel(channel)
        how = "past its bound (stop)" if ch.past_bound or ch.lost else "inside its bound"
        return pred, fresh, how, predicted[0]
    finally:
        h.close()


def rmse(xs: list[float]) -> float:
    return math.sqrt(sum(x * x for x in xs) / len(xs)) if xs else float("nan")


def main(reps: int = 5, tmp: Path | None = None) -> None:
    tmp = tmp or Path(tempfile.mkdtemp(prefix="edge-kalman-rmse-"))
    from edge_agent.logsetup import configure_logging

    configure_logging("warning")  # the lock-step daemons' info lines would drown the figures
    print(f"\nKalman prediction RMSE against the rig's ground truth (lock-step, {reps} dropout(s) "
          "each, mid-carry):")
    for channel in RMSE_CHANNELS:
        unit = "mm" if channel == "object_pose" else "N"
        scale = 1e3 if channel == "object_pose" else 1.0
        for dropout_s in (0.05, 0.2, 1.0):
            pred: list[float] = []
            fresh: list[float] = []
            ends: dict[str, int] = {}
            n_pred = 0
            for k in range(reps):
                p, f, how, npr = rmse_lockstep(channel, dropout_s, k + 1, tmp)
                n_pred += npr
                pred += p
                fresh += f
                ends[how] = ends.get(how, 0) + 1
            ratio = rmse(pred) / rmse(fresh) if pred and fresh else float("nan")
            print(f"  {channel:<12} dropout {dropout_s * 1e3:>5.0f} ms: RMSE "
                  f"{rmse(pred) * scale:.3f} {unit} (max {max(pred, default=math.nan) * scale:.3f},"
                  f" n={len(pred)}, {n_pred} predicted); fresh measurements "
                  f"{rmse(fresh) * scale:.3f} {unit} (n={len(fresh)}); ratio {ratio:.2f}; "
                  f"ended {ends}")




if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=5, help="dropouts per length")
    main(ap.parse_args().reps)
