"""The `report` and `telemetry` messages as TypedDicts. Part of the contract
(edge_agent/contract/__init__.py); their schemas are generated into docs/asyncapi.yaml like the
events' and status's.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Annotated, Literal, NotRequired, TypedDict

from edge_agent.contract.base import Ref, S, values_of
from edge_agent.contract.status import LoopFigures
from edge_agent.reports.record import ReportKind

Count = Annotated[int, S(minimum=0)]


class PlotRef(TypedDict):
    """The sensor-window plot beside the report on the device."""

    file: Annotated[str, "<reports.dir>/<file> on the device"]
    bytes: Annotated[int, S(minimum=1)]
    sha256: Annotated[str, S(pattern="^[0-9a-f]{64}$")]


class ReportPayload(TypedDict):
    """A repair report (docs/REPORTS.md): one for every e-stop, protective stop and L3
    diagnosis, delivered from the daemon's durable outbox at least once (QoS 1, and again after
    a restart if the broker had not taken it: de-duplicate by `id`). The whole message is at
    most 64 KiB: a longer Markdown is cut at a line, ends with a pointer to `edge-agent reports
    show ID`, and `cut` is true. The plot goes by reference (the PNG lies beside the report in
    the device's reports directory)."""

    v: Annotated[Literal[1], Ref("ProtocolVersion")]
    id: Annotated[str, "a ULID (sorts by time)", S(pattern="^[0-9A-HJKMNP-TV-Z]{26}$")]
    ts: Annotated[float, Ref("Timestamp")]
    kind: Annotated[str, Ref("ReportKind"), values_of(ReportKind)]
    title: Annotated[str, "what an operator reads first", S(minLength=1)]
    fault: Annotated[str, "the merge key, e.g. protective_stop:collision", S(minLength=1)]
    markdown: str
    cut: NotRequired[Annotated[bool, "the Markdown was shortened to fit the payload limit"]]
    recording: Annotated[str | None, "The flight recorder's MCAP file of this report on the "
                         "device (observe.record_pre_s before the report's time to "
                         "observe.record_post_s after it; docs/OBSERVE.md), or null when the "
                         "recorder is off."]
    plot: Annotated[PlotRef | None, "The sensor-window plot, or null when none was drawn."]


class TelemetryFields(TypedDict):
    """Rate-limited figures (`mqtt.telemetry_hz`): the control loop's and the last STATUS from
    the robot. Fields may be added."""

    loop: Annotated[LoopFigures | None, "the control loop's figures; null before it runs"]
    link_frames: Annotated[Count, "frames received from the link since start"]
    send_errors: Annotated[Count, "command frames the link refused"]
    q: NotRequired[Annotated[list[float], "joint positions, rad"]]
    gripper_pos: NotRequired[Annotated[float, "m"]]
    gripper_force: NotRequired[Annotated[float, "N"]]
    fw_time_us: NotRequired[Count]


class TelemetryPayload(TelemetryFields):
    """The `telemetry` message."""

    v: Annotated[Literal[1], Ref("ProtocolVersion")]
