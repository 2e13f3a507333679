"""What the firmware reports: STATUS, SENSOR and ESTOP_EDGE frames, and the rig's state snapshot.

STATUS fields map to the description's channels: `joint_encoders` → q (true angle + hidden encoder
offset + noise), `joint_currents` → current, `gripper_position` → gripper_pos, `wrist_force` →
gripper_force (force sensor offset + noise). A status channel in dropout is sent as NaN; a frame
channel in dropout as `valid=0` with zeros. `object_pose` is the cube's centre as the camera sees
it (camera offset + noise), sampled at the channel's rate and delivered after its latency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edge_agent.link.codec import EstopEdge, Sensor, Status, StatusFlag, encode
from hil.sim.sensors import Camera

if TYPE_CHECKING:
    from hil.sim.firmware import Firmware

_FLAGS = [StatusFlag(i) for i in range(128)]
_NAN = float("nan")


class StatusBuilder:
    """Builds the firmware's outgoing reports from the true physical state."""

    def __init__(self, fw: Firmware) -> None:
        self.fw = fw
        self.n = fw.n
        std = fw.sensors.std.get("joint_currents", 0.0)
        self._grip_current_std = std
        self._q_bias = fw.sensors.bias.get("joint_encoders", (0.0,) * self.n)
        self._f_bias = fw.sensors.bias.get("wrist_force", (0.0,))[0]

    def encode(self, t_us: int, seq: int) -> bytes:
        fw = self.fw
        sens = fw.sensors
        arm, grip = fw.arm, fw.gripper
        if not sens.faults:
            return encode(self._status_fast(t_us), seq)
        nan_n = (_NAN,) * self.n
        q = sens.shape("joint_encoders", arm.q) or nan_n
        dq = sens.velocity(arm.dq) or nan_n
        cur = sens.shape("joint_currents", arm.current) or nan_n
        gpos = sens.shape("gripper_position", (grip.opening,))
        gforce = sens.shape("wrist_force", (grip.force,))
        gcur = grip.current + sens.normals.gauss(self._grip_current_std)
        msg = Status(t_us, _FLAGS[fw.flags()], fw.last_cmd_seq, q, dq, cur,
                     gpos[0] if gpos else _NAN, gcur, gforce[0] if gforce else _NAN)
        return encode(msg, seq)

    def _status_fast(self, t_us: int) -> Status:
        """The STATUS without sensor faults: the same values and noise draws as the general
        path (shape/velocity), inlined — this runs at the status rate."""
        fw = self.fw
        sens, arm, grip = fw.sensors, fw.arm, fw.gripper
        normals, n = sens.normals, self.n
        tab = normals.tab
        sq, sc = sens.std.get("joint_encoders", 0.0), sens.std.get("joint_currents", 0.0)
        k = normals.take(n)
        q = tuple([x + b + sq * tab[k + j]
                   for j, (x, b) in enumerate(zip(arm.q, self._q_bias, strict=True))])
        sens.last_reported["joint_encoders"] = q
        k, sv = normals.take(n), sens.vel_std
        dq = tuple([x + sv * tab[k + j] for j, x in enumerate(arm.dq)])
        k = normals.take(n)
        cur = tuple([x + sc * tab[k + j] for j, x in enumerate(arm.current)])
        sens.last_reported["joint_currents"] = cur
        k = normals.take(1)
        gpos = grip.opening + sens.std.get("gripper_position", 0.0) * tab[k]
        sens.last_reported["gripper_position"] = (gpos,)
        k = normals.take(1)
        gforce = grip.force + self._f_bias + sens.std.get("wrist_force", 0.0) * tab[k]
        sens.last_reported["wrist_force"] = (gforce,)
        gcur = grip.current + normals.gauss(self._grip_current_std)
        return Status(t_us, _FLAGS[fw.flags()], fw.last_cmd_seq, q, dq, cur, gpos, gcur, gforce)

    def camera_value(self, cam: Camera) -> tuple[float, ...] | None:
        if cam.channel.name == "object_pose":
            return self.fw.sensors.shape("object_pose", self.fw.obj.xyz)
        return None  # a channel this rig does not simulate: never valid

    def sensor_frame(self, cam: Camera, ts_us: int, value: tuple[float, ...] | None) -> Sensor:
        if value is None:
            return Sensor(ts_us, cam.channel_id, False, (0.0,) * cam.channel.dim)
        return Sensor(ts_us, cam.channel_id, True, value)

    def edge(self, pressed: bool, t_us: int) -> None:
        self.fw.send(EstopEdge(t_us, pressed))

    def snapshot(self) -> dict[str, Any]:
        """The rig's true state (for the control socket's `status` and for tests)."""
        fw = self.fw
        arm, grip, obj = fw.arm, fw.gripper, fw.obj
        return {
            "fw_time_us": fw.fw_us,
            "session_open": fw.session_open,
            "drives_enabled": arm.enabled,
            "estop_input": fw.estop_input,
            "estop_latched": fw.estop_latched,
            "estop_hold": fw.estop_hold,
            "stop_hold": fw.stop_hold,
            "deadman_tripped": fw.deadman_tripped,
            "deadman_latch": fw.deadman_latch,
            "holding": fw.holding,
            "flags": fw.flags(),
            "q": list(arm.q),
            "q_encoder": [q + b for q, b in zip(arm.q, fw.bias, strict=True)],
            "dq": list(arm.dq),
            "current": list(arm.current),
            "tool_xyz": list(arm.tool[:3]),
            "tool_pitch": arm.tool[3],
            "penetration_m": arm.penetration_m,
            "gripper": {"opening_m": grip.opening, "force_n": grip.force,
                        "current_a": grip.current, "contact": grip.contact,
                        "mode": grip.mode.name, "current_limit_a": grip.current_limit,
                        "weak_severity": grip.weak_severity, "slip": grip.slip},
            "object": {"xyz": list(obj.xyz), "grasped": obj.grasped, "drops": obj.drops},
            "faults": fw.faults.describe(),
            "counters": {**fw.counters, "last_cmd_seq": fw.last_cmd_seq,
                         **{f"rx_{k}": v for k, v in fw.decoder.counters.as_dict().items()}},
            "status_every_ticks": fw.status_every,
            "tick_us": fw.tick_us,
        }
