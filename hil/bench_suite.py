"""What `python -m hil.bench` runs: each bench module, its area on docs/PERFORMANCE.md, and its
arguments for `--quick` (minutes on a 2-core VM, small n) and for the full run (the page's).

Every `hil/bench_*.py` is either a `Bench` here or in `EXCLUDED` with the reason
(tests/test_bench_runner.py checks it, so a new bench cannot be forgotten). Each bench is run
as its own process (`python -m MODULE ARGS --json PATH`): one bench's threads, sockets, daemons
and SCHED_FIFO requests cannot leak into the next one's figures.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Bench:
    name: str
    module: str
    area: str
    what: str
    quick: tuple[str, ...]
    full: tuple[str, ...]
    full_only: bool = False

    def argv(self, quick: bool) -> list[str]:
        return ["-m", self.module, *(self.quick if quick else self.full)]


# the areas in the page's order
AREAS = ("Start-up", "E-stop", "Control loop", "Inference", "Link", "Health and degradation",
         "Fault storm", "Observers (on vs off)", "Fleet")

BENCHES: tuple[Bench, ...] = (
    Bench("startup", "hil.bench_startup", "Start-up",
          "exec → READY, lazy vs --eager and vs the bare interpreter",
          ("--runs", "3"), ("--runs", "20")),
    Bench("guardian_estop", "hil.bench_guardian_estop", "E-stop",
          "guardian e-stop on a pty vs a bare pty echo",
          ("--edges", "300"), ("--edges", "10000")),
    Bench("daemon_estop", "hil.bench_daemon_estop", "E-stop",
          "hardware and MQTT e-stop with the whole daemon up vs a bare pty round trip",
          ("--edges", "300", "--mqtt-estops", "20"),
          ("--edges", "10000", "--mqtt-estops", "200")),
    Bench("control_loop", "hil.bench_control_loop", "Control loop",
          "500 Hz control loop mid-task vs a bare SCHED_FIFO Python loop",
          # quick: deadman 250 ms as for degraded below (the loop's figure is the COMMAND
          # stream at the robot: a trip before the task latches it and task.start is refused)
          ("--tasks", "1", "--set", "link.deadman_ms=250"), ("--tasks", "3")),
    Bench("inference", "hil.bench_inference", "Inference",
          "policy decision vs bare onnxruntime; load; Triton vs bare tritonclient",
          ("--n", "1000", "--load-runs", "2", "--triton"), ("--n", "5000", "--triton")),
    Bench("relay", "hil.bench_relay", "Link",
          "PING → PONG through the guardian vs bare pyserial",
          ("--pings", "300"), ("--pings", "5000")),
    Bench("link_reader", "hil.bench_link_reader", "Link",
          "the daemon's link reader per STATUS frame vs decoding the frame",
          ("--n", "3000", "--repeat", "1"), ("--n", "20000", "--repeat", "3")),
    Bench("health_cost", "hil.bench_health_cost", "Health and degradation",
          "the health monitor's CPU per probe period",
          ("--periods", "0.2", "--window", "10"), ("--periods", "10", "0.2", "--window", "60")),
    Bench("degraded", "hil.bench_degraded", "Health and degradation",
          "pick-and-place under each degradable fault vs no fault",
          # quick: the firmware's deadman at 2 × 250 ms, as bench_shadow and bench_recorder
          # run it: on a loaded 2-core VM sim.toml's 50 ms (100 ms at the firmware) trips
          ("--n", "1", "--baseline-n", "1", "--faults", "camera,wrist_force",
           "--rmse-reps", "0", "--timeout-s", "40", "--set", "link.deadman_ms=250"),
          ("--n", "20", "--sim-gpu", "--triton", "--rmse-reps", "0")),
    Bench("fault_storm", "hil.bench_fault_storm", "Fault storm",
          "an e-stop a second: the control loop vs a quiet window, the reports delivered",
          ("--seconds", "5"), ("--seconds", "60")),
    Bench("recorder", "hil.bench_recorder", "Observers (on vs off)",
          "flight recorder ring / capture vs off",
          ("--rounds", "1", "--window-s", "4", "--settle-s", "2"),
          ("--rounds", "2", "--window-s", "20")),
    Bench("observe", "hil.bench_observe", "Observers (on vs off)",
          "metrics scraped + live view subscribed vs off",
          ("--rounds", "1", "--window", "5"), ("--rounds", "2", "--window", "20")),
    Bench("shadow", "hil.bench_shadow", "Observers (on vs off)",
          "a shadow candidate beside the acting model vs none",
          ("--pairs", "1"), ("--pairs", "4")),
    Bench("fleet_estop", "hil.bench_fleet_estop", "Fleet",
          "one fleet e-stop → STOP at 8 robots vs the broker's round trip",
          # 8: what a 2-core machine holds with room (a daemon with its guardian ~18 % of a
          # core in the fleet profile, docs/FLEET.md); 20 saturated it (12-06: load 94, 162
          # misses; 12-07: not even up in 120 s) and measured the machine, not the fleet
          (), ("--daemons", "8", "--trials", "30"), full_only=True),
)

# hil/bench_*.py modules the runner does not run, and why
EXCLUDED: dict[str, str] = {
    "hil.bench_stats": "helpers the benches share (median / P99 / max, the --json records)",
    "hil.bench_suite": "this list of the benches hil.bench runs, not a bench",
    "hil.bench_page": "renders docs/PERFORMANCE.md from the results JSON",
    "hil.bench_contract": "a design comparison (TypedDict vs dataclass per event), not a "
                          "figure of the daemon",
    "hil.bench_control_math": "per-call micro-costs (IK/FK, estimators) inside the control "
                              "loop, whose end-to-end figure is bench_control_loop",
    "hil.bench_store": "the store's fsync path on the disk given by --dir: a figure of that "
                       "disk, not one of issue 32's figures",
    "hil.bench_fleet": "N daemons behind a 3-node broker cluster, grown until misses "
                       "(docs/FLEET.md); the page's fleet figure is bench_fleet_estop's",
    "hil.bench_trial_rollback": "a model trial's rollback time (docs/MODELS.md), not one of "
                                "issue 32's figures",
}


def by_name(names: str | None, quick: bool) -> list[Bench]:
    """The benches `--only a,b` names (all when None; the full-only ones only in a full run)."""
    if names:
        wanted = [n.strip() for n in names.split(",") if n.strip()]
        known = {b.name: b for b in BENCHES}
        unknown = [n for n in wanted if n not in known]
        if unknown:
            raise SystemExit(f"unknown bench(es) {', '.join(unknown)}; --list names them")
        return [known[n] for n in wanted]
    return [b for b in BENCHES if not (quick and b.full_only)]
