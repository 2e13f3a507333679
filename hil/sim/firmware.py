"""The simulated drive firmware: docs/PROTOCOL.md v1 over the codec, sans-IO, on a fixed tick grid.

`Firmware.receive(data, now)` takes bytes from the host; `Firmware.step(now)` runs every firmware
tick up to `now` and returns the bytes to write; `drain()` returns replies queued by `receive`
(HELLO_ACK, PONG, events) without waiting for the next tick. `now` is the runner's clock in
seconds (time.monotonic() on the pty, virtual time in lock-step); firmware time is
`fw_us = round((now - t0) * 1e6)` and ticks fall on multiples of `tick_us`, so a run is
deterministic given its seed and the reception times of the host's frames.

Behaviour beyond PROTOCOL.md, chosen here: COMMANDs while the drives are off or a stop is latched
re-arm the deadman but move nothing; STOP(category 2) holds at once and latches until ENABLE(1),
and so does a deadman trip (PROTOCOL.md §4; `firmware_deadman_latch = false` brings back the old
firmware that a POSITION COMMAND released, for tests that prove the host side alone holds);
the firmware's own hold (deadman, STOP, e-stop) acts at once, host references go through the
transport delay; the gripper is self-locking (keeps opening and force when the drives go off).
"""

from __future__ import annotations

import random
from typing import Any

from edge_agent.link.codec import (
    PROTO_VERSION,
    Command,
    Enable,
    Event,
    EventCode,
    Frame,
    FrameDecoder,
    FrameType,
    Hello,
    HelloAck,
    Message,
    Mode,
    Ping,
    Pong,
    SeqCounter,
    StatusFlag,
    Stop,
    StopCategory,
    encode,
)
from edge_agent.robot import RobotDescription
from hil.sim.config import RigConfig
from hil.sim.estop_reaction import EstopReaction
from hil.sim.faults import FaultEngine, FaultSpec
from hil.sim.gripper import Gripper, WorldObject
from hil.sim.physics import HOLD_HERE, Arm
from hil.sim.record import FrameRecord
from hil.sim.sensors import Camera, SensorModel
from hil.sim.status import StatusBuilder

_F = StatusFlag


class Firmware:
    """One simulated robot: physics, sensors, faults and the firmware's protocol behaviour."""

    def __init__(self, robot: RobotDescription, rig: RigConfig | None = None, *, seed: int = 0,
                 t0: float = 0.0, record: FrameRecord | None = None) -> None:
        self.robot = robot
        self.rig = rig = (rig or RigConfig()).check(robot)
        self.seed = seed
        self.t0 = t0
        self.n = robot.n_joints
        self.tick_us = rig.firmware_tick_us
        self.dt = rig.tick_s
        self.estop_hold = rig.firmware_estop_hold
        self.deadman_latch = rig.firmware_deadman_latch
        self.record = record if record is not None else FrameRecord()
        self.faults = FaultEngine(robot, rig, random.Random(f"{seed}:faults"))
        self.sensors = SensorModel(robot, rig, random.Random(f"{seed}:noise"),
                                   random.Random(f"{seed}:sensor-faults"))
        self._link_rng = random.Random(f"{seed}:link")
        self.bias = rig.biases_joint_encoder_offset_rad
        self._qmin = [j.position_min_rad for j in robot.joints]
        self._qmax = [j.position_max_rad for j in robot.joints]
        self.arm = Arm(robot, rig, robot.home)
        self.gripper = Gripper(robot, rig)
        world = random.Random(f"{seed}:world")
        x = world.uniform(rig.object_box_min_m[0], rig.object_box_max_m[0])
        y = world.uniform(rig.object_box_min_m[1], rig.object_box_max_m[1])
        self.obj = WorldObject((x, y, robot.table_z_m + rig.object_size_m / 2), rig.object_size_m,
                               robot.table_z_m)
        self.cameras = [Camera(ch, i) for i, ch in enumerate(robot.frame_sensors)]
        self.status = StatusBuilder(self)
        self.decoder = FrameDecoder()
        self._seq = SeqCounter()
        self._out = bytearray()
        self.k = 0  # index of the next tick
        self.fw_us = 0  # time of the last tick
        self.session_open = False
        self.deadman_ms = 50
        self.status_every = 1
        self._status_phase = 0
        self.estop_input = False
        self.estop_latched = False
        self.stop_hold = False
        self.deadman_tripped = False
        self.host_mode = Mode.HOLD
        self._deadman_armed = False
        self._deadman_expiry_us = 0
        self._last_cmd_rx_us = 0
        self.last_cmd_seq = 0
        self._have_cmd = False
        self._limit_mask = 0
        self._overcurrent_mask = 0
        self._bad_reported = 0
        self._bad_report_us = 0
        self._bad_pending = False
        self._bad_report_period_us = round(rig.firmware_bad_frame_report_s * 1e6)
        self._faults_applied = False
        self.counters: dict[str, int] = dict.fromkeys((
            "rx_bytes", "tx_bytes", "commands_applied", "duplicates_skipped", "cmd_rejected",
            "ignored_frames", "statuses_sent", "sensor_frames_sent", "deadman_trips",
            "estop_edges", "rx_discarded_bytes", "tx_discarded_bytes", "corrupted_bytes"), 0)
        self.estop_reaction = EstopReaction()

    # ------------------------------------------------------------------ I/O side

    def fw_time_us(self, now: float) -> int:
        return round((now - self.t0) * 1e6)

    def receive(self, data: bytes, now: float) -> None:
        """Bytes from the host, received at `now`; replies are queued (see drain/step)."""
        rx_us = self.fw_time_us(now)
        # Causality on the firmware clock: every tick before the reception has happened, so the
        # outcome depends only on rx_us, not on how late the runner called us.
        while self.k * self.tick_us < rx_us:
            self._tick()
        if self.faults.link_mode == "unplug":
            self.counters["rx_discarded_bytes"] += len(data)
            return
        self.counters["rx_bytes"] += len(data)
        for frame in self.decoder.feed(data):
            self.record.add(now, rx_us, frame)
            self._handle(frame, rx_us)
        if self.decoder.counters.bad_frames != self._bad_reported:
            self._bad_pending = True

    def step(self, now: float) -> bytes:
        """Run every tick due at `now`; returns everything to write to the host."""
        due = int((now - self.t0) * 1e6 + 0.5) // self.tick_us
        while self.k <= due:
            self._tick()
        return self.drain()

    def drain(self) -> bytes:
        """Bytes queued so far (replies to `receive`, tick output), with link faults applied."""
        if not self._out:
            return b""
        data = bytes(self._out)
        self._out.clear()
        mode = self.faults.link_mode
        if mode == "unplug":
            self.counters["tx_discarded_bytes"] += len(data)
            return b""
        if mode == "corrupt":
            data = self._corrupt(data)
        self.counters["tx_bytes"] += len(data)
        return data

    def wired(self, now: float) -> None:
        """The runner wrote what `step`/`drain` returned at `now`: stamps a pending press."""
        self.estop_reaction.wired(self.fw_time_us(now))

    def send(self, msg: Message) -> None:
        self._out += encode(msg, self._seq.next())

    def next_tick_time(self) -> float:
        """The runner's clock time of the next tick."""
        return self.t0 + self.k * self.tick_us * 1e-6

    # ------------------------------------------------------------------ faults

    def inject(self, spec: FaultSpec, now: float) -> dict[str, Any]:
        """Start a fault now (see hil.sim.faults); it takes effect at the next tick."""
        return self.faults.inject(spec, self.fw_time_us(now) * 1e-6)

    def clear_faults(self, target: str | None, now: float) -> list[str]:
        return self.faults.clear(target, self.fw_time_us(now) * 1e-6)

    def _corrupt(self, data: bytes) -> bytes:
        p = self.rig.faults_link_corrupt_byte_probability * self.faults.link_severity
        rnd = self._link_rng.random
        buf = bytearray(data)
        for i in range(len(buf)):
            if rnd() < p:
                buf[i] ^= 1 << self._link_rng.randrange(8)
                self.counters["corrupted_bytes"] += 1
        return bytes(buf)

    # ------------------------------------------------------------------ host frames

    def _event(self, code: EventCode, detail: int, fw_us: int) -> None:
        self.send(Event(fw_us, code, max(0, min(detail, 0xFFFF))))

    def _handle(self, frame: Frame, rx_us: int) -> None:
        msg = frame.msg
        if isinstance(msg, Hello):
            self._hello(msg, rx_us)
        elif not self.session_open:
            self.counters["ignored_frames"] += 1
        elif isinstance(msg, Command):
            self._command(msg, frame.seq, rx_us)
        elif isinstance(msg, Ping):
            self.send(Pong(msg.host_time_us, rx_us))
        elif isinstance(msg, Enable):
            self._enable(msg.enable, rx_us)
        elif isinstance(msg, Stop):
            self.estop_reaction.stop_received(rx_us)
            if msg.category == StopCategory.CAT0:
                self.arm.disable()
            elif self.arm.enabled:
                self.arm.hold_now()
                self.stop_hold = True
            self.host_mode = Mode.HOLD
            self.gripper.hold()
        else:
            self.counters["ignored_frames"] += 1

    def _hello(self, msg: Hello, rx_us: int) -> None:
        if msg.proto_version != PROTO_VERSION:
            self.session_open = False
            self.send(HelloAck(PROTO_VERSION, False, self.n, self.rig.firmware_fw_version))
            self._event(EventCode.VERSION_MISMATCH, msg.proto_version, rx_us)
            return
        self.session_open = True
        self.deadman_ms = msg.deadman_ms or 50
        self.status_every = max(1, round(msg.status_period_us / self.tick_us))
        self._status_phase = self.k
        self.send(HelloAck(PROTO_VERSION, True, self.n, self.rig.firmware_fw_version))

    def _enable(self, on: bool, rx_us: int) -> None:
        if not on:
            self.arm.disable()
            self.host_mode = Mode.HOLD
            return
        if self.estop_input:
            self.counters["cmd_rejected"] += 1
            self._event(EventCode.CMD_REJECTED, FrameType.ENABLE, rx_us)
            return
        self.arm.enable()
        self.gripper.hold()
        self.estop_latched = self.stop_hold = self.deadman_tripped = False
        self._deadman_armed = False
        self.host_mode = Mode.HOLD

    def _command(self, cmd: Command, seq: int, rx_us: int) -> None:
        arm = self.arm
        if len(cmd.q) != self.n:
            self.counters["cmd_rejected"] += 1
            self._event(EventCode.CMD_REJECTED, FrameType.COMMAND, rx_us)
            if arm.enabled and self.host_mode != Mode.HOLD:
                arm.hold_now()
                self.host_mode = Mode.HOLD
            return
        if self._have_cmd and seq == self.last_cmd_seq:
            self.counters["duplicates_skipped"] += 1
            return
        self._have_cmd = True
        self.last_cmd_seq = seq
        self._last_cmd_rx_us = rx_us
        self._deadman_expiry_us = rx_us + 1000 * (cmd.ttl_ms or self.deadman_ms)
        self._deadman_armed = True
        if cmd.mode == Mode.POSITION and not self.deadman_latch:
            self.deadman_tripped = False  # the old firmware: no ENABLE(1) needed
        if not arm.enabled or self.estop_latched or self.stop_hold or self.deadman_tripped:
            return
        self.counters["commands_applied"] += 1
        mask = 0
        if cmd.mode == Mode.POSITION:
            target = []
            ref = arm.ref
            for i, (lo, hi, qi, b) in enumerate(zip(self._qmin, self._qmax, cmd.q, self.bias,
                                                    strict=True)):
                c = (lo if qi < lo else hi if qi > hi else qi) if qi == qi else ref[i] + b
                if c != qi:  # clamped (NaN: keep the present reference)
                    mask |= 1 << i
                target.append(c - b)
            arm.set_reference(rx_us, target)
            self.host_mode = Mode.POSITION
        elif self.host_mode != Mode.HOLD:
            arm.set_reference(rx_us, HOLD_HERE)
            self.host_mode = Mode.HOLD
        if self.gripper.firmware_command(cmd.gripper_mode, cmd.gripper_setpoint,
                                         cmd.gripper_current_limit):
            mask |= 1 << self.n
        if mask != self._limit_mask:
            self._limit_mask = mask
            if mask:
                self._event(EventCode.LIMIT_CLAMPED, mask, rx_us)

    # ------------------------------------------------------------------ the tick

    def _tick(self) -> None:
        t_us = self.k * self.tick_us
        self.k += 1
        self.fw_us = t_us
        eng = self.faults
        if eng.active or (eng.pending and eng.next_start_s * 1e6 <= t_us):
            eng.update(t_us * 1e-6)
            self.sensors.faults = eng.sensor_faults
            self.gripper.weak_severity = eng.gripper_weak
            self.gripper.slip = eng.gripper_slip
            self.arm.blocked_fraction = eng.collision
            self._faults_applied = True
        elif self._faults_applied:
            self._faults_applied = False
            self.sensors.faults = {}
            self.gripper.weak_severity = self.arm.blocked_fraction = 0.0
            self.gripper.slip = False
        if eng.estop_taps:
            # A latched press edge: seen for at least this tick even if released already (a
            # tap still pressed from the tick before is released first, so this one is an edge).
            if self.estop_input:
                self._estop_edge(False, t_us)
            else:
                eng.estop_taps -= 1
                self._estop_edge(True, t_us)
        elif eng.estop_pressed != self.estop_input:
            self._estop_edge(eng.estop_pressed, t_us)
        arm = self.arm
        if self._deadman_armed and t_us > self._deadman_expiry_us and arm.enabled:
            self._deadman_armed = False
            if not self.deadman_tripped:
                self.deadman_tripped = True
                arm.hold_now()
                self.counters["deadman_trips"] += 1
                if self.session_open:
                    self._event(EventCode.DEADMAN_TRIP, (t_us - self._last_cmd_rx_us) // 1000,
                                t_us)
        arm.step(t_us, self.dt)
        self.gripper.step(self.dt, arm.tool, self.obj)
        arm.payload = self.obj.grasped
        if not self.session_open:
            return
        if self._bad_pending and t_us - self._bad_report_us >= self._bad_report_period_us:
            bad = self.decoder.counters.bad_frames
            self._event(EventCode.BAD_FRAME, bad - self._bad_reported, t_us)
            self._bad_reported, self._bad_report_us = bad, t_us
            self._bad_pending = False
        if (self.k - 1 - self._status_phase) % self.status_every == 0:
            arm.currents()  # only reports observe the currents: computed per status, not per tick
            if arm.overcurrent_mask != self._overcurrent_mask:
                self._overcurrent_mask = arm.overcurrent_mask
                if arm.overcurrent_mask:
                    self._event(EventCode.OVERCURRENT, arm.overcurrent_mask, t_us)
            self._out += self.status.encode(t_us, self._seq.next())
            self.counters["statuses_sent"] += 1
        for cam in self.cameras:
            if cam.sample_due(t_us):
                cam.push(t_us, self.status.camera_value(cam))
            for ts, value in cam.deliverable(t_us):
                self.send(self.status.sensor_frame(cam, ts, value))
                self.counters["sensor_frames_sent"] += 1

    def _estop_edge(self, pressed: bool, t_us: int) -> None:
        self.estop_input = pressed
        self.counters["estop_edges"] += 1
        if pressed:
            self.estop_reaction.pressed(t_us)
        if pressed and self.estop_hold:
            self.estop_latched = True
            self.arm.disable()
            self.gripper.hold()
            self.host_mode = Mode.HOLD
        if self.session_open:
            self.status.edge(pressed, t_us)

    # ------------------------------------------------------------------ state

    @property
    def holding(self) -> bool:
        return self.arm.enabled and (self.host_mode == Mode.HOLD or self.deadman_tripped
                                     or self.stop_hold or self.arm.blocked_fraction > 0)

    def flags(self) -> int:
        f = 0
        if self.estop_input:
            f |= _F.ESTOP_INPUT
        if self.arm.enabled:
            f |= _F.DRIVES_ENABLED
        if self.deadman_tripped:
            f |= _F.DEADMAN_TRIPPED
        if self.holding:
            f |= _F.HOLDING
        if self.estop_latched:
            f |= _F.ESTOP_LATCHED
        if self.arm.overcurrent_mask:
            f |= _F.FAULT
        if self.session_open:
            f |= _F.SESSION_OPEN
        return f
