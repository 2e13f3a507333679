"""Benchmark of the crash-safe store: snapshot save, journal append, store-thread submit latency.

    python3 -m hil.bench_store [--dir DIR] [--n 300] [--decisions 5000]

Prints median / P99 / max per measurement, with a same-run baseline (a bare write + fsync +
rename + fsync(dir) of the same bytes), so a slow disk or a loaded machine shows as such.
DIR must be on the disk under test (default: a temp dir under /var/tmp, not tmpfs).

The decision journal's record path — what the control thread pays per decision — is timed
three times in one run, interleaved: without episode fields (format 1, no episode mark), with
them (format 2: the mark stamps the task id and step and counts the backend), and with episode
fields plus the drift report's (state, action) count (store/drift_tally.py), on a router-shaped
record paced at 1 kHz so the writer keeps up (issue 28: the cost must be unchanged).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import tempfile
import time
import timeit
from collections.abc import Callable
from pathlib import Path

from edge_agent.policy_seam import OBS_FIELDS
from edge_agent.store.crc32c import crc32c
from edge_agent.store.decisions import DecisionJournal, encode_decision
from edge_agent.store.drift_tally import DriftTally
from edge_agent.store.episodes import EpisodeMark
from edge_agent.store.journal import Journal
from edge_agent.store.snapshot import SnapshotStore
from edge_agent.store.writer import StoreWriter
from edge_agent.vocab import EventType


def _row(name: str, samples_s: list[float]) -> None:
    s = sorted(samples_s)
    p99 = s[min(len(s) - 1, int(len(s) * 0.99))]
    print(f"{name:<44} n={len(s):<5} median {statistics.median(s) * 1e3:8.3f} ms"
          f"   P99 {p99 * 1e3:8.3f} ms   max {s[-1] * 1e3:8.3f} ms")


def _time(n: int, fn: Callable[[int], object]) -> list[float]:
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t)
    return out


def _bare_replace(d: Path, blob: bytes) -> None:
    fd = os.open(d / "bare.tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.write(fd, blob)
    os.fsync(fd)
    os.close(fd)
    os.replace(d / "bare.tmp", d / "bare")
    dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)


def _bench_snapshot(d: Path, label: str, state: dict[str, object], n: int) -> None:
    d.mkdir(parents=True, exist_ok=True)
    store = SnapshotStore(d, "state")
    store.save(state)
    blob = b"z" * store.path.stat().st_size
    base, save, load = [], [], []
    for _ in range(n):  # interleaved, so both see the same disk and machine load
        t0 = time.perf_counter()
        _bare_replace(d, blob)
        t1 = time.perf_counter()
        store.save(state)
        t2 = time.perf_counter()
        store.load()
        t3 = time.perf_counter()
        base.append(t1 - t0)
        save.append(t2 - t1)
        load.append(t3 - t2)
    _row(f"baseline write+fsync+rename+fsync {label}", base)
    _row(f"SnapshotStore.save {label}", save)
    _row(f"SnapshotStore.load {label}", load)


def _bench_decisions(root: Path, n: int) -> None:
    plain, episodes = DecisionJournal(root / "dj-plain"), DecisionJournal(root / "dj-episodes")
    tallied = DecisionJournal(root / "dj-tally")
    mark = EpisodeMark()
    episodes.episode = mark
    tallied.episode = mark
    tallied.tally = tally = DriftTally()
    journals = (plain, episodes, tallied)
    for j in journals:
        j.open()
    rec = {"mono": 1.0, "state": "grasp", "observation": [0.1 * i for i in range(len(OBS_FIELDS))],
           "action": "continue", "backend": "local", "latency_ms": 0.4321, "outcome": "ok",
           "attempts": [["local", "ok"]]}
    times: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for i in range(n):
        if i % 200 == 0:  # a task of 200 decisions
            mark.follow({"type": EventType.TASK_DONE, "task_id": mark.task_id})
            mark.follow({"type": EventType.TASK_STARTED, "task_id": f"bench-{i // 200}"})
        rec["mono"] = float(i)
        for k in range(3):  # rotated: no order bias
            which = (i + k) % 3
            t0 = time.perf_counter()
            journals[which].record(rec)
            times[which].append(time.perf_counter() - t0)
        time.sleep(0.001)
    _row("DecisionJournal.record, no episode fields", times[0])
    _row("DecisionJournal.record, with task id + step", times[1])
    _row("... + step + drift tally", times[2])
    for j in journals:
        j.stop()
    print(f"records: plain {plain.stats()}, episodes {episodes.stats()}, "
          f"tally {tallied.stats()}")
    # the CPU part alone (pack + stamp, no queue, no writer thread waking): the best of 60
    # blocks each, the cases alternating so that all see the same machine
    reps, blocks = 5000, 60
    cases = (("encode, no episode fields", lambda: encode_decision(rec)),
             ("encode + stamp, task id + step",
              lambda: encode_decision(rec, None, *mark.take(rec["backend"]))),
             ("drift tally count alone",
              lambda: tally.count_decision(rec["state"], rec["action"])))
    best = [math.inf] * len(cases)
    for _ in range(blocks):
        best = [min(b, timeit.timeit(fn, number=reps)) for b, (_, fn) in zip(best, cases,
                                                                             strict=True)]
    for (label, _), b in zip(cases, best, strict=True):
        print(f"{label:<44} {b / reps * 1e6:6.2f} us per record (best of {blocks} x {reps})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--decisions", type=int, default=5000)
    ap.add_argument("--only-decisions", action="store_true",
                    help="time only the decision journal's record path")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="bench_store_", dir="/var/tmp"))
    n = args.n
    print(f"dir {root} ({n} samples each)")
    _bench_decisions(root, args.decisions)
    if args.only_decisions:
        return
    states: list[tuple[str, dict[str, object]]] = [
        ("1 KiB", {"latched": True, "q": [0.1] * 100, "cause": "x" * 200}),
        ("128 KiB", {"body": "y" * (128 << 10)}),
    ]
    for label, state in states:
        _bench_snapshot(root / label.replace(" ", ""), label, state, n)

    jd = root / "journal"
    j = Journal(jd, "bench")
    j.open()
    rec = os.urandom(512)
    _row("Journal.append 512 B, fsync each", _time(n, lambda i: j.append(rec)))
    _row("Journal.append 512 B, no fsync", _time(n, lambda i: j.append(rec, sync=False)))
    j.sync()
    data = os.urandom(1 << 20)
    t = time.perf_counter()
    crc32c(data)
    print(f"crc32c (pure Python, slicing-by-8): {1 / (time.perf_counter() - t):.1f} MB/s")

    w = StoreWriter()
    w.start()
    store = SnapshotStore(root / "writer", "state")
    small = {"latched": False, "q": [0.0] * 6}
    _row("StoreWriter.submit_snapshot (caller side)",
         _time(n, lambda i: w.submit_snapshot(store, small)))
    _row("StoreWriter.submit_record (caller side)",
         _time(n, lambda i: w.submit_record(j, rec)))
    _row("StoreWriter submit + flush (durable)",
         _time(min(n, 100), lambda i: (w.submit_snapshot(store, small), w.flush(10.0))))
    w.stop()
    print(f"writer stats: {w.stats}")
    j.close()


if __name__ == "__main__":
    main()
