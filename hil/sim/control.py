"""The rig's control socket: JSON-lines requests on a Unix socket — faults, state, frame record.

Never the production serial protocol: this is the test bench's own channel to the simulated
robot. One request per line, one response line per request: `{"ok": true, ...}` or
`{"ok": false, "error": "..."}`. `robot` (default 0) picks the robot; "all" applies `inject`,
`clear` and `set` to every robot of a fleet process.

    {"cmd": "ping"}
    {"cmd": "inject", "target": "estop", "mode": "press", "duration_s"?: 1.0, "severity"?: 0.5}
    {"cmd": "clear", "target"?: "link"}                    (no target: every fault)
    {"cmd": "status"}                → {"state": {...true state...}, "rig": {...cpu, overruns...}}
    {"cmd": "record", "type"?: "COMMAND", "since"?: <monotonic s>, "since_fw_us"?: N,
     "limit"?: N, "where"?: {"mode": "POSITION"}}      → {"frames": [...], "total": N}
    {"cmd": "set", "key": "firmware_estop_hold", "value": false}   (also "object_xyz": [x,y,z],
                                                                   "firmware_deadman_latch")
    {"cmd": "faults"}                → {"active": [...], "history": [...]}
    {"cmd": "latency", "clear"?: true} → {"estop_reaction_us": [...],
                                          "estop_wire_reaction_us": [...], "unanswered": N}
    {"cmd": "schedule", "faults": [{"at_s", "target", "mode", "duration_s"?, "severity"?}]}
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from hil.sim.faults import FaultError, FaultSpec
from hil.sim.firmware import Firmware

_MAX_LINE = 1 << 20
_LOCK_FREE = {"ping", "record"}  # record copies under the lock, filters outside it


class ControlHandler:
    """Turns one request dict into one response dict, under the rig's lock."""

    def __init__(self, firmwares: Sequence[Firmware], lock: threading.Lock,
                 info: Callable[[], dict[str, Any]] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.fws = list(firmwares)
        self.lock = lock
        self.info = info or (lambda: {})
        self.clock = clock

    def handle(self, req: Any) -> dict[str, Any]:
        if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
            return {"ok": False, "error": "a request is a JSON object with a string 'cmd'"}
        fn = getattr(self, f"_cmd_{req['cmd']}", None)
        if fn is None:
            return {"ok": False, "error": f"unknown cmd {req['cmd']!r}"}
        try:
            targets = self._robots(req.get("robot", 0))
            if req["cmd"] in _LOCK_FREE:
                out: dict[str, Any] = fn(req, targets)
            else:
                with self.lock:
                    out = fn(req, targets)
        except (FaultError, ValueError, TypeError, KeyError) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": True, **out}

    def _robots(self, robot: Any) -> list[Firmware]:
        if robot == "all":
            return self.fws
        if isinstance(robot, bool) or not isinstance(robot, int) or not 0 <= robot < len(self.fws):
            raise ValueError(f"robot must be 0..{len(self.fws) - 1} or 'all', got {robot!r}")
        return [self.fws[robot]]

    def _cmd_latency(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        """E-stop press edge → STOP frame received, µs on the firmware clock (`clear`: reset)."""
        return fws[0].estop_reaction.latency(bool(req.get("clear")))

    def _cmd_ping(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        return {"t": self.clock()}

    def _cmd_inject(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        spec = FaultSpec.from_mapping({k: v for k, v in req.items() if k not in ("cmd", "robot")})
        now = self.clock()
        done = [fw.inject(spec, now) for fw in fws]
        return {"fault": done[0], "robots": len(done), "t": now}

    def _cmd_clear(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        now = self.clock()
        cleared = [fw.clear_faults(req.get("target"), now) for fw in fws]
        return {"cleared": cleared[0] if len(cleared) == 1 else cleared}

    def _cmd_status(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        return {"t": self.clock(), "state": fws[0].status.snapshot(), "rig": self.info()}

    def _cmd_faults(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        eng = fws[0].faults
        return {"active": eng.describe(), "history": eng.history[-200:],
                "scheduled": len(eng.pending)}

    def _cmd_schedule(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        items = req.get("faults")
        if not isinstance(items, list):
            raise ValueError("schedule needs 'faults': a list")
        specs = [FaultSpec.from_mapping(x) for x in items]
        for fw in fws:
            fw.faults.schedule(specs)
        return {"scheduled": len(specs)}

    def _cmd_record(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        rec = fws[0].record
        where = req.get("where")
        if where is not None and not isinstance(where, dict):
            raise ValueError("'where' must be an object of field: value")
        with self.lock:  # a quick copy: the real-time thread must not wait for the filtering
            snapshot, total = list(rec.entries), rec.total
        entries = rec.query(type=req.get("type"), since=req.get("since"),
                            since_fw_us=req.get("since_fw_us"), limit=req.get("limit"),
                            where=where, entries=snapshot)
        return {"frames": [e.as_dict() for e in entries], "total": total}

    def _cmd_set(self, req: dict[str, Any], fws: list[Firmware]) -> dict[str, Any]:
        key, value = req.get("key"), req.get("value")
        if key == "firmware_estop_hold":
            if not isinstance(value, bool):
                raise ValueError("firmware_estop_hold takes true or false")
            for fw in fws:
                fw.estop_hold = value
        elif key == "firmware_deadman_latch":
            if not isinstance(value, bool):
                raise ValueError("firmware_deadman_latch takes true or false")
            for fw in fws:
                fw.deadman_latch = value
        elif key == "object_xyz":
            if (not isinstance(value, list) or len(value) != 3
                    or not all(isinstance(v, int | float) for v in value)):
                raise ValueError("object_xyz takes [x, y, z]")
            for fw in fws:
                fw.obj.place(value)
        else:
            raise ValueError(f"unknown key {key!r}; keys: firmware_estop_hold, "
                             "firmware_deadman_latch, object_xyz")
        return {"key": key, "value": value}


class ControlServer:
    """Serves a ControlHandler on a Unix socket from one thread (selectors, many clients)."""

    def __init__(self, path: str, handler: ControlHandler) -> None:
        self.path = path
        self.handler = handler
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(16)
        self.sock.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.sock, selectors.EVENT_READ, None)
        self._bufs: dict[socket.socket, bytearray] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="rig-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Idempotent; never raises."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)
        for s in [self.sock, *self._bufs]:
            with contextlib.suppress(OSError):
                s.close()
        self._bufs.clear()
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _run(self) -> None:
        while not self._stop.is_set():
            for key, _ in self._sel.select(timeout=0.1):
                if key.fileobj is self.sock:
                    self._accept()
                else:
                    self._serve(key.fileobj)  # type: ignore[arg-type]

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        conn.setblocking(True)
        conn.settimeout(5.0)
        self._bufs[conn] = bytearray()
        self._sel.register(conn, selectors.EVENT_READ, None)

    def _drop(self, conn: socket.socket) -> None:
        with contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(conn)
        self._bufs.pop(conn, None)
        with contextlib.suppress(OSError):
            conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            data = conn.recv(65536)
        except OSError:
            data = b""
        if not data:
            self._drop(conn)
            return
        buf = self._bufs[conn]
        buf += data
        if len(buf) > _MAX_LINE:
            self._drop(conn)
            return
        while b"\n" in buf:
            line, _, rest = bytes(buf).partition(b"\n")
            buf[:] = rest
            if not line.strip():
                continue
            try:
                resp = self.handler.handle(json.loads(line))
            except json.JSONDecodeError as exc:
                resp = {"ok": False, "error": f"not JSON: {exc}"}
            try:
                conn.sendall(json.dumps(resp, separators=(",", ":")).encode() + b"\n")
            except OSError:
                self._drop(conn)
                return


def request(path: str, req: dict[str, Any], timeout_s: float = 5.0) -> dict[str, Any]:
    """Send one request to a rig's control socket and return the response (a client helper)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(path)
        s.sendall(json.dumps(req).encode() + b"\n")
        buf = bytearray()
        while not buf.endswith(b"\n"):
            chunk = s.recv(65536)
            if not chunk:
                raise ConnectionError("rig closed the control socket")
            buf += chunk
    out: dict[str, Any] = json.loads(buf)
    return out
