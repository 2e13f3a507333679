"""`status.observe`: the flight recorder, the Foxglove live view and the metrics endpoint
(docs/OBSERVE.md), as TypedDicts (part of status.py; inlined in docs/asyncapi.yaml's generated
StatusResult).
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Annotated, TypedDict

from edge_agent.contract.base import S

Count = Annotated[int, S(minimum=0)]


class TapQueue(TypedDict):
    """One consumer's queue on the tap (edge_agent/observe/tap.py): bounded, drop-oldest."""

    queued: Annotated[Count, "items waiting for the consumer's thread"]
    dropped: Annotated[Count, "items lost because the consumer was behind"]
    received: Annotated[Count, "items the consumer took"]
    maxlen: Annotated[int, S(minimum=1)]


class RecorderStatus(TypedDict):
    """The flight recorder (edge_agent/observe/recorder.py; observe.record_* keys)."""

    dir: Annotated[str, "where its MCAP files go (<state_dir>/recordings)"]
    open: Annotated[list[str], "captures being written now"]
    recording: Annotated[str | None, "the on-demand capture (record.start) being written, or "
                         "null"]
    written: Annotated[Count, "files finished since start"]
    refused: Annotated[Count, "record.start refused (one was already running)"]
    merged: Annotated[Count, "report triggers that joined an open file (4 open already)"]
    rotated: Annotated[Count, "finished files removed by observe.record_max_files / "
                       "record_max_bytes"]
    ring_messages: Annotated[Count, "messages in the in-memory ring (the seconds before a "
                             "trigger)"]
    ring_bytes: Annotated[Count, "the ring's estimated encoded size, bytes"]
    dropped: Annotated[Count, "tap items the recorder lost (it was behind)"]
    encode_errors: Count
    cpu_s: Annotated[float, "the recorder thread's CPU time since start, s"]
    backlog_dropped: Annotated[Count, "unwritten items a capture shed because the recorder fell "
                               "behind by more than 100,000 (a gap in that file; starved of "
                               "CPU)"]
    last_path: Annotated[str | None, "the newest finished file"]


class LiveViewStatus(TypedDict):
    """The Foxglove live view (edge_agent/liveview/server.py; observe.foxglove_*)."""

    port: Annotated[int, "the WebSocket port it listens on"]
    sent: Annotated[dict[str, int], "messages handed to the server, per channel"]
    limited: Annotated[dict[str, int], "messages held back by observe.foxglove_rate_hz, per "
                       "channel"]
    encode_errors: Count
    cpu_s: Annotated[float, "its pump thread's CPU time since start, s"]
    tap: Annotated[TapQueue | None, "its tap queue (null before it subscribed)"]


class MetricsStatus(TypedDict):
    """The Prometheus endpoint (edge_agent/metrics/; observe.metrics_*)."""

    host: str
    port: int


class ObserveStatus(TypedDict):
    """The flight recorder, the live view and the metrics endpoint; each null when off (or, for
    the live view and the metrics, not started yet: they start after READY on a thread of
    their own, or could not bind: the log says why)."""

    recorder: RecorderStatus | None
    live: LiveViewStatus | None
    metrics: MetricsStatus | None
