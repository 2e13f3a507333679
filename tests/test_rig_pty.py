"""`python -m hil.rig` on real ptys: session, control socket, record, fleet, lock-step twin."""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from edge_agent.link.codec import (
    Command,
    Enable,
    EstopEdge,
    Frame,
    FrameDecoder,
    Hello,
    HelloAck,
    Message,
    Mode,
    Ping,
    Pong,
    Status,
    StatusFlag,
    Stop,
    StopCategory,
    StopReason,
    encode,
)
from edge_agent.robot import load_robot
from hil.lockstep import Lockstep, ScriptedHost
from hil.sim.control import request

ROOT = Path(__file__).resolve().parents[1]
ROBOT = ROOT / "configs/robot/edge-arm-4.toml"


def wait_for(pred: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout_s
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)  # polling, not synchronisation: the deadline decides


def read_lines(fd: int, n: int, timeout_s: float = 30.0) -> list[str]:
    """The first `n` lines a child writes to pipe `fd` (raw reads: no hidden buffering)."""
    buf = b""
    end = time.monotonic() + timeout_s
    while buf.count(b"\n") < n:
        ready, _, _ = select.select([fd], [], [], max(0.0, end - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        assert chunk, f"rig printed {buf!r}, wanted {n} PTY lines"
        buf += chunk
    return [x.decode() for x in buf.split(b"\n")[:n]]


@contextmanager
def rig(tmp_path: Path, *extra: str) -> Iterator[tuple[subprocess.Popen[bytes], list[str], str]]:
    sock = str(tmp_path / "rig.sock")
    proc = subprocess.Popen(
        [sys.executable, "-m", "hil.rig", "--robot", str(ROBOT), "--control-socket", sock,
         *extra], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)
    try:
        n = int(extra[extra.index("--ptys") + 1]) if "--ptys" in extra else 1
        assert proc.stdout is not None
        lines = read_lines(proc.stdout.fileno(), n)
        assert all(line.startswith("PTY /dev/") for line in lines), lines
        yield proc, [line.split(" ", 1)[1] for line in lines], sock
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


class Host:
    """The test's end of a pty: a reader thread decoding everything, and a writer."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_NOCTTY)
        self.dec = FrameDecoder()
        self.frames: list[tuple[float, Frame]] = []
        self.seq = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            ready, _, _ = select.select([self.fd], [], [], 0.05)
            if ready:
                try:
                    data = os.read(self.fd, 65536)
                except OSError:
                    return
                now = time.monotonic()
                self.frames.extend((now, f) for f in self.dec.feed(data))

    def send(self, msg: Message) -> int:
        seq = self.seq
        os.write(self.fd, encode(msg, seq))
        self.seq += 1
        return seq

    def of(self, cls: type) -> list[Any]:
        return [f.msg for _, f in list(self.frames) if isinstance(f.msg, cls)]

    def close(self) -> None:
        self._stop.set()
        self._t.join(timeout=2)
        os.close(self.fd)


def test_rig_process_speaks_the_protocol_and_obeys_its_control_socket(tmp_path: Path) -> None:
    record = tmp_path / "rec.jsonl"
    with rig(tmp_path, "--seed", "3", "--record", str(record)) as (proc, ptys, sock):
        host = Host(ptys[0])
        try:
            hello_seq = host.send(Hello(1, 200, 1000))
            ack = wait_for(lambda: host.of(HelloAck), what="HELLO_ACK")[0]
            assert ack.accepted and ack.n_joints == 4
            wait_for(lambda: len(host.of(Status)) > 20, what="status stream")
            host.send(Enable(True))
            wait_for(lambda: host.of(Status)[-1].flags & StatusFlag.DRIVES_ENABLED,
                     what="drives enabled")
            ping_seq = host.send(Ping(777))
            wait_for(lambda: host.of(Pong), what="PONG")
            assert host.of(Pong)[0].host_time_us == 777

            t_press = time.monotonic()
            res = request(sock, {"cmd": "inject", "target": "estop", "mode": "press"})
            assert res["ok"], res
            edge = wait_for(lambda: host.of(EstopEdge), what="ESTOP_EDGE")[0]
            assert edge.pressed
            st = wait_for(lambda: [s for s in host.of(Status) if s.fw_time_us >= edge.fw_time_us
                                   and s.flags & StatusFlag.ESTOP_LATCHED], what="latched")[0]
            assert st.flags & StatusFlag.ESTOP_INPUT
            assert not st.flags & StatusFlag.DRIVES_ENABLED
            state = request(sock, {"cmd": "status"})
            assert state["state"]["estop_input"] and state["state"]["estop_latched"]
            assert state["rig"]["robots"] == 1 and state["rig"]["cpu_s"] > 0

            sent = request(sock, {"cmd": "record"})["frames"]
            assert [(f["type"], f["seq"]) for f in sent] == [
                ("HELLO", hello_seq), ("ENABLE", hello_seq + 1), ("PING", ping_seq)]
            assert sent[0]["deadman_ms"] == 200 and sent[2]["host_time_us"] == 777
            assert all(f["t"] < t_press for f in sent)
            assert request(sock, {"cmd": "record", "type": "STOP"})["frames"] == []
        finally:
            host.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    lines = [json.loads(x) for x in record.read_text().splitlines()]
    assert [x["type"] for x in lines] == ["HELLO", "ENABLE", "PING"]
    assert lines[2]["robot"] == 0 and lines[2]["host_time_us"] == 777


def _all_received(sock: str, n: int) -> list[dict[str, Any]] | None:
    frames: list[dict[str, Any]] = request(sock, {"cmd": "record"})["frames"]
    return frames if len(frames) >= n else None


def _in_session(h: Host) -> bool:
    return bool(h.of(HelloAck) and h.of(Status))


def _newest_after(h: Host, fw_us: int) -> bool:
    st = h.of(Status)
    return bool(st) and st[-1].fw_time_us > fw_us


def test_estop_reaction_is_timed_from_the_tick_and_from_the_wire(tmp_path: Path) -> None:
    """Each press is timed to the first STOP frame twice: from the firmware tick that saw the
    edge and from the moment its frames were written to the pty (never earlier)."""
    with rig(tmp_path, "--seed", "5") as (_proc, ptys, sock):
        host = Host(ptys[0])
        try:
            host.send(Hello(1, 200, 1000))
            wait_for(lambda: host.of(HelloAck), what="HELLO_ACK")
            for k in range(5):
                assert request(sock, {"cmd": "inject", "target": "estop", "mode": "press"})["ok"]
                wait_for(lambda k=k: len(host.of(EstopEdge)) > 2 * k, what=f"press edge {k}")
                time.sleep(0.002)  # the host answers 2 ms after it saw the edge
                host.send(Stop(StopCategory.CAT0, StopReason.ESTOP_INPUT))
                wait_for(lambda k=k: len(request(sock, {"cmd": "latency"})[
                    "estop_reaction_us"]) > k, what=f"reaction {k}")
                assert request(sock, {"cmd": "clear", "target": "estop"})["ok"]
                wait_for(lambda k=k: len(host.of(EstopEdge)) > 2 * k + 1,
                         what=f"release edge {k}")
            lat = request(sock, {"cmd": "latency", "clear": True})
            tick, wire = lat["estop_reaction_us"], lat["estop_wire_reaction_us"]
            assert len(tick) == len(wire) == 5 and lat["unanswered"] == 0
            for t_us, w_us in zip(tick, wire, strict=True):
                assert 2000 <= w_us <= t_us  # the wire comes at or after the tick
            assert request(sock, {"cmd": "latency"})["estop_wire_reaction_us"] == []
        finally:
            host.close()


def test_fleet_mode_serves_independent_robots(tmp_path: Path) -> None:
    with rig(tmp_path, "--ptys", "3", "--seed", "10") as (_proc, ptys, sock):
        assert len(set(ptys)) == 3
        hosts = [Host(p) for p in ptys]
        try:
            for h in hosts:
                h.send(Hello(1, 50, 5000))
            for h in hosts:
                wait_for(partial(_in_session, h), what="fleet status")
            assert request(sock, {"cmd": "inject", "robot": 1, "target": "estop",
                                  "mode": "press"})["ok"]
            edge = wait_for(lambda: hosts[1].of(EstopEdge), what="edge on robot 1")[0]
            for i in (0, 2):  # the robots share one firmware clock: compare at the same time
                later = edge.fw_time_us + 20000
                wait_for(partial(_newest_after, hosts[i], later), what="later statuses")
            assert not hosts[0].of(EstopEdge) and not hosts[2].of(EstopEdge)
            states = [request(sock, {"cmd": "status", "robot": i})["state"] for i in range(3)]
            assert [s["estop_input"] for s in states] == [False, True, False]
            assert len({tuple(s["object"]["xyz"]) for s in states}) == 3  # seeds 10, 11, 12
            info = request(sock, {"cmd": "status"})["rig"]
            assert info["robots"] == 3 and info["tick_us"] == 1000
        finally:
            for h in hosts:
                h.close()


def test_pty_and_lockstep_runs_give_the_same_physics(tmp_path: Path) -> None:
    """One seeded scenario, streamed in real time over the pty, then run in lock-step twice:
    replaying the rig's recorded reception times reproduces the pty's STATUS stream; with nominal
    command times the trajectories differ by no more than the measured timing noise allows."""
    period, amp, freq, n_cmds = 0.005, 0.15, 1.0, 300
    robot = load_robot(ROBOT)
    home = robot.home

    def target(k: int) -> tuple[float, ...]:
        s = amp * math.sin(2 * math.pi * freq * k * period)
        return (home[0] + s, home[1] + 0.5 * s, home[2] - s, home[3] + s)

    with rig(tmp_path, "--seed", "7") as (_proc, ptys, sock):
        host = Host(ptys[0])
        try:
            host.send(Hello(1, 100, 1000))
            wait_for(lambda: host.of(HelloAck), what="HELLO_ACK")
            host.send(Enable(True))
            wait_for(lambda: host.of(Status) and host.of(Status)[-1].flags
                     & StatusFlag.DRIVES_ENABLED, what="enabled")
            next_t = time.monotonic()
            for k in range(n_cmds):
                host.send(Command(Mode.POSITION, target(k), ttl_ms=500))
                next_t += period
                while (d := next_t - time.monotonic()) > 0:
                    time.sleep(d)
            got = wait_for(lambda: _all_received(sock, n_cmds + 2), what="all commands received")
            settle_us = got[-1]["fw_us"] + 300_000  # the last commands' response
            wait_for(lambda: host.of(Status)[-1].fw_time_us > settle_us, what="settling")
        finally:
            host.close()
    pty_status = {m.fw_time_us: m for m in host.of(Status)}
    rx = {f["seq"]: f["fw_us"] for f in got}
    assert len(rx) == n_cmds + 2

    def lockstep(command_time: Callable[[int], float]) -> dict[int, Status]:
        r = Lockstep(robot, seed=7)
        r.send(encode(Hello(1, 100, 1000), 0), at=rx[0] * 1e-6)
        r.send(encode(Enable(True), 1), at=rx[1] * 1e-6)
        for k in range(n_cmds):
            r.send(encode(Command(Mode.POSITION, target(k), ttl_ms=500), k + 2),
                   at=command_time(k))
        r.run_until(max(pty_status) * 1e-6)
        assert isinstance(r.host, ScriptedHost)
        return {m.fw_time_us: m for m in r.host.of_type(Status)}

    def max_diff(a: dict[int, Status], b: dict[int, Status]) -> float:
        common = sorted(set(a) & set(b))
        assert len(common) > 0.9 * len(a)
        return max(abs(x - y) for t in common for x, y in zip(a[t].q, b[t].q, strict=True))

    replay = lockstep(lambda k: rx[k + 2] * 1e-6)
    assert max_diff(pty_status, replay) < 1e-6  # same reception times: the same run

    first = rx[2]
    lag = max(abs(rx[k + 2] - (first + k * round(period * 1e6))) for k in range(n_cmds)) * 1e-6
    nominal = lockstep(lambda k: first * 1e-6 + k * period)
    rate = 2 * math.pi * freq * amp  # fastest joint's reference speed, rad/s
    bound = 1.5 * rate * (lag + period) + 1e-3
    diff = max_diff(pty_status, nominal)
    print(f"pty vs nominal lock-step: {diff:.5f} rad, bound {bound:.5f}, lag {lag * 1e3:.2f} ms")
    assert diff <= bound, f"diff {diff:.4f} rad > bound {bound:.4f} (max lag {lag * 1e3:.1f} ms)"


def test_rig_refuses_a_bad_robot_file(tmp_path: Path) -> None:
    bad = tmp_path / "robot.toml"
    bad.write_text("schema_version = 1\n")
    res = subprocess.run([sys.executable, "-m", "hil.rig", "--robot", str(bad)], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert "rig:" in res.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_rig_stops_cleanly_on_signals(tmp_path: Path, signum: int) -> None:
    with rig(tmp_path) as (proc, _ptys, sock):
        assert request(sock, {"cmd": "ping"})["ok"]
        proc.send_signal(signum)
        assert proc.wait(timeout=10) == 0
        assert not os.path.exists(sock)
