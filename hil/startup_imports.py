"""What the start-up path's imports cost, and how much of it is creating dataclasses.

    python3 -m hil.startup_imports [--runs 5] [--top 15]

A fresh interpreter (per run) imports what `edge-agent run` imports before READY (the CLI, the
config, logging with structlog, the daemon's composition root) with `dataclasses._process_class`
timed: the imports' wall time, how many dataclasses they create and what creating them costs.
Same-run baseline: the cost of one synthetic dataclass of 6 fields, frozen and slotted (the
project's habit, STYLE.md) and plain, in the same interpreters — Python 3.11 compiles each
generated method (`__init__`, `__repr__`, `__eq__`, `__hash__`, `__setattr__`, `__delattr__`)
with an `exec` of its own. `--top` lists the slowest imports (`python -X importtime`).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STARTUP_MODULES = "edge_agent.cli, edge_agent.config, edge_agent.logsetup, edge_agent.daemon.app"

def child() -> None:
    """In a fresh interpreter (`measure` runs it): the start-up imports with dataclass creation
    timed, then the synthetic baseline; one JSON line on stdout."""
    import dataclasses
    import importlib

    orig = dataclasses._process_class  # type: ignore[attr-defined]
    n, by = 0, dict[str, float]()

    def timed(cls: type, *a: Any, **k: Any) -> Any:
        nonlocal n
        t = time.perf_counter()
        r = orig(cls, *a, **k)
        n += 1
        by[cls.__module__] = by.get(cls.__module__, 0.0) + (time.perf_counter() - t) * 1e3
        return r

    before = len(sys.modules)
    t0 = time.perf_counter()
    dataclasses._process_class = timed  # type: ignore[attr-defined]
    for name in STARTUP_MODULES.split(", "):
        importlib.import_module(name)
    from edge_agent.log import import_structlog

    import_structlog()
    total = time.perf_counter() - t0
    dataclasses._process_class = orig  # type: ignore[attr-defined]

    def synthetic(**kw: Any) -> float:
        ts = []
        for i in range(40):
            ns: dict[str, Any] = {"__annotations__": {f"f{j}": "float" for j in range(6)},
                                  "__doc__": "x", "__module__": __name__,
                                  **{f"f{j}": 0.0 for j in range(3, 6)}}
            cls = type(f"C{i}", (), ns)
            t = time.perf_counter()
            dataclasses.dataclass(**kw)(cls)
            ts.append(time.perf_counter() - t)
        return sorted(ts)[len(ts) // 2] * 1e3

    print(json.dumps({"import_ms": total * 1e3, "dataclasses": n,
                      "dataclass_ms": sum(by.values()), "by_module_ms": by,
                      "frozen_slots_ms": synthetic(frozen=True, slots=True),
                      "plain_ms": synthetic(), "modules": len(sys.modules) - before}))


def measure(runs: int = 5) -> dict[str, Any]:
    """Median over `runs` fresh interpreters of each figure (by_module: the last run's)."""
    code = "import hil.startup_imports as s; s.child()"  # imports nothing but the stdlib first
    got = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                     text=True, cwd=ROOT, check=True).stdout)
           for _ in range(runs)]
    out = {k: statistics.median(g[k] for g in got)
           for k in ("import_ms", "dataclasses", "dataclass_ms", "frozen_slots_ms", "plain_ms",
                     "modules")}
    out["by_module_ms"] = dict(sorted(got[-1]["by_module_ms"].items(), key=lambda kv: -kv[1]))
    out["runs"] = runs
    return out


def importtime(top: int = 15) -> list[tuple[str, float, float]]:
    """(module, self ms, cumulative ms) of the slowest imports on the start-up path."""
    res = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {STARTUP_MODULES}"],
                         capture_output=True, text=True, cwd=ROOT, check=True)
    rows = []
    for line in res.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((len(m.group(3)), m.group(4), int(m.group(1)) / 1e3,
                         int(m.group(2)) / 1e3))
    rows.sort(key=lambda r: -r[3])
    return [(("  " * (depth - 1)) + name, s, c) for depth, name, s, c in rows[:top]]


def report(m: dict[str, Any]) -> list[str]:
    share = m["dataclass_ms"] / m["import_ms"] if m["import_ms"] else 0.0
    lines = [f"start-up imports: {m['import_ms']:.0f} ms, {m['modules']:.0f} modules loaded "
             f"(median of {m['runs']} fresh interpreters)",
             f"  creating {m['dataclasses']:.0f} dataclasses: {m['dataclass_ms']:.0f} ms "
             f"({share:.0%} of the imports)",
             f"  one synthetic dataclass of 6 fields: frozen + slots "
             f"{m['frozen_slots_ms']:.2f} ms, plain {m['plain_ms']:.2f} ms",
             "  by module (ms, the last run):"]
    lines += [f"    {ms:6.1f}  {mod}" for mod, ms in list(m["by_module_ms"].items())[:12]]
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m hil.startup_imports",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5, help="fresh interpreters (default 5)")
    ap.add_argument("--top", type=int, default=0, help="also list the N slowest imports")
    a = ap.parse_args(argv)
    print("\n".join(report(measure(a.runs))))
    if a.top:
        print("slowest imports on the start-up path (self ms, cumulative ms):")
        for name, s, c in importtime(a.top):
            print(f"  {s:7.1f} {c:7.1f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
