"""Loop: freeze the link guardian (SIGSTOP) mid-motion, continue it (SIGCONT), count POSITION
COMMANDs that reached the robot after the freeze.

    python -m hil.guardian_freeze_loop [--runs 30] [--load 2] [--nice 0] [--aim] [--hold-s 1.5]

One real daemon (`edge-agent run --sim` with the settings of tests/test_deadman_e2e.py: a 250 ms
deadman, the rig's firmware deadman latch OFF, so only the host side keeps stale setpoints off
the arm). Each run: a task moving, SIGSTOP to the guardian, the daemon's latched `deadman` stop,
`--hold-s` of the guardian stopped, SIGCONT, half a second, then the rig's frame record; then
reset + resume (or a new task) for the next run. `--load K`: K CPU-bound burner processes at
`nice --nice` beside it. `--aim`: the SIGSTOP goes out while the guardian is seen running (and
a random 0-200 µs later), so it lands inside its work far more often than at random.

The guardian cannot write while it is stopped, and before the SIGCONT the loop waits until the
rig has read everything in the pty (a starved rig reads it late), so the rig's time of each
POSITION frame tells the two causes apart:
- read after the SIGCONT: written after the guardian woke — a stop-model hole (nothing computed
  before a deadman trip may reach the robot after it). A run with one is a failure, unless the
  very next frame is the guardian's own STOP(CAT2, DEADMAN) (a freeze between its last clock
  check and the write: the firmware holds and latches at once; counted apart).
- read more than 0.1 s after the SIGSTOP but before the SIGCONT: written before the freeze and
  delivered late (the pty, a kernel worker or the rig's thread was starved): counted apart.
Each failure line gives the frames' tty sequence numbers (the guardian's own numbering), the
last frame read before the freeze and where the guardian stopped: /proc/PID/syscall (`-1`:
running its own code, between two clock reads; `270`: blocked in pselect6). The last line:
`runs N failures F ...` and the guardian's stop counters from its exit log; exit status 1
when F > 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hil.daemon_proc import Control, request, start_sim_daemon, stop_daemon, wait_for

# as tests/test_deadman_e2e.py (tests/daemon_proc.py's overrides)
SETS = ("link.deadman_ms=250", "mqtt.port=1", "mqtt.keepalive_s=2", "sim.rig_priority=0",
        *(f"executor.l1_timeouts_s.{s}=60" for s in (
            "approach", "grasp", "lift", "transfer", "release", "retreat")))
_BURN = "import os,sys; os.nice(int(sys.argv[1]))\nwhile True: pass"


class Rig:
    """The simulated robot's control socket."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / "rig.sock"

    def call(self, req: dict[str, Any]) -> dict[str, Any]:
        return request(self.path, req)

    def t(self) -> float:
        return float(self.call({"cmd": "ping"})["t"])

    def commands(self, since: float) -> list[dict[str, Any]]:
        frames = self.call({"cmd": "record", "type": "COMMAND", "since": since})["frames"]
        assert isinstance(frames, list)
        return frames

    def frames(self, since: float) -> list[dict[str, Any]]:
        """Every frame the robot received since `since` (COMMAND, STOP, ENABLE, PING, ...)."""
        frames = self.call({"cmd": "record", "since": since})["frames"]
        assert isinstance(frames, list)
        return frames

    def wait_t(self, until: float, what: str) -> None:
        wait_for(lambda: self.t() > until, 30, what, poll_s=0.02)

    def drained(self) -> bool:
        """Nothing came in over 30 ms of the rig's time while its firmware ran 20 ms of ticks
        (it steps only when select() finds the pty empty): every byte written before now was
        read. A starved rig reads a pty late; the host's frames stay in it meanwhile."""
        a = self.call({"cmd": "status"})
        self.wait_t(float(a["t"]) + 0.03, "30 ms of the rig's time")
        b = self.call({"cmd": "status"})
        return bool(a["state"]["counters"]["rx_bytes"] == b["state"]["counters"]["rx_bytes"]
                    and b["state"]["fw_time_us"] - a["state"]["fw_time_us"] >= 20_000)


def guardian_pid(daemon_pid: int) -> int:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if (int(stat.rsplit(")", 1)[1].split()[1]) == daemon_pid
                and b"edge_agent.link.guardian" in cmd):
            return int(entry)
    raise SystemExit("the daemon's guardian process was not found")


def where_stopped(pid: int) -> str:
    """The guardian's state and system call once it is stopped ('-1': in user space)."""
    wait_for(lambda: Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T",
             5, "the guardian stopped", poll_s=0.001)
    try:
        return Path(f"/proc/{pid}/syscall").read_text().split()[0]
    except OSError as exc:
        return f"? ({exc.strerror})"


def moving(ctl: Control, task: str | None) -> str:
    """Reset if latched, then resume `task` or start a new one."""
    st = ctl.status()
    if st["mode"] == "protective_stop":
        wait_for(lambda: ctl.call("reset")["ok"], 30, "reset accepted", poll_s=0.1)
        st = ctl.status()
    if task is not None and st["mode"] == "holding" and ctl.call("resume", task_id=task)["ok"]:
        return task
    r = ctl.call("task.start")
    if not r["ok"]:
        raise SystemExit(f"task.start refused: {r}")
    return str(r["result"]["task_id"])


def busy(pid: int, timeout: float = 0.5) -> None:
    """Return once `pid` is seen running (state R) and a random 0-200 µs more, so the freeze
    lands anywhere in one wake-up's work; or after `timeout`."""
    fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if os.pread(fd, 512, 0).rsplit(b")", 1)[1][1:2] == b"R":
                until = time.perf_counter() + random.uniform(0.0, 200e-6)
                while time.perf_counter() < until:
                    pass
                return
    finally:
        os.close(fd)


def guardian_stop(frame: dict[str, Any] | None) -> bool:
    """The guardian's own STOP after motion it wrote stale (docs/PROTOCOL.md §4)."""
    return (frame is not None and frame["type"] == "STOP" and frame["category"] == "CAT2"
            and frame["reason"] == "DEADMAN")


@dataclass
class Run:
    """One freeze: the rig's times (its clock), where the guardian stopped, the frames."""

    t_stop: float  # before the SIGSTOP
    t_stopped: float  # once it is in (the e2e test's old reference)
    t_precont: float  # before the SIGCONT: the rig read everything before it while frozen
    t_cont: float  # after it
    syscall: str
    fw_tripped: bool
    frames: list[dict[str, Any]]  # what the robot received from 0.3 s before the stop

    def positions(self, since: float, until: float = math.inf) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["type"] == "COMMAND" and f["mode"] == "POSITION"
                and since <= f["t"] < until]

    @property
    def after_wake(self) -> list[dict[str, Any]]:
        """Written by the guardian after it woke and not stopped at once: the stop-model hole."""
        return [f for f in self.positions(self.t_precont) if f not in self.stopped_at_once]

    @property
    def stopped_at_once(self) -> list[dict[str, Any]]:
        """Written after the wake but followed at once by the guardian's STOP(CAT2, DEADMAN)
        (a freeze between its last clock check and the write: `stale_written`)."""
        by_seq = {f["seq"]: f for f in self.frames}
        return [f for f in self.positions(self.t_precont)
                if guardian_stop(by_seq.get((f["seq"] + 1) & 0xFFFF))]

    @property
    def in_pty(self) -> list[dict[str, Any]]:
        """Written before the freeze, read by the robot late (> 0.1 s after it): the pty's delay."""
        return self.positions(self.t_stopped + 0.1, self.t_precont)

    def describe(self) -> str:
        ts = self.t_stop
        before = [f for f in self.frames if f["t"] < self.t_stopped]
        out = [f"stopped in syscall {self.syscall}, "
               f"last frame read before it seq {before[-1]['seq'] if before else None} "
               f"at {(before[-1]['t'] - ts) * 1e3:+.1f} ms" if before else "",
               f"SIGCONT between {(self.t_precont - ts) * 1e3:+.0f} and "
               f"{(self.t_cont - ts) * 1e3:+.0f} ms"]
        for what, frames in (("after the wake", self.after_wake), ("in the pty", self.in_pty),
                             ("after the wake, STOP next", self.stopped_at_once)):
            if frames:
                out.append(f"{len(frames)} POSITION {what}: " + ", ".join(
                    f"seq {f['seq']} at {(f['t'] - ts) * 1e3:+.1f} ms" for f in frames[:5]))
        return "; ".join(out)


def one_run(ctl: Control, rig: Rig, gpid: int, task: str | None, hold_s: float, aim: bool,
            ) -> tuple[str, Run]:
    for _ in range(5):  # a starved rig may fault the link meanwhile (a stop): reset, again
        task = moving(ctl, task)
        t0 = rig.t()
        end = time.monotonic() + 15
        while time.monotonic() < end and not any(
                f["mode"] == "POSITION" for f in rig.commands(t0)):
            time.sleep(0.02)
        if time.monotonic() < end:
            break
        print(f"  not moving 15 s after the resume ({ctl.status().get('stop')}): again",
              flush=True)
    else:
        raise SystemExit("the task would not move again")
    t_stop = rig.t()
    if aim:
        busy(gpid)
    os.kill(gpid, signal.SIGSTOP)
    t_stopped = rig.t()
    syscall = where_stopped(gpid)
    try:
        wait_for(lambda: ctl.status()["mode"] == "protective_stop", 30, "the daemon's stop",
                 poll_s=0.02)
        rig.wait_t(t_stop + hold_s, "the guardian held stopped")
        fw_tripped = bool(rig.call({"cmd": "status"})["state"]["deadman_tripped"])
        wait_for(rig.drained, 30, "the rig read all the guardian wrote before the freeze")
        t_precont = rig.t()
    finally:
        os.kill(gpid, signal.SIGCONT)
    t_cont = rig.t()
    rig.wait_t(t_cont + 0.5, "half a second after the continue")
    return task, Run(t_stop, t_stopped, t_precont, t_cont, syscall, fw_tripped,
                     rig.frames(t_stop - 0.3))


def guardian_counters(log: Path) -> str:
    """The guardian's stop counters from its exit line in the daemon's log."""
    for line in reversed(log.read_text(errors="replace").splitlines()):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("logger") == "edge_agent.link.guardian" and rec.get("event") == "exit":
            rules = rec.get("rules", {})
            return ", ".join(f"{k} {rules.get(k, '-')}" for k in (
                "deadman_trips", "fw_deadman_reports", "dropped_motion", "stalls",
                "stale_dropped", "stale_written"))
    return "no exit line in the log"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hil.guardian_freeze_loop", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=30)
    p.add_argument("--load", type=int, default=2, help="CPU burner processes beside the daemon")
    p.add_argument("--nice", type=int, default=0, help="the burners' nice value")
    p.add_argument("--hold-s", type=float, default=1.5, help="how long the guardian stays stopped")
    p.add_argument("--aim", action="store_true",
                   help="freeze the guardian while it is seen running (state R), not at random")
    p.add_argument("--set", action="append", default=[], dest="sets",
                   help="another `--set key=value` for the daemon")
    p.add_argument("--dump", help="append each failure's evidence (a JSON line) to this file")
    p.add_argument("--keep", action="store_true", help="keep the state dir (daemon.log)")
    args = p.parse_args(argv)

    tmp = Path(tempfile.mkdtemp(prefix="freeze-loop-"))
    proc = start_sim_daemon(tmp, (*SETS, *args.sets))
    burners: list[subprocess.Popen[bytes]] = []
    runs = holes = late_in_pty = in_user = caught = 0
    try:
        ctl, rig = Control(tmp), Rig(tmp)
        wait_for(lambda: ctl.status()["link_up"], 60, "link up")
        assert rig.call({"cmd": "set", "key": "firmware_deadman_latch", "value": False})["ok"]
        gpid = guardian_pid(proc.pid)
        burners = [subprocess.Popen([sys.executable, "-c", _BURN, str(args.nice)])
                   for _ in range(args.load)]
        task: str | None = None
        for i in range(args.runs):
            task, run = one_run(ctl, rig, gpid, task, args.hold_s, args.aim)
            runs += 1
            holes += bool(run.after_wake)
            late_in_pty += bool(run.in_pty)
            caught += bool(run.stopped_at_once)
            in_user += run.syscall == "-1"
            if run.after_wake or run.in_pty or run.stopped_at_once:
                print(f"run {i + 1}: FAIL {run.describe()}", flush=True)
                if args.dump:
                    with open(args.dump, "a") as f:
                        f.write(json.dumps({"run": i + 1, **asdict(run)}) + "\n")
            else:
                print(f"run {i + 1}: ok (stopped in syscall {run.syscall}, firmware deadman "
                      f"{'tripped' if run.fw_tripped else 'NOT tripped'})", flush=True)
    finally:
        for b in burners:
            b.kill()
            b.wait()
        stop_daemon(proc)
        print(f"guardian: {guardian_counters(tmp / 'daemon.log')}")
        if args.keep:
            print(f"state dir: {tmp}")
    print(f"runs {runs} failures {holes} (POSITION written after the wake; {in_user} runs froze "
          f"it in user space) - and {late_in_pty} runs with POSITION frames written before the "
          f"freeze read > 0.1 s after it; {caught} with one written after the wake and the "
          f"guardian's STOP next; load {args.load} at nice {args.nice}"
          f"{', aimed' if args.aim else ''}")
    return 1 if holes else 0


if __name__ == "__main__":
    sys.exit(main())
