"""edge_agent.robot: the shipped description loads; every bad value names its key and the reason."""

from __future__ import annotations

import copy
import math
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from edge_agent.errors import ConfigError
from edge_agent.robot import MAX_JOINTS, load_robot, parse_robot

ROBOT = Path(__file__).resolve().parents[1] / "configs" / "robot" / "edge-arm-4.toml"
BASE: dict[str, Any] = tomllib.loads(ROBOT.read_text(encoding="utf-8"))

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    """A mutation setting `path` (e.g. "joints.1.position_min_rad", "gripper.force_max_n")."""
    def apply(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node: Any = d
        for p in head:
            node = node[int(p)] if isinstance(node, list) else node[p]
        if isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return apply


def _del(path: str) -> Mutation:
    def apply(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node: Any = d
        for p in head:
            node = node[int(p)] if isinstance(node, list) else node[p]
        del node[last]
    return apply


def _rename(path: str, new: str) -> Mutation:
    def apply(d: dict[str, Any]) -> None:
        *head, last = path.split(".")
        node: Any = d
        for p in head:
            node = node[int(p)] if isinstance(node, list) else node[p]
        node[new] = node.pop(last)
    return apply


def _copy_joint(i: int) -> Mutation:
    return lambda d: d["joints"].append(copy.deepcopy(d["joints"][i]))


def test_sensor_ranges_and_spike_filters_are_read() -> None:
    robot = load_robot(ROBOT)
    force, pose = robot.sensor("wrist_force"), robot.sensor("object_pose")
    assert force.value_range == (-20.0, 60.0) and pose.value_range == (-1.0, 1.0)
    assert (force.spike_window, force.spike_k, force.spike_max_ratio) == (7, 5.0, 0.2)
    assert robot.sensor("joint_currents").spike_window == 0  # no filter
    assert robot.sensor("estop_input").value_range is None
    data = copy.deepcopy(BASE)
    data["sensors"][0]["spike_filter"] = {"window": 9}  # k and max_ratio default
    enc = parse_robot(data).sensor("joint_encoders")
    assert (enc.spike_window, enc.spike_k, enc.spike_max_ratio) == (9, 5.0, 0.2)


def test_stuck_samples_is_opt_in_per_channel() -> None:
    robot = load_robot(ROBOT)  # the simulated sensors all carry noise: every one but the e-stop
    assert {c.name: c.stuck_samples for c in robot.sensors} == {
        "joint_encoders": 5, "joint_currents": 5, "gripper_position": 5, "wrist_force": 5,
        "object_pose": 5, "estop_input": 0}
    data = copy.deepcopy(BASE)
    for ch in data["sensors"]:
        ch.pop("stuck_samples", None)
    data["sensors"][1]["stuck_samples"] = 50
    robot = parse_robot(data)
    assert robot.sensors[0].stuck_samples == 0  # off unless asked: a real sensor may repeat
    assert robot.sensors[1].stuck_samples == 50


def test_shipped_description_loads() -> None:
    r = load_robot(ROBOT)
    assert r.name == "edge-arm-4" and r.n_joints == 4
    assert [j.name for j in r.joints] == ["base_yaw", "shoulder", "elbow", "wrist"]
    assert r.tool_offset_m == pytest.approx(0.12)
    assert r.home == tuple(j.home_rad for j in r.joints)
    assert all(j.position_min_rad <= j.home_rad <= j.position_max_rad for j in r.joints)
    assert r.sensor("estop_input").on_loss == "stop"
    assert r.sensor_channel_id("object_pose") == 0
    assert r.source == str(ROBOT)


BAD: list[tuple[str, Mutation, str, str]] = [
    # (id, mutation, key, reason fragment)
    ("min > max", _set("joints.1.position_min_rad", 2.5), "joints[1].position_min_rad",
     "min is greater than max (joints[1].position_max_rad = 2.2)"),
    ("negative length", _set("joints.2.link_length_m", -0.3), "joints[2].link_length_m",
     "must be >= 0.0"),
    ("missing key", _del("joints.0.current_max_a"), "joints[0].current_max_a", "is required"),
    ("missing key, typo", _rename("joints.0.current_max_a", "current_max_A"),
     "joints[0].current_max_a", "is required; is 'joints[0].current_max_A' a typo?"),
    ("unknown key", _set("joints.3.gear_ratio", 100), "joints[3].gear_ratio", "unknown key"),
    ("unknown key, did you mean", _set("gripper.force_max_N", 40.0), "gripper.force_max_N",
     "unknown key; did you mean gripper.force_max_n?"),
    ("unknown top-level section", _set("calibraton", {"x": 1}), "calibraton", "unknown key"),
    ("wrong type: text for number", _set("joints.0.velocity_max_rad_s", "fast"),
     "joints[0].velocity_max_rad_s", "must be a number"),
    ("wrong type: bool for number", _set("tool.offset_m", True), "tool.offset_m",
     "must be a number"),
    ("wrong type: table", _set("gripper", 3), "gripper", "must be a table"),
    ("wrong type: joints", _set("joints", {"name": "x"}), "joints",
     "must be a non-empty array of tables"),
    ("duplicate joint names", _set("joints.2.name", "shoulder"), "joints[2].name",
     "duplicate joint name (also joints[1].name)"),
    ("duplicate sensor names", _set("sensors.1.name", "joint_encoders"), "sensors[1].name",
     "duplicate sensor name (also sensors[0].name)"),
    ("bad axis", _set("joints.0.axis", "w"), "joints[0].axis", "must be one of x, y, z"),
    ("limit beyond 2 pi", _set("joints.0.position_max_rad", 7.0), "joints[0].position_max_rad",
     "must be <= "),
    ("home outside limits", _set("joints.1.home_rad", 3.0), "joints[1].home_rad",
     "outside the joint's position limits"),
    ("zero velocity limit", _set("joints.0.velocity_max_rad_s", 0.0),
     "joints[0].velocity_max_rad_s", "must be > 0.0"),
    ("infinite current", _set("joints.0.current_max_a", math.inf), "joints[0].current_max_a",
     "must be finite"),
    ("too many joints", lambda d: d["joints"].extend(
        copy.deepcopy(d["joints"][0]) | {"name": f"j{i}"} for i in range(MAX_JOINTS)),
     "joints", f"at most {MAX_JOINTS}"),
    ("workspace min > max", _set("workspace.min_m", [0.6, -0.4, 0.0]), "workspace.min_m",
     "min x is greater than max x"),
    ("workspace not a vector", _set("workspace.max_m", [1, 2]), "workspace.max_m",
     "must be a list of 3 finite numbers"),
    ("gripper force range", _set("gripper.force_min_n", 50.0), "gripper.force_min_n",
     "min is greater than max"),
    ("gripper nominal current", _set("gripper.current_nominal_a", 5.0),
     "gripper.current_nominal_a", "between current_min_a and current_max_a"),
    ("sensor dim not integer", _set("sensors.0.dim", 2.5), "sensors[0].dim",
     "must be an integer"),
    ("sensor dim too large", _set("sensors.0.dim", 17), "sensors[0].dim", "<= 16"),
    ("predict without bound", _del("sensors.4.predict_max_s"), "sensors[4].predict_max_s",
     "needs a bound > 0"),
    ("e-stop predicted", _set("sensors.5.on_loss", "predict"), "sensors[5].on_loss",
     "never predicted"),
    ("bad on_loss", _set("sensors.0.on_loss", "ignore"), "sensors[0].on_loss",
     "must be one of predict, stop"),
    ("schema version", _set("schema_version", 2), "schema_version", "reads version 1"),
    ("missing name", _del("name"), "name", "is required"),
    ("missing section", _del("table"), "table", "is required"),
    ("section typo", _rename("gripper", "griper"), "gripper",
     "is required; is 'griper' a typo?"),
    ("empty joint name", _set("joints.0.name", ""), "joints[0].name",
     "must be a non-empty string"),
    ("range not a pair", _set("sensors.0.range", [1.0]), "sensors[0].range",
     "must be [min, max]: 2 finite numbers"),
    ("range reversed", _set("sensors.1.range", [5.0, -5.0]), "sensors[1].range",
     "min must be less than max"),
    ("range not finite", _set("sensors.1.range", [-math.inf, 5.0]), "sensors[1].range",
     "2 finite numbers"),
    ("spike window too small", _set("sensors.3.spike_filter.window", 2),
     "sensors[3].spike_filter.window", ">= 3"),
    ("spike k zero", _set("sensors.4.spike_filter.k", 0.0), "sensors[4].spike_filter.k",
     "must be > 0.0"),
    ("spike ratio above 1", _set("sensors.4.spike_filter.max_ratio", 1.5),
     "sensors[4].spike_filter.max_ratio", "<= 1.0"),
    ("spike filter typo", _set("sensors.4.spike_filter.windw", 7),
     "sensors[4].spike_filter.windw", "did you mean sensors[4].spike_filter.window?"),
    ("spike filter not a table", _set("sensors.0.spike_filter", 7),
     "sensors[0].spike_filter", "must be a table"),
    ("e-stop spike filtered", _set("sensors.5.spike_filter", {"window": 7}),
     "sensors[5].spike_filter", "never filtered"),
    ("stuck run of one", _set("sensors.0.stuck_samples", 1), "sensors[0].stuck_samples",
     "one sample is never stuck"),
    ("stuck check on a noise-free channel", _set("sensors.5.stuck_samples", 5),
     "sensors[5].stuck_samples", "needs noise"),
    ("stuck samples negative", _set("sensors.0.stuck_samples", -1), "sensors[0].stuck_samples",
     ">= 0"),
]


@pytest.mark.parametrize(("mutate", "key", "why"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_description_names_key_and_reason(mutate: Mutation, key: str, why: str) -> None:
    data = copy.deepcopy(BASE)
    mutate(data)
    with pytest.raises(ConfigError) as ei:
        parse_robot(data, "robot.toml")
    err = ei.value
    assert err.key == key, str(err)
    assert why in err.why, str(err)
    assert err.source == "robot.toml"
    assert str(err).startswith(f"robot.toml: {key} = ")


def test_missing_and_unparsable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load_robot(tmp_path / "none.toml")
    assert ei.value.key == "robot.description" and ei.value.why == "file not found"
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    with pytest.raises(ConfigError) as ei:
        load_robot(bad)
    assert ei.value.key == "robot.description" and "not valid TOML" in ei.value.why


def test_errors_from_a_file_carry_its_path(tmp_path: Path) -> None:
    p = tmp_path / "arm.toml"
    p.write_text(ROBOT.read_text().replace('axis = "z"', 'axis = "q"'))
    with pytest.raises(ConfigError) as ei:
        load_robot(p)
    assert (ei.value.key, ei.value.source) == ("joints[0].axis", str(p))
