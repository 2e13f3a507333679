"""hil.soak's pure part: the growth slopes, the pass/fail verdicts and the Markdown section.

No process, broker or daemon here: `verdicts(result)` and `markdown(result)` read the dict
hil.soak writes to hil/results/soak.json (its `samples`, `counts`, `reports`, `caps`), so a
test can feed them a handful of samples.

A sample (one every `interval_s`): `t_s` (seconds since the daemon's READY), `load1`,
`procs` {role: {pid, rss_bytes, threads, fds, cpu_s}} and `disk` {folder: {bytes, files}}.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MB = 1024 * 1024
RSS_TARGET_MB_PER_H = 1.0  # issue 32: daemon RSS slope after warm-up
THREADS_TOLERANCE = 2  # "flat": the last third's median within this of the first third's
FDS_TOLERANCE = 4
OUTCOMES = ("success", "failed", "aborted")  # edge_agent/executor/records.py Outcome
GROWTH_ROLES = ("daemon", "rig", "guardian")  # the broker is restarted on purpose


def slope_per_hour(points: Sequence[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t seconds, y) in y per hour; None under two distinct times."""
    n = len(points)
    if n < 2:
        return None
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((t - mt) ** 2 for t, _ in points)
    if sxx == 0:
        return None
    sxy = sum((t - mt) * (y - my) for t, y in points)
    return sxy / sxx * 3600.0


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return float(s[n // 2]) if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def after_warmup(samples: Sequence[dict[str, Any]], warmup_s: float) -> list[dict[str, Any]]:
    return [s for s in samples if s["t_s"] >= warmup_s]


def series(samples: Sequence[dict[str, Any]], role: str, key: str) -> list[tuple[float, float]]:
    """(t_s, value) of one process's field, the samples where that process was seen."""
    return [(s["t_s"], float(s["procs"][role][key])) for s in samples
            if role in s["procs"] and s["procs"][role].get(key) is not None]


def flat(points: Sequence[tuple[float, float]], tolerance: float) -> tuple[bool, str]:
    """No upward trend: the last third's median at most `tolerance` above the first third's."""
    if len(points) < 3:
        return True, "too few samples to tell"
    k = len(points) // 3
    first = _median([y for _, y in points[:k]])
    last = _median([y for _, y in points[-k:]])
    lo, hi = min(y for _, y in points), max(y for _, y in points)
    return last <= first + tolerance, f"{first:g} → {last:g} (range {lo:g}–{hi:g})"


def growth(result: dict[str, Any], since_s: float | None = None) -> dict[str, dict[str, Any]]:
    """Per process after warm-up (or `since_s`): RSS first/last/slope (MB, MB/h), threads and
    fds."""
    samples = after_warmup(result["samples"], result["warmup_s"] if since_s is None else since_s)
    out: dict[str, dict[str, Any]] = {}
    roles = sorted({r for s in result["samples"] for r in s["procs"]})
    for role in roles:
        rss = series(samples, role, "rss_bytes")
        thr, fds = series(samples, role, "threads"), series(samples, role, "fds")
        cpu = series(result["samples"], role, "cpu_s")
        slope = slope_per_hour([(t, y / MB) for t, y in rss])
        parts = {k: slope_per_hour([(t, y / MB) for t, y in
                                    series(samples, role, f"rss_{k}_bytes")])
                 for k in ("anon", "file")}
        pids = sorted({s["procs"][role]["pid"] for s in result["samples"] if role in s["procs"]})
        out[role] = {
            "pids": pids,
            "rss_first_mb": round(rss[0][1] / MB, 1) if rss else None,
            "rss_last_mb": round(rss[-1][1] / MB, 1) if rss else None,
            "rss_max_mb": round(max(y for _, y in rss) / MB, 1) if rss else None,
            "rss_slope_mb_per_h": None if slope is None else round(slope, 2),
            # the heap (anonymous) and the mapped files (libraries: the kernel may drop and
            # re-read their pages), when the samples have them
            **{f"rss_{k}_slope_mb_per_h": round(v, 2) for k, v in parts.items() if v is not None},
            "threads": flat(thr, THREADS_TOLERANCE), "fds": flat(fds, FDS_TOLERANCE),
            "cpu_s": round(cpu[-1][1] - cpu[0][1], 1) if len(cpu) > 1 else None,
            "cpu_pct": (round(100 * (cpu[-1][1] - cpu[0][1]) / (cpu[-1][0] - cpu[0][0]), 1)
                        if len(cpu) > 1 and cpu[-1][0] > cpu[0][0] else None),
        }
    return out


def _rss_parts(g: dict[str, Any]) -> str:
    anon, file = g.get("rss_anon_slope_mb_per_h"), g.get("rss_file_slope_mb_per_h")
    if anon is None or file is None:
        return ""
    return f", of which anonymous (the heap) {anon} MB/h, file-backed {file} MB/h"


def _early_slope(result: dict[str, Any]) -> str:
    """The daemon's slope after the first minutes only (its first faults included), when the
    warm-up went on until every fault kind had run once."""
    first = result.get("warmup_min_s")
    if first is None or first >= result["warmup_s"]:
        return ""
    d = growth(result, first).get("daemon") or {}
    return (f"; after the first {first / 60:g} minutes only (each fault kind's first time "
            f"included): {d.get('rss_slope_mb_per_h')} MB/h")


def warmup_words(result: dict[str, Any]) -> str:
    """What the warm-up was, for the page."""
    every, first = result.get("every_kind_s"), result.get("warmup_min_s")
    if first is None:  # a result from before the fault deck (12-07 and earlier)
        return f"growth is measured after the first {result['warmup_s'] / 60:g} minutes"
    if every is None:
        return (f"growth is measured after the first {first / 60:g} minutes (not every fault "
                "kind ran: a short run)")
    return (f"growth is measured after {result['warmup_s'] / 60:.1f} minutes: the first "
            f"{first / 60:g}, and until every fault kind had run once at {every / 60:.1f} min")


def verdicts(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each criterion: {name, ok, detail}."""
    c, g = result["counts"], growth(result)
    out: list[dict[str, Any]] = []

    def add(name: str, ok: bool, detail: str) -> None:
        out.append({"name": name, "ok": bool(ok), "detail": detail})

    d = result["daemon"]
    add("no crash", d["pid_unchanged"] and d["exit_code"] == 0 and not d["tracebacks"],
        f"daemon pid {d['pid']} {'unchanged' if d['pid_unchanged'] else 'CHANGED'}, exit code "
        f"{d['exit_code']} on SIGTERM, {d['tracebacks']} traceback(s) in its log")
    tasks = c["tasks"]
    undefined = {k: v for k, v in tasks.items() if k not in OUTCOMES and v}
    add("every task ends in a defined outcome", not undefined and sum(tasks.values()) > 0,
        ", ".join(f"{k} {v}" for k, v in tasks.items()) or "no task")
    rep = result["reports"]
    sinks = rep["sinks"]
    bad = {name: {"missing": len(set(rep["built_ids"]) - set(ids)),
                  "repeated": len(ids) - len(set(ids))} for name, ids in sinks.items()}
    ok = bool(rep["built_ids"]) and all(v["missing"] == 0 and v["repeated"] == 0
                                        for v in bad.values())
    add("every report delivered once to every sink", ok,
        f"{len(rep['built_ids'])} reports; " + "; ".join(
            f"{n}: {len(ids)} ({bad[n]['missing']} missing, {bad[n]['repeated']} repeated)"
            for n, ids in sinks.items()))
    for role in GROWTH_ROLES:
        if role not in g:
            continue
        s = g[role]["rss_slope_mb_per_h"]
        if role == "daemon":
            add("daemon RSS slope after warm-up ≤ 1 MB/h",
                s is not None and s <= RSS_TARGET_MB_PER_H,
                f"{s} MB/h ({g[role]['rss_first_mb']} → {g[role]['rss_last_mb']} MB)"
                + _rss_parts(g[role]) + _early_slope(result))
        thr_ok, thr = g[role]["threads"]
        fds_ok, fds = g[role]["fds"]
        add(f"{role} threads and fds flat", thr_ok and fds_ok, f"threads {thr}; fds {fds}")
    last = result["samples"][-1]["disk"] if result["samples"] else {}
    over = []
    for folder, cap in result["caps"].items():
        got = last.get(folder) or {"bytes": 0, "files": 0}
        worst = max((s["disk"].get(folder) or {"bytes": 0})["bytes"] for s in result["samples"])
        if cap.get("bytes") is not None and worst > cap["bytes"]:
            over.append(f"{folder} {worst} B > {cap['bytes']} B")
        if cap.get("files") is not None and got["files"] > cap["files"]:
            over.append(f"{folder} {got['files']} files > {cap['files']}")
    add("disk use bounded by its caps", not over, "; ".join(over) or ", ".join(
        f"{f} {_mb(last.get(f, {}).get('bytes', 0))} MB / {len_cap(c2)}"
        for f, c2 in result["caps"].items()))
    return out


def _mb(b: float) -> str:
    return f"{b / MB:.1f}"


def len_cap(cap: dict[str, Any]) -> str:
    parts = []
    if cap.get("bytes") is not None:
        parts.append(f"cap {_mb(cap['bytes'])} MB")
    if cap.get("files") is not None:
        parts.append(f"{cap['files']} files")
    return " and ".join(parts) or "no cap"


def markdown(result: dict[str, Any]) -> str:
    """The ready Markdown section for docs/PERFORMANCE.md (images relative to docs/)."""
    v = result.get("verdicts") or verdicts(result)
    g = growth(result)
    c = result["counts"]
    loads = [s["load1"] for s in result["samples"] if s.get("load1") is not None]
    lines = [
        f"### Soak: {result['minutes']:g} minutes "
        f"({'PASS' if all(x['ok'] for x in v) else 'FAIL'})", "",
        f"`{result['command']}` — {result['started_utc']}, commit `{result['commit']}`, "
        f"{result['machine']}; load average (1 min) over the run: median "
        f"{_median(loads) if loads else float('nan'):.2f}, max "
        f"{max(loads) if loads else float('nan'):.2f}. Samples every {result['interval_s']:g} s; "
        f"{warmup_words(result)}.", "",
        "| criterion | result | detail |", "|---|---|---|",
    ]
    lines += [f"| {x['name']} | {'pass' if x['ok'] else '**FAIL**'} | {x['detail']} |"
              for x in v]
    lines += ["", "| process | RSS after warm-up (MB) | RSS slope (MB/h) | threads | fds | "
              "CPU (s, % of one core) |", "|---|---|---|---|---|---|"]
    for role, s in g.items():
        lines.append(f"| {role} (pid {', '.join(map(str, s['pids']))}) | {s['rss_first_mb']} → "
                     f"{s['rss_last_mb']} (max {s['rss_max_mb']}) | {s['rss_slope_mb_per_h']} | "
                     f"{s['threads'][1]} | {s['fds'][1]} | {s['cpu_s']} ({s['cpu_pct']} %) |")
    tasks = ", ".join(f"{k} {n}" for k, n in c["tasks"].items())
    faults = ", ".join(f"{k} {n}" for k, n in sorted(c["faults"].items()))
    lines += ["", f"Tasks: {sum(c['tasks'].values())} ({tasks}). Faults injected: "
              f"{sum(c['faults'].values())} ({faults}).",
              f"Stops latched: {sum(c['stops'].values())} "
              f"({', '.join(f'{k} {n}' for k, n in sorted(c['stops'].items())) or 'none'}); "
              f"modes entered: "
              f"{', '.join(f'{k} {n}' for k, n in sorted(c['modes'].items())) or 'none'}; "
              f"operator resets {c['resets']}, resumes {c['resumes']} "
              f"(refused {c['resume_refused']}), cancels {c['cancels']}. "
              f"Broker restarts {c['broker_restarts']}, link unplugs {c['link_unplugs']}.",
              f"Models: {'; '.join(c['model_events']) or 'no model update'}.",
              f"Reports built {len(result['reports']['built_ids'])}: "
              + ", ".join(f"{n} {len(ids)}" for n, ids in result["reports"]["sinks"].items())
              + ".", "",
              "![RSS per process](perf/soak-rss.png)", "",
              "![threads and fds per process](perf/soak-threads-fds.png)", "",
              "![state directory disk use](perf/soak-disk.png)", ""]
    gc = (result.get("loop_gc") or {}).get("after_startup")
    if gc and "cpu_over_5ms" in gc:

        def pair(key: str) -> str:
            return f"{gc[key][0]:g}/{gc[key][1]:g}"

        lines += [f"Garbage collections after start-up (`status.loop.gc.after_startup`, "
                  f"generations 0/1): {pair('collections')}; over 5 ms on the wall clock "
                  f"{pair('over_5ms')} (max {pair('max_ms')} ms), of which over 5 ms of the "
                  f"collecting thread's CPU {pair('cpu_over_5ms')} (max {pair('max_cpu_ms')} ms) "
                  f"and preempted (under half their wall time on CPU) {pair('preempted_5ms')}.",
                  ""]
    if result.get("not_injected"):
        lines += ["Not injected: " + "; ".join(f"{k}: {why}" for k, why in
                                                 result["not_injected"].items()) + ".", ""]
    return "\n".join(lines)
