"""Test helper: read a flight-recorder MCAP file back and check every message on its schema."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
from mcap.reader import make_reader


def read_checked(path: Path) -> dict[str, Any]:
    """Every message of a finished file, each valid against its channel's JSON schema (as
    stored in the file): topic counts, the first/last log time per topic, the marks."""
    counts: Counter[str] = Counter()
    first: dict[str, int] = {}
    marks: list[dict[str, Any]] = []
    validators: dict[int, jsonschema.protocols.Validator] = {}
    with path.open("rb") as f:
        reader = make_reader(f)
        summary = reader.get_summary()
        assert summary is not None, f"{path}: no summary (not finished)"
        assert summary.chunk_indexes, f"{path}: no chunk index"
        for schema, channel, msg in reader.iter_messages():
            assert schema is not None and schema.encoding == "jsonschema"
            assert channel.message_encoding == "json"
            v = validators.get(schema.id)
            if v is None:
                s = json.loads(schema.data)
                cls = jsonschema.validators.validator_for(s)
                cls.check_schema(s)
                v = validators[schema.id] = cls(s)
            obj = json.loads(msg.data)
            errors = list(v.iter_errors(obj))
            assert not errors, f"{channel.topic}: {errors[0].message} in {obj!r}"[:600]
            counts[channel.topic] += 1
            first.setdefault(channel.topic, msg.log_time)
            if channel.topic == "/recorder":
                marks.append(obj)
    return {"counts": counts, "first": first, "marks": marks,
            "compression": {c.compression for c in summary.chunk_indexes},
            "messages": summary.statistics.message_count if summary.statistics else None}
