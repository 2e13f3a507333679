"""The daemon's typed contract: every event, the `state` and the `status` payloads as TypedDicts
(edge_agent/contract/events.py, status.py), and their JSON Schemas.

The records are plain dicts at run time (no cost on the control thread); the schemas are made
from them on demand (edge_agent/contract/schema_gen.py) and docs/asyncapi.yaml's payload schemas
are generated from them (`python -m edge_agent.contract.asyncapi --write`).
"""

from __future__ import annotations

from typing import Any


def schema_for(name: str) -> dict[str, Any]:
    """The stand-alone JSON Schema (draft 2020-12 and draft 7 compatible, no `$ref`) of a payload.

    `name` is `"event:<type>"` (one event type, e.g. `"event:task_started"`: the envelope
    `v, type, ts, mono, boot_id` plus the type's fields), `"event"` (any event: the envelope and
    the per-type rules), `"state"` (the retained MQTT `state`), `"report"` and `"telemetry"` (those
    MQTT messages), `"status"` (the `status` command's result), or a record's class name (e.g.
    `"TaskStartedEvent"`, `"StateFields"`).
    Raises KeyError for an unknown name. A new dict each call (callers may change it).
    """
    from edge_agent.contract.schema_gen import schema_by_name

    return schema_by_name(name)


def schema_names() -> list[str]:
    """Every name `schema_for` knows: `event`, `state`, `status` and `event:<type>` per type."""
    from edge_agent.contract.schema_gen import payload_names

    return payload_names()
