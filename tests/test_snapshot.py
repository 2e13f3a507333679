"""Snapshots: round trips, corruption falls back to the previous generation, errors are loud.

Also the store thread (StoreWriter): non-blocking submit, coalescing, flush, error callbacks.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_fs import tiny_fs

from edge_agent.errors import StoreError
from edge_agent.store.journal import Journal
from edge_agent.store.snapshot import SnapshotStore
from edge_agent.store.writer import StoreWriter


def _state(i: int) -> dict[str, Any]:
    return {"latched": i % 2 == 0, "cause": f"c{i}", "l3_failures": i, "q": [0.1 * i, -1.5]}


def test_round_trip_and_generations(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "state")
    assert store.load() is None
    assert store.corrupt_files == []
    for i in range(1, 4):
        assert store.save(_state(i)) == i
    assert store.load() == (_state(3), 3)
    # A fresh instance (a restart) continues the generations without an explicit load.
    again = SnapshotStore(tmp_path, "state")
    assert again.save(_state(4)) == 4
    assert SnapshotStore(tmp_path, "state").load() == (_state(4), 4)
    prev = SnapshotStore(tmp_path, "state")
    prev.path.unlink()
    assert prev.load() == (_state(3), 3)  # .prev is the generation before
    assert (tmp_path / "state.snap.prev").stat().st_mode & 0o777 == 0o600
    assert not store.tmp_path.exists()


@settings(deadline=None, max_examples=50)
@given(st.dictionaries(st.text(max_size=8), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20), lambda c: st.lists(c, max_size=4)
    | st.dictionaries(st.text(max_size=5), c, max_size=4), max_leaves=20)))
def test_round_trip_property(tmp_path_factory: pytest.TempPathFactory, obj: dict[str, Any]) -> None:
    d = tmp_path_factory.mktemp("snap")
    SnapshotStore(d, "s").save(obj)
    assert SnapshotStore(d, "s").load() == (obj, 1)


def _flip(path: Path, offset_from_end: int) -> None:
    raw = bytearray(path.read_bytes())
    raw[-offset_from_end] ^= 0x40
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("damage", ["flip_payload", "truncate", "truncate_header", "empty",
                                    "garbage", "other_name", "future_format", "not_object"])
def test_corrupt_current_falls_back_to_previous(tmp_path: Path, damage: str) -> None:
    store = SnapshotStore(tmp_path, "state")
    store.save(_state(1))
    store.save(_state(2))
    p = store.path
    raw = p.read_bytes()
    head, _, payload = raw.partition(b"\n")
    header = json.loads(head)
    if damage == "flip_payload":
        _flip(p, 5)
    elif damage == "truncate":
        p.write_bytes(raw[: len(raw) - 7])
    elif damage == "truncate_header":
        p.write_bytes(raw[:20])
    elif damage == "empty":
        p.write_bytes(b"")
    elif damage == "garbage":
        p.write_bytes(os.urandom(3000) + b"[" * 100_000 + b"\n" + b"{" * 100_000)
    elif damage == "other_name":
        p.write_bytes(json.dumps(header | {"name": "other"}).encode() + b"\n" + payload)
    elif damage == "future_format":
        p.write_bytes(json.dumps(header | {"format": 2}).encode() + b"\n" + payload)
    elif damage == "not_object":
        body = b"[1,2]\n"
        hdr = header | {"length": len(body), "sha256": hashlib.sha256(body).hexdigest()}
        p.write_bytes(json.dumps(hdr).encode() + b"\n" + body)
    fresh = SnapshotStore(tmp_path, "state")
    rep = fresh.load_report()
    assert (rep.data, rep.generation) == (_state(1), 1)
    assert rep.used_previous
    assert [c.path for c in rep.corrupt_files] == [str(p)]
    assert fresh.corrupt_files == list(rep.corrupt_files)
    # The next save must not push the corrupt file into .prev: the good fallback stays.
    gen = fresh.save(_state(3))
    assert gen >= 2  # 3 when the corrupt file's header still told its generation
    assert fresh.load() == (_state(3), gen)
    fresh.path.unlink()
    assert fresh.load() == (_state(1), 1)


def test_both_corrupt_returns_none_and_reports_both(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "state")
    store.save(_state(1))
    store.save(_state(2))
    _flip(store.path, 3)
    store.prev_path.write_bytes(b"\x00" * 64)
    fresh = SnapshotStore(tmp_path, "state")
    assert fresh.load() is None
    assert sorted(c.path for c in fresh.corrupt_files) == sorted(
        [str(store.path), str(store.prev_path)])
    assert fresh.save(_state(9)) == 3  # generations never go back, even past corrupt files
    assert fresh.load() == (_state(9), 3)


def test_crash_between_renames_keeps_the_old_version(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "state")
    store.save(_state(1))
    store.save(_state(2))
    os.replace(store.path, store.prev_path)  # the state a kill between the two renames leaves
    store.tmp_path.write_bytes(b"half a snapsh")
    fresh = SnapshotStore(tmp_path, "state")
    assert fresh.load() == (_state(2), 2)
    assert fresh.corrupt_files == []
    assert fresh.save(_state(3)) == 3
    fresh.path.unlink()
    assert fresh.load() == (_state(2), 2)


def test_files_removed_behind_the_stores_back(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "state")
    store.save(_state(1))
    store.path.unlink()
    assert store.save(_state(2)) == 2
    assert store.load() == (_state(2), 2)


def test_unserialisable_and_oversize_raise_store_error(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "state", max_bytes=1000)
    with pytest.raises(StoreError):
        store.save({"x": object()})
    with pytest.raises(StoreError):
        store.save({"x": float("nan")})
    with pytest.raises(StoreError):
        store.save({"x": "y" * 2000})
    assert store.save({"ok": 1}) == 1  # none of these broke the store


def test_fsync_failure_is_fatal_and_never_retried(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    store = SnapshotStore(tmp_path, "state")
    store.save(_state(1))
    calls: list[int] = []

    def failing_fsync(fd: int) -> None:  # fault injection at the syscall boundary
        calls.append(fd)
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(StoreError, match="fsync"):
        store.save(_state(2))
    assert len(calls) == 1  # not retried
    monkeypatch.undo()
    with pytest.raises(StoreError, match="disabled"):
        store.save(_state(3))  # the store stays failed even though fsync works again
    assert store.failed is not None
    assert SnapshotStore(tmp_path, "state").load() == (_state(1), 1)


def test_disk_full_raises_and_keeps_the_old_snapshot(tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "256k") as fs:
        store = SnapshotStore(fs, "state")
        store.save({"small": 1})
        filler = fs / "filler"
        fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\xff" * 4096)
        os.close(fd)
        with pytest.raises(StoreError, match="write failed"):
            store.save({"big": "x" * 100_000})
        assert not store.tmp_path.exists()
        assert SnapshotStore(fs, "state").load() == ({"small": 1}, 1)
        filler.unlink()
        assert store.save({"big": "x" * 100_000}) == 2  # a write error is not fatal


# --------------------------------------------------------------------------- StoreWriter


def test_writer_coalesces_snapshots_and_flush_waits(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "state")
    done: list[BaseException | None] = []
    w = StoreWriter()
    for i in range(100):  # thread not started yet: everything waits in the queue
        assert w.submit_snapshot(store, _state(i), on_done=done.append)
    assert w.stats.snapshots_coalesced == 99
    w.start()
    assert w.flush(timeout=30)
    assert done == [None] * 100
    assert store.load() == (_state(99), 1)
    assert w.stats.snapshots_written == 1
    w.stop()
    w.stop()  # idempotent
    assert not w.submit_snapshot(store, _state(0))
    assert w.stats.rejected_after_stop == 1


def test_flush_waits_for_the_write_in_progress(tmp_path: Path) -> None:
    store = SnapshotStore(tmp_path, "big", max_bytes=64 << 20)
    done: list[BaseException | None] = []
    w = StoreWriter()
    w.start()
    try:
        w.submit_snapshot(store, {"body": "b" * (24 << 20)}, on_done=done.append)
        deadline = time.monotonic() + 30
        while not store.tmp_path.exists() and not done:  # until the store thread writes it
            assert time.monotonic() < deadline
            time.sleep(0.001)  # polling a condition with a deadline
        assert w.flush(timeout=60)
        assert done == [None]
        loaded = SnapshotStore(tmp_path, "big", max_bytes=64 << 20).load()
        assert loaded is not None and len(loaded[0]["body"]) == 24 << 20
    finally:
        w.stop()


def test_writer_reports_errors_and_keeps_going(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("not a directory")
    bad = SnapshotStore(tmp_path / "afile", "state")
    good = SnapshotStore(tmp_path / "ok", "state")
    errors: list[tuple[str, BaseException]] = []
    results: list[BaseException | None] = []
    w = StoreWriter(on_error=lambda name, exc: errors.append((name, exc)))
    w.start()
    try:
        w.submit_snapshot(bad, {"a": 1}, on_done=results.append)
        w.submit_snapshot(good, {"b": 2}, on_done=results.append)
        assert w.flush(timeout=30)
        assert [n for n, _ in errors] == ["state"]
        assert isinstance(errors[0][1], StoreError)
        assert isinstance(results[0], StoreError) and results[1] is None
        assert good.load() == ({"b": 2}, 1)
        assert w.stats.errors == 1
    finally:
        w.stop()


def test_writer_journal_records_group_commit_and_drop_when_full(tmp_path: Path) -> None:
    j = Journal(tmp_path, "decisions")
    j.open()
    dropped: list[BaseException | None] = []
    w = StoreWriter(max_records=5)
    for i in range(8):
        w.submit_record(j, b"rec%d" % i, on_done=dropped.append)
    assert w.stats.records_dropped == 3
    assert all(isinstance(e, StoreError) for e in dropped)
    w.stop()  # never started: stop() drains on this thread
    assert list(j.iter_records()) == [b"rec%d" % i for i in range(5)]
    assert w.stats.records_written == 5
    j.close()


def test_writer_flush_under_concurrent_submitters(tmp_path: Path) -> None:
    stores = [SnapshotStore(tmp_path, f"s{k}") for k in range(3)]
    j = Journal(tmp_path, "j", fsync_each=False)
    j.open()
    w = StoreWriter(max_records=100_000)
    w.start()
    stop = threading.Event()
    seen: dict[int, int] = {}

    def producer(k: int) -> None:
        i = 0
        while not stop.is_set() and i < 3000:
            i += 1
            w.submit_snapshot(stores[k], {"i": i})
            w.submit_record(j, b"%d:%d" % (k, i))
            seen[k] = i

    threads = [threading.Thread(target=producer, args=(k,)) for k in range(3)]
    for t in threads:
        t.start()
    readers = [SnapshotStore(tmp_path, f"s{k}") for k in range(3)]  # another "process"
    try:
        for _ in range(20):
            before = dict(seen)
            assert w.flush(timeout=30)
            for k, i in before.items():  # all submitted before flush() is on disk after it
                loaded = readers[k].load()
                assert loaded is not None and loaded[0]["i"] >= i
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert w.flush(timeout=30)
    for k in range(3):
        loaded = stores[k].load()
        assert loaded is not None and loaded[0] == {"i": seen[k]}  # the newest state is on disk
    assert sum(1 for _ in j.iter_records()) == w.stats.records_written == sum(seen.values())
    w.stop()
    j.close()
