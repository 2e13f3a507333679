"""hil.soak's pure part: the slope, the verdicts and the Markdown from a handful of samples
(no daemon, no soak run: hil/soak.py does that)."""

from __future__ import annotations

import copy
from typing import Any

from hil.soak_verdict import MB, flat, markdown, slope_per_hour, verdicts


def _sample(t_s: float, rss_mb: float, threads: int = 18, fds: int = 21,
            journal_bytes: int = 1000) -> dict[str, Any]:
    return {"t_s": t_s, "wall": 1.0e9 + t_s, "load1": 1.5,
            "procs": {"daemon": {"pid": 42, "rss_bytes": int(rss_mb * MB), "threads": threads,
                                 "fds": fds, "cpu_s": t_s / 10},
                      "broker": {"pid": 7, "rss_bytes": 8 * MB, "threads": 1, "fds": 8,
                                 "cpu_s": 0.1}},
            "disk": {"journal": {"bytes": journal_bytes, "files": 2},
                     "reports": {"bytes": 500, "files": 3}}}


def _result(rss: list[float]) -> dict[str, Any]:
    samples = [_sample(600.0 * i, r) for i, r in enumerate(rss)]  # every 10 minutes
    return {
        "minutes": 60, "command": "python -m hil.soak --minutes 60", "commit": "abc1234",
        "started_utc": "2026-12-06 09:50 UTC", "machine": "2 CPUs (test)", "interval_s": 600.0,
        "warmup_s": 300.0, "samples": samples,
        "daemon": {"pid": 42, "pid_unchanged": True, "exit_code": 0, "tracebacks": 0},
        "counts": {"tasks": {"success": 9, "failed": 1, "aborted": 1}, "faults": {"e-stop": 2},
                   "stops": {"estop/estop_input": 2}, "modes": {}, "resets": 2, "resumes": 2,
                   "resume_refused": 0, "cancels": 0, "broker_restarts": 1, "link_unplugs": 1,
                   "model_events": ["update: trial committed"]},
        "reports": {"built_ids": ["r1", "r2"],
                    "sinks": {"disk": ["r1", "r2"], "mqtt": ["r2", "r1"], "webhook": ["r1", "r2"]}},
        "caps": {"journal": {"bytes": 10_000, "files": None},
                 "reports": {"bytes": None, "files": 600}},
        "not_injected": {"triton down": "no server"},
        "loop_gc": {"after_startup": {
            "collections": [900, 80, 0], "max_ms": [14.8, 6.0, 0.0], "over_5ms": [9, 2, 0],
            "max_cpu_ms": [0.9, 5.5, 0.0], "cpu_over_5ms": [0, 1, 0],
            "preempted_5ms": [9, 1, 0]}},
    }


def test_slope_is_per_hour_by_least_squares() -> None:
    assert slope_per_hour([(0.0, 10.0), (1800.0, 11.0), (3600.0, 12.0)]) == 2.0
    assert slope_per_hour([(0.0, 1.0)]) is None
    assert slope_per_hour([(5.0, 1.0), (5.0, 2.0)]) is None
    noisy = [(0.0, 5.0), (1200.0, 7.0), (2400.0, 5.0), (3600.0, 7.0)]
    assert abs(slope_per_hour(noisy) - 1.2) < 1e-9  # type: ignore[operator]


def test_flat_compares_the_last_third_with_the_first() -> None:
    assert flat([(0, 18), (1, 19), (2, 18), (3, 18), (4, 19), (5, 18)], 2)[0]
    assert not flat([(0, 18), (1, 18), (2, 22), (3, 25), (4, 28), (5, 30)], 2)[0]


def test_a_flat_run_passes_every_criterion() -> None:
    res = _result([95.0, 100.0, 100.2, 100.1, 100.3, 100.2, 100.4])
    v = {x["name"]: x for x in verdicts(res)}
    assert all(x["ok"] for x in v.values()), v
    md = markdown({**res, "verdicts": list(v.values())})
    assert md.startswith("### Soak: 60 minutes (PASS)")
    assert "| daemon RSS slope after warm-up ≤ 1 MB/h | pass |" in md
    assert "![RSS per process](perf/soak-rss.png)" in md
    assert "`python -m hil.soak --minutes 60`" in md
    assert "success 9, failed 1, aborted 1" in md
    assert "over 5 ms on the wall clock 9/2" in md and "preempted (under half" in md


def test_each_failure_is_named() -> None:
    res = _result([95.0, 100.0, 102.0, 104.0, 106.0, 108.0, 110.0])  # 12 MB/h
    res["daemon"]["pid_unchanged"] = False
    res["counts"]["tasks"]["timeout"] = 1
    res["reports"]["sinks"]["mqtt"] = ["r1", "r1"]  # r2 missing, r1 twice
    res["samples"][-1]["disk"]["journal"]["bytes"] = 20_000
    for s in res["samples"][4:]:
        s["procs"]["daemon"]["threads"] = 30
    failed = {x["name"]: x["detail"] for x in verdicts(res) if not x["ok"]}
    assert set(failed) == {"no crash", "every task ends in a defined outcome",
                           "every report delivered once to every sink",
                           "daemon RSS slope after warm-up ≤ 1 MB/h",
                           "daemon threads and fds flat", "disk use bounded by its caps"}
    assert "mqtt: 2 (1 missing, 1 repeated)" in failed["every report delivered once to every sink"]
    assert "12.0 MB/h" in failed["daemon RSS slope after warm-up ≤ 1 MB/h"]
    assert "journal 20000 B > 10000 B" in failed["disk use bounded by its caps"]
    assert "(FAIL)" in markdown(copy.deepcopy(res))


def test_growth_after_every_fault_kind_ran_once_and_the_early_slope_beside_it() -> None:
    # a step at the first time of some fault (20 min), flat after every kind ran once (25 min)
    res = _result([95.0, 100.0, 100.1, 104.0, 104.1, 104.0, 104.1])
    res.update(warmup_s=1500.0, warmup_min_s=300.0, every_kind_s=1500.0)
    v = {x["name"]: x for x in verdicts(res)}
    rss = v["daemon RSS slope after warm-up ≤ 1 MB/h"]
    assert rss["ok"], rss
    assert rss["detail"].startswith("0.12 MB/h (104.0 → 104.1 MB)"), rss
    # ... and the slope with the first faults in it is stated, not hidden
    assert "after the first 5 minutes only (each fault kind's first time included): 5.54 MB/h" \
        in rss["detail"], rss
    md = markdown({**res, "verdicts": list(v.values())})
    assert ("growth is measured after 25.0 minutes: the first 5, and until every fault kind "
            "had run once at 25.0 min") in md
    res.update(warmup_s=300.0, every_kind_s=None)  # a short run: not every kind ran
    assert ("growth is measured after the first 5 minutes (not every fault kind ran: a short "
            "run)") in markdown(res)


def test_the_rss_slope_is_split_into_heap_and_mapped_files_when_sampled() -> None:
    res = _result([95.0, 100.0, 101.0, 102.0, 103.0, 104.0, 105.0])  # 6 MB/h
    for s in res["samples"]:  # all of it in the file-backed pages: libraries read back in
        d = s["procs"]["daemon"]
        d["rss_anon_bytes"], d["rss_file_bytes"] = 50 * MB, d["rss_bytes"] - 50 * MB
    rss = {x["name"]: x for x in verdicts(res)}["daemon RSS slope after warm-up ≤ 1 MB/h"]
    assert not rss["ok"]
    assert ", of which anonymous (the heap) 0.0 MB/h, file-backed 6.0 MB/h" in rss["detail"], rss
