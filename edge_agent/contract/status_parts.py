"""Parts of the `status` command's result (StatusResult): the decision journal's figures, the
report outbox, the policy router, the background workers, as TypedDicts (part of status.py;
inlined in docs/asyncapi.yaml's generated StatusResult).
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Annotated, TypedDict

from edge_agent.contract.base import S

Count = Annotated[int, S(minimum=0)]


class JournalStats(TypedDict):
    """The decision journal's figures (edge_agent/store/decisions.py)."""

    enabled: Annotated[bool, "decisions are being journaled now"]
    disabled: Annotated[str | None, "why the journal was turned off (disk_full, io_error), null "
                        "while it is on", S(enum=["disk_full", "io_error", None])]
    submitted: Annotated[Count, "records queued to the writer"]
    written: Annotated[Count, "records written"]
    dropped: Annotated[Count, "records the writer's full queue dropped"]
    rejected: Annotated[Count, "malformed records, queue full, or after it was turned off"]
    errors: Annotated[Count, "the writer's I/O errors"]
    shedding: Annotated[bool, "not journaling while the disk is short (storage_low)"]
    shed: Annotated[Count, "records not journaled while shedding"]
    segments: Annotated[Count, "the journal's segment files"]
