"""What a typed event costs on the control thread: TypedDict vs dataclass, per event built.

    python -m hil.bench_contract [--batches 200] [--per-batch 2000]

Builds the executor's `task_done` event (7 fields) the ways a typed record could be made:
`literal` (a dict display annotated with the TypedDict: what the daemon does, the baseline),
`typeddict_call` (calling the TypedDict class: `TaskDoneEvent(type=..., ...)`), `dataclass`
(a slots dataclass, then `dataclasses.asdict` to publish it as JSON) and `dataclass_manual`
(the same with a hand-written to-dict). Prints per way the median, P99 and max ns per event
over the batches (the ways interleaved) and the ratio of medians to `literal`, then the
import cost of the records (`python -X importtime`, cumulative µs, best of 5).
msgspec is not in the venv, so it is not measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from edge_agent.contract.events import TaskDoneEvent
from edge_agent.vocab import EventType


@dataclasses.dataclass(slots=True)
class TaskDoneDC:
    type: str
    task_id: str
    outcome: str
    message: str
    attempts: int
    duration_s: float
    failures: list[Any]

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "task_id": self.task_id, "outcome": self.outcome,
                "message": self.message, "attempts": self.attempts,
                "duration_s": self.duration_s, "failures": self.failures}


def _literal(i: int) -> Any:
    ev: TaskDoneEvent = {"type": EventType.TASK_DONE, "task_id": "t", "outcome": "success",
                         "message": "task done", "attempts": i, "duration_s": 1.5,
                         "failures": []}
    return ev


def _typeddict_call(i: int) -> Any:
    return TaskDoneEvent(type=EventType.TASK_DONE, task_id="t", outcome="success",
                         message="task done", attempts=i, duration_s=1.5, failures=[])


def _dataclass(i: int) -> Any:
    return dataclasses.asdict(TaskDoneDC(EventType.TASK_DONE, "t", "success", "task done", i,
                                         1.5, []))


def _dataclass_manual(i: int) -> Any:
    return TaskDoneDC(EventType.TASK_DONE, "t", "success", "task done", i, 1.5, []).to_dict()


WAYS: dict[str, Callable[[int], Any]] = {
    "literal": _literal, "typeddict_call": _typeddict_call, "dataclass": _dataclass,
    "dataclass_manual": _dataclass_manual}


def measure(batches: int, per_batch: int) -> dict[str, list[float]]:
    """ns per event per batch for every way; the ways take turns batch by batch, so a load
    that comes and goes on the machine falls on all of them alike."""
    out: dict[str, list[float]] = {name: [] for name in WAYS}
    for _ in range(batches):
        for name, fn in WAYS.items():
            t0 = time.perf_counter_ns()
            for i in range(per_batch):
                fn(i)
            out[name].append((time.perf_counter_ns() - t0) / per_batch)
    return out


def import_us(module: str) -> int:
    """Cumulative import µs of `module` in a fresh interpreter (edge_agent.vocab preloaded)."""
    r = subprocess.run([sys.executable, "-X", "importtime", "-c",
                        f"import edge_agent.vocab; import {module}"],
                       capture_output=True, text=True, check=True)
    for line in r.stderr.splitlines():
        parts = [p.strip() for p in line.removeprefix("import time:").split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1])
    raise RuntimeError(f"{module} not in -X importtime output")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--batches", type=int, default=200)
    ap.add_argument("--per-batch", type=int, default=2000)
    args = ap.parse_args()
    runs = measure(args.batches, args.per_batch)
    base = statistics.median(runs["literal"])
    for name in WAYS:
        ns = sorted(runs[name])
        med = statistics.median(ns)
        print(json.dumps({"way": name, "median_ns": round(med, 1),
                          "p99_ns": round(ns[int(0.99 * (len(ns) - 1))], 1),
                          "max_ns": round(ns[-1], 1), "ratio_to_literal": round(med / base, 2)}))
    for mod in ("edge_agent.contract.events", "edge_agent.contract.status"):
        print(json.dumps({"import": mod, "cumulative_us": min(import_us(mod) for _ in range(5))}))


if __name__ == "__main__":
    main()
