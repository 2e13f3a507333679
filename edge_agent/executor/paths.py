"""Where a pick-and-place task's tool paths go: the waypoints of each path kind. Pure."""

from __future__ import annotations

from edge_agent.executor.controllers import SegmentKind, Vec3
from edge_agent.executor.tasks import ExecutorConfig, PathKind, TaskSpec


def path_waypoints(kind: PathKind, object_xyz: Vec3, place_xyz: Vec3,
                   cfg: ExecutorConfig) -> list[tuple[SegmentKind, Vec3]]:
    """The segments of one state's path, for a part at `object_xyz` going to `place_xyz`."""
    o, p = object_xyz, place_xyz
    if kind is PathKind.TO_GRASP:
        return [(SegmentKind.FREE, (o[0], o[1], o[2] + cfg.approach_clearance_m)),
                (SegmentKind.LINEAR, o)]
    if kind is PathKind.LIFT:
        return [(SegmentKind.LINEAR, (o[0], o[1], o[2] + cfg.lift_height_m))]
    if kind is PathKind.TO_PLACE:
        return [(SegmentKind.FREE, (p[0], p[1], p[2] + cfg.lift_height_m)),
                (SegmentKind.LINEAR, (p[0], p[1], p[2] - cfg.place_press_m))]
    return [(SegmentKind.LINEAR, (p[0], p[1], p[2] + cfg.retreat_height_m))]


def task_points(spec: TaskSpec, object_xyz: Vec3, place_xyz: Vec3,
                cfg: ExecutorConfig) -> list[Vec3]:
    """Every point the task's paths pass through (each must be reachable before it starts)."""
    return [pt for s in spec.states if s.path is not PathKind.NONE
            for _, pt in path_waypoints(s.path, object_xyz, place_xyz, cfg)]
