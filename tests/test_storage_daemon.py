"""Issue #27 item 2 on the real daemon (`--sim`, a private Mosquitto): the state dir on a tiny
tmpfs that ANOTHER process fills. `storage_low` is entered (the `degraded` event, in
`state.degraded`), the journal and report plots are shed, a task started then completes with its
snapshots written into the preallocated reserve; with a writer that keeps the disk full the
reserve drains one chunk per save, and only then does a snapshot write latch the
`snapshot_failed` protective stop."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProc
from mosquitto import Mosquitto, wait_until
from tiny_fs import tiny_fs

PERIOD_S = 0.2
FS_SIZE = "16m"
MIN_FREE = 4 << 20
RESERVE = 1 << 20  # 4 chunks of 256 KiB

# keeps the filesystem full: every byte anyone frees is taken within a millisecond or so
_HOG = """
import sys, time
with open(sys.argv[1], "ab", buffering=0) as f:
    print("hogging", flush=True)
    while True:
        try:
            f.write(bytes(4096))
        except OSError:
            time.sleep(0.0005)
"""


def _status(d: DaemonProc) -> dict[str, Any]:
    r = d.socket_cmd("status")
    assert r["ok"], r
    return r["result"]  # type: ignore[no-any-return]


def _store(d: DaemonProc) -> dict[str, Any]:
    return (_status(d)["health"] or {}).get("probes", {}).get("store") or {}


def _events(d: DaemonProc, kind: str) -> list[dict[str, Any]]:
    return [e for e in d.events("event") if e.get("type") == kind]


def st_journal_on(d: DaemonProc) -> bool:
    """The journal was shed, not turned off by the full disk."""
    j = _status(d)["journal"]
    return bool(j["shedding"]) and j["disabled"] is None

def _fill(directory: Path, name: str) -> None:
    r = subprocess.run(["dd", "if=/dev/zero", f"of={directory / name}", "bs=64k"],
                       capture_output=True, check=False)
    assert r.returncode != 0 and b"No space left" in r.stderr, r.stderr


def test_a_disk_filled_by_another_process_is_storage_low_and_a_task_still_completes(
        tmp_path: Path, broker: Mosquitto) -> None:
    with tiny_fs(tmp_path / "state", FS_SIZE) as fs:
        fs.chmod(0o700)  # a tmpfs mounts 1777: the daemon refuses a state dir others can write
        d = DaemonProc(tmp_path, broker, extra=(
            f"health.period_s={PERIOD_S}", f"store.min_free_bytes={MIN_FREE}",
            f"store.reserve_bytes={RESERVE}")).start()
        hog: subprocess.Popen[str] | None = None
        try:
            d.wait_ready()
            wait_until(lambda: _store(d).get("level") in ("ok", "warn"), 30, "the store probe")
            figs = _store(d)["figures"]
            assert (figs["reserve_held"], figs["reserve_chunks"]) == (4, 4), figs
            assert len(list((fs / "reserve").glob("chunk-*"))) == 4
            assert _status(d)["degraded"] == []
            # the journal opens after READY: on a disk full before that it would be turned off
            wait_until(lambda: (_status(d)["journal"] or {}).get("enabled"), 60, "journal open")

            t_fill = time.monotonic()
            _fill(fs, "filler")  # another process takes every free byte
            wait_until(lambda: "storage_low" in _status(d)["degraded"], 30, "storage_low held")
            entered_s = time.monotonic() - t_fill
            [ev] = [e for e in _events(d, "degraded") if e["mode"] == "storage_low"]
            assert ev["probe"] == "store" and "min_free_bytes" in ev["cause"], ev
            assert st_journal_on(d)
            st = _status(d)
            assert st["journal"]["shedding"] is True, st["journal"]
            assert st["reports"]["shed_plots"] is True, st["reports"]
            assert "stop" not in st, st["stop"]

            # a task started now completes: its snapshots go into the reserve
            lent_before = _store(d)["figures"]["reserve_lent"]
            r = d.socket_cmd("task.start", {"task": "pick_place"})
            assert r["ok"], r
            wait_until(lambda: bool(_events(d, "task_done")) or "stop" in _status(d),
                       120, "the task ends")
            st = _status(d)
            assert "stop" not in st, (st["stop"], d.lines[-20:])
            [done] = _events(d, "task_done")
            assert done["outcome"] == "success", done
            saved = d.events("snapshot_saved_from_reserve")
            assert saved, "no snapshot went into the reserve"
            wait_until(lambda: _store(d)["figures"]["reserve_lent"] > lent_before, 10,
                       "the probe sees the reserve lent")
            assert st["journal"]["shed"] > 0, st["journal"]  # the task's decisions shed
            assert not d.events("snapshot_write_failed")
            print(f"\nstorage_low entered {entered_s:.2f} s after the fill; task done with "
                  f"{len(saved)} snapshot(s) written from the reserve; store figures "
                  f"{_store(d)['figures']}")

            # the other process lets go: the reserve is re-taken, the mode left, the journal back
            (fs / "filler").unlink()
            wait_until(lambda: "storage_low" not in _status(d)["degraded"], 30, "storage_low left")
            assert [e["mode"] for e in _events(d, "recovered")] == ["storage_low"]
            figs = _store(d)["figures"]
            assert figs["reserve_held"] == 4 and figs["reserve_retaken"] >= 1, figs
            st = _status(d)
            assert st["journal"]["shedding"] is False and st["reports"]["shed_plots"] is False

            # another process keeps the disk full: each save drains a chunk, then the stop
            hog = subprocess.Popen([sys.executable, "-c", _HOG, str(fs / "hog")],
                                   stdout=subprocess.PIPE, text=True)
            assert hog.stdout is not None and hog.stdout.readline() == "hogging\n"
            t_hog = time.monotonic()
            wait_until(lambda: "storage_low" in _status(d)["degraded"], 30, "storage_low again")
            n_saved = len(d.events("snapshot_saved_from_reserve"))
            # a task saves a snapshot when it starts and when it ends: start and cancel tasks
            # until a save finds neither room nor reserve
            cycles = 0
            while "stop" not in _status(d) and cycles < 30:
                cycles += 1
                r = d.socket_cmd("task.start", {"task": "pick_place"})
                assert r["ok"] or "stop" in _status(d), r
                wait_until(lambda: _status(d)["mode"] == "running" or "stop" in _status(d), 30,
                           "the task running")
                d.socket_cmd("task.cancel")
                wait_until(lambda: _status(d)["mode"] != "running", 30, "the task cancelled")
            assert "stop" in _status(d), (cycles, _store(d))
            st = _status(d)
            assert st["stop"]["cause"] == "snapshot_failed" or \
                "snapshot_failed" in st["stop"]["causes"], st["stop"]
            failed = d.events("snapshot_write_failed")
            assert failed and "reserve is gone" in failed[0]["error"], failed
            more = len(d.events("snapshot_saved_from_reserve")) - n_saved
            assert more >= 1, "the reserve covered no save before the stop"
            print(f"with the disk kept full: {more} more saves from the reserve in {cycles} task "
                  f"start/cancel cycles, then snapshot_failed "
                  f"{time.monotonic() - t_hog:.2f} s after the hog began")
        finally:
            if hog is not None:
                hog.kill()
                hog.wait(10)
            d.stop()
