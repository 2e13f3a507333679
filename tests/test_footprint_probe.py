"""hil/footprint_probe.py: what python -m hil.footprint reads from /proc, and its import order."""

from __future__ import annotations

import os
import threading
import time

from hil import footprint_probe as probe


def test_rollup_and_parts_describe_this_process() -> None:
    started, release = threading.Event(), threading.Event()

    def idle() -> None:
        started.set()
        release.wait(30)

    t = threading.Thread(target=idle)
    t.start()
    started.wait(10)
    try:
        r = probe.rollup(os.getpid())
        parts = probe.parts(os.getpid())
        assert probe.threads(os.getpid()) >= 2
    finally:
        release.set()
        t.join()
    assert 0 < r["uss"] <= r["pss"] <= r["rss"] and r["anon"] + r["file"] == r["rss"]
    # every mapping lands in one part: the parts add up to the RSS (read a moment apart)
    assert abs(sum(parts.values()) - r["rss"]) < 4 << 20
    assert parts.get("thread stacks", 0) > 0  # the idle thread's stack, under its guard page
    assert any("libpython" in p or "system libraries" in p for p in parts)


def test_cpu_s_counts_this_process_work() -> None:
    before = probe.cpu_s(os.getpid())
    end = time.process_time() + 0.05
    while time.process_time() < end:
        pass
    assert probe.cpu_s(os.getpid()) > before


def test_the_walk_order_puts_what_a_package_imports_before_it() -> None:
    """`-X importtime` lists a package's first submodule before the `__init__` that imported
    numpy; the walk imports numpy's group first, then onnxruntime's, completion order within."""
    log = "\n".join([
        "import time: self [us] | cumulative | imported package",
        "import time:        10 |         10 | json",
        "import time:         5 |          5 |   onnxruntime.capi",
        "import time:         3 |          3 |         numpy.core",
        "import time:         9 |         12 |       numpy",
        "import time:        20 |         32 |     onnxruntime.capi._pybind_state",
        "import time:        30 |         67 | onnxruntime",
        "import time:         1 |          1 | edge_agent.x",
        "{\"event\": \"not an import line\"}",
    ])
    order = probe.importtime_modules(log)
    assert order == ["json", "numpy.core", "numpy", "onnxruntime.capi",
                     "onnxruntime.capi._pybind_state", "onnxruntime", "edge_agent.x"]
    assert probe.group_of("zstandard.backend_c") == probe.group_of("mcap.writer")
    assert probe.group_of("_ssl") == "stdlib"


def test_the_import_walk_runs_in_a_fresh_interpreter() -> None:
    out = probe.import_walk(["json", "no_such_module_here"], None)
    assert out["interpreter"] > 0 and out["total"] >= out["interpreter"]
    assert out["failed"] == ["no_such_module_here"] and "stdlib" in out["groups"]
