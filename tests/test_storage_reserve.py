"""The snapshot space reserve (store/reserve.py) on a real full disk: a tiny tmpfs that ANOTHER
process (dd) fills. A save on the full disk goes into a reserve chunk, atomically; the reserve
covers `chunks` saves while the other process takes every byte freed, and the save after that
fails (the daemon's snapshot_failed stop); space freed again is re-taken."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_fs import tiny_fs

from edge_agent.errors import StoreError
from edge_agent.health.probes import StoreProbe
from edge_agent.store.reserve import CHUNK_BYTES, SpaceReserve
from edge_agent.store.snapshot import SnapshotStore


def fill(directory: Path, name: str) -> int:
    """Another process writes `name` until the filesystem is full; the bytes it took."""
    path = directory / name
    r = subprocess.run(["dd", "if=/dev/zero", f"of={path}", "bs=4k"], capture_output=True,
                       check=False)
    assert r.returncode != 0 and b"No space left" in r.stderr, r.stderr
    return path.stat().st_size


def free_bytes(directory: Path) -> int:
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def state(gen: int, pad: int = 3000) -> dict[str, object]:
    return {"latch": {"latched": True, "gen": gen}, "pad": "x" * pad}


def test_a_full_disk_save_goes_into_the_reserve_and_it_covers_one_save_per_chunk(
        tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "2m") as fs:
        reserve = SpaceReserve(fs / "reserve", chunks=4)
        store = SnapshotStore(fs, "daemon", reserve=reserve)
        assert reserve.take() == 4
        assert store.save(state(1)) == 1
        fill(fs, "fill-0")
        assert free_bytes(fs) < 4096
        with pytest.raises(OSError):  # the disk is really full for anyone else
            (fs / "probe").write_bytes(b"x" * 8192)
        (fs / "probe").unlink(missing_ok=True)
        # the other process takes every byte each save frees: one chunk per save
        for i in range(4):
            assert store.save(state(2 + i)) == 2 + i
            assert store.reserve_saves == i + 1 and reserve.held() == 3 - i
            assert SnapshotStore(fs, "daemon").load() == (state(2 + i), 2 + i)
            fill(fs, f"fill-{i + 1}")
        with pytest.raises(StoreError, match="reserve is gone"):
            store.save(state(99))
        assert SnapshotStore(fs, "daemon").load() == (state(5), 5)  # the last one, intact
        assert not store.tmp_path.exists()
        # the other process lets go: the reserve is re-taken, saves go on
        for p in fs.glob("fill-*"):
            p.unlink()
        assert reserve.take() == 4 and reserve.status()["retaken"] == 4
        assert store.save(state(6)) == 6 and store.reserve_saves == 4


def test_without_another_writer_the_space_a_reserve_save_frees_is_used_again(
        tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "2m") as fs:
        reserve = SpaceReserve(fs / "reserve", chunks=2)
        store = SnapshotStore(fs, "daemon", reserve=reserve)
        reserve.take()
        store.save(state(1))
        store.save(state(2))
        fill(fs, "fill")  # dd ends at the full disk and takes nothing more
        for g in range(3, 23):
            assert store.save(state(g)) == g
        # the first save took a chunk; it freed the old .prev and the chunk's tail, so the 19
        # saves after it fit in what it freed
        assert store.reserve_saves == 1 and reserve.held() == 1
        assert reserve.take() == 2  # the probe's next run re-takes it from the freed tail


def test_a_snapshot_larger_than_a_chunk_frees_a_second_chunk(tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "2m") as fs:
        reserve = SpaceReserve(fs / "reserve", chunks=3)
        store = SnapshotStore(fs, "daemon", reserve=reserve)
        reserve.take()
        fill(fs, "fill")
        big = state(1, pad=CHUNK_BYTES + 50_000)
        assert store.save(big) == 1
        assert reserve.status()["released"] == 1 and reserve.held() == 1
        assert SnapshotStore(fs, "daemon").load() == (big, 1)


def test_the_store_probe_strikes_under_min_free_and_while_the_reserve_is_short(
        tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "4m") as fs:
        reserve = SpaceReserve(fs / "reserve", chunks=4)
        probe = StoreProbe(fs, lambda: None, reserve=reserve, min_free_bytes=1 << 20,
                           warn_free_bytes=0)
        r = probe.check(0.0)
        assert r.level.label == "ok" and r.figures["reserve_held"] == 4, r
        store = SnapshotStore(fs, "daemon", reserve=reserve)
        store.save(state(1))
        fill(fs, "fill")
        r = probe.check(1.0)
        assert r.failed and "under store.min_free_bytes" in r.message, r
        store.save(state(2))  # into the reserve
        (fs / "fill").unlink()
        r = probe.check(2.0)  # room again: the chunk is re-taken and all is well
        assert r.level.label == "ok" and r.figures["reserve_held"] == 4, r
        assert r.figures["reserve_lent"] == 1 and r.figures["reserve_retaken"] == 1, r
        # room above min_free (here under a chunk), not for a whole chunk: the reserve short
        # is a strike too
        fill(fs, "fill")
        store.save(state(3))
        (fs / "fill").unlink()
        (fs / "hold").write_bytes(b"\0" * (free_bytes(fs) - 128 * 1024))
        small = StoreProbe(fs, lambda: None, reserve=reserve, min_free_bytes=64 * 1024,
                           warn_free_bytes=0)
        r = small.check(3.0)
        assert r.failed and "reserve holds 3 of 4" in r.message, r


_WRITER = """
import sys, time
from edge_agent.errors import StoreError
from edge_agent.store.reserve import SpaceReserve
from edge_agent.store.snapshot import SnapshotStore
d = sys.argv[1]
store = SnapshotStore(d, "daemon", reserve=SpaceReserve(d + "/reserve", chunks=96,
                                                        chunk_bytes=16384))
last = store.load()
g = last[1] if last else 0
with open(d + "/fill-w", "ab", buffering=0) as fill:
    while True:
        try:
            g = store.save({"gen": g + 1, "pad": "y" * 5000})
        except StoreError:
            print("gone", flush=True)
            time.sleep(60)
        print(g, store.reserve_saves, flush=True)
        try:  # take what the save freed, as another writer would
            while True:
                fill.write(bytes(4096))
        except OSError:
            pass
"""


def test_kill_9_mid_reserve_saves_leaves_a_whole_snapshot(tmp_path: Path) -> None:
    """A writer saving into reserve chunks on a disk kept full, killed at different instants:
    load() always gives a whole snapshot, old or new."""
    with tiny_fs(tmp_path / "fs", "3m") as fs:
        seen = []
        for round_ in range(6):
            SpaceReserve(fs / "reserve", chunks=96, chunk_bytes=16384).take()
            fill(fs, "fill-0")
            proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(fs)],
                                    stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "PYTHONPATH": str(Path.cwd())})
            assert proc.stdout is not None
            # killed once its (round+1)-th save into the reserve is done: in the refill or
            # the next save into the reserve
            for line in proc.stdout:
                word = line.split()
                assert word[0] != "gone", "the reserve ran out before the kill"
                if int(word[1]) > round_:
                    break
            else:
                raise AssertionError("the writer ended")
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=10)
            got = SnapshotStore(fs, "daemon").load()
            assert got is not None and got[0]["gen"] == got[1], got
            seen.append(got[1])
            for p in fs.glob("fill-*"):
                p.unlink()
        assert seen == sorted(seen) and seen[-1] >= 6, seen
