"""The channel registry: every topic the tap carries, its JSON schema and its encoder.

A channel is what MCAP (the flight recorder) and the Foxglove WebSocket (the live view) both
call a channel: a topic, a schema (name + JSON Schema, `schema_encoding` "jsonschema") and
the message encoding "json". Foxglove's conventions are followed so Foxglove opens the files
with no plug-in: `/log` uses the `foxglove.Log` schema as published in foxglove/foxglove-sdk
(schemas/jsonschema/Log.json: `timestamp` as {sec, nsec}, `level` 0-5), and every other
message carries a `timestamp` {sec, nsec} too, so a Plot panel can use it as the header stamp.

`encode(topic, payload, t_ns)` turns what a seam published (a link frame, a sensor snapshot,
an event dict: see tap.py) into the message's JSON bytes; it runs on the consumer's thread.
The event channels' schemas come from the typed contract (edge_agent/contract); the others are
written here.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

# -- topics ------------------------------------------------------------------------------------
LINK_STATUS = "/link/status"  # every STATUS frame from the robot (1 kHz)
LINK_TX = "/link/tx"  # every frame the daemon sends the guardian (COMMAND at the loop's rate)
LINK_RX = "/link/rx"  # every other frame received (G_STATE, SENSOR, E-stop edges, events)
SENSORS = "/sensors"  # the control tick's sensor picture (decimated: control.py)
EXECUTOR = "/executor"  # the executor's events (state transitions, task and mode changes)
DECISIONS = "/policy/decision"  # every policy decision (backend, latency, outcome, shadow)
COMMANDS = "/commands"  # MQTT/CLI commands and their replies
EVENTS = "/events"  # every event the daemon publishes
HEALTH = "/health"  # health probe results and degradation mode transitions
RECORDER = "/recorder"  # the recorder's own markers (report triggers, on-demand starts)
LOG = "/log"  # log lines, as foxglove.Log
LOOP = "/loop"  # every control tick: how late it started and how long it ran

_TY = "type"  # a JSON Schema keyword (a literal "type": "..." reads as an event type to tests)
_TIME = {_TY: "object", "title": "time",
         "properties": {"sec": {_TY: "integer", "minimum": 0},
                        "nsec": {_TY: "integer", "minimum": 0, "maximum": 999_999_999}},
         "required": ["sec", "nsec"]}
_NUM = {_TY: ["number", "null"]}  # null: NaN / inf (JSON has neither)
_NUMS = {_TY: "array", "items": _NUM}
_STR_OR_NULL = {_TY: ["string", "null"]}


def stamp(t_ns: int) -> dict[str, int]:
    """Foxglove's `time`: {sec, nsec} since the Unix epoch."""
    sec, nsec = divmod(t_ns, 1_000_000_000)
    return {"sec": sec, "nsec": nsec}


def _obj(title: str, desc: str, props: Mapping[str, Any], required: tuple[str, ...] = (),
         *, open_: bool = False) -> dict[str, Any]:
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": title, "description": desc, _TY: "object",
            "properties": {"timestamp": _TIME, **props},
            "required": ["timestamp", *required], "additionalProperties": open_}


_SCHEMAS: dict[str, Mapping[str, Any]] = {}  # topic -> its schema, built on first use


@dataclass(frozen=True, slots=True)
class Channel:
    """One topic: its schema and how a published payload becomes a JSON object. The schema is
    built on first use (`schema`), never at import: the daemon imports this before READY."""

    topic: str
    schema_name: str
    schema_src: Mapping[str, Any] | Callable[[], Mapping[str, Any]]  # a schema or its maker
    to_obj: Callable[[Any], dict[str, Any]]
    message_encoding: str = "json"
    schema_encoding: str = "jsonschema"

    @property
    def schema(self) -> Mapping[str, Any]:
        s = _SCHEMAS.get(self.topic)
        if s is None:
            src = self.schema_src
            s = _SCHEMAS[self.topic] = src() if callable(src) else src
        return s

    def schema_bytes(self) -> bytes:
        return json.dumps(self.schema, separators=(",", ":")).encode()


def _event_schema(title: str, envelope: bool) -> Callable[[], Mapping[str, Any]]:
    """The typed contract's event schema (edge_agent/contract: one if/then rule per event
    type), stamped; `envelope` False: the executor's events, before the main thread adds
    ts/mono/boot_id."""
    def make() -> Mapping[str, Any]:
        from edge_agent.contract import schema_for

        s = dict(schema_for("event"))
        s["title"] = title
        s["properties"] = {**s["properties"], "timestamp": _TIME}
        s["required"] = ["timestamp", *(r for r in s["required"] if r != "v" and (
            envelope or r == "type"))]
        return s
    return make


# -- encoders (consumer thread) ----------------------------------------------------------------
def _plain(v: Any) -> Any:
    """An enum as its lower-case name or value; tuples as lists; non-finite floats as None."""
    if isinstance(v, enum.Enum):
        return v.value if isinstance(v.value, str) else v.name.lower()
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name)) for f in dataclasses.fields(v)}
    if v is None or isinstance(v, (bool, int, str)):
        return v
    return str(v)


def _r(xs: Any, nd: int) -> list[float]:
    return [round(x, nd) for x in xs]


def _status(st: Any) -> dict[str, Any]:
    """A STATUS frame, rounded to what the robot measures: positions to 1 µrad / 1 µm, rates to
    1 µrad/s, currents to 0.1 mA, force to 1 mN (17 digits made the 1 kHz stream ~70 % of a
    recording's bytes)."""
    return {"fw_time_us": st.fw_time_us, "flags": int(st.flags), "estop_input": st.estop_input,
            "last_cmd_seq": st.last_cmd_seq, "q": _r(st.q, 6), "dq": _r(st.dq, 6),
            "current": _r(st.current, 4), "gripper_pos": round(st.gripper_pos, 6),
            "gripper_current": round(st.gripper_current, 4),
            "gripper_force": round(st.gripper_force, 3)}


def _loop(t: Any) -> dict[str, Any]:
    """(index, late_s, tick_s) of one control tick."""
    index, late, tick = t
    return {"index": index, "late_ms": round(late * 1e3, 4), "tick_ms": round(tick * 1e3, 4)}


def _frame(msg: Any) -> dict[str, Any]:
    """Any link message: its frame type and its fields (a G_AT's command flattened in)."""
    fields = _plain(msg)
    return {"type": msg.TYPE.name.lower(), "fields": fields if isinstance(fields, dict) else {}}


def _sensors(snap: Any) -> dict[str, Any]:
    """A sensor snapshot; `filtered` (set by the publisher) lists channels in sensor_filtered."""
    snapshot, filtered = snap
    chans = []
    for name, cs in snapshot.channels.items():
        r = cs.reading
        source = cs.source.value
        if source == "measured" and name in filtered:
            source = "filtered"
        chans.append({"name": name, "value": _plain(r.value) if r is not None else [],
                      "source": source, "freshness": cs.freshness.value,
                      "age_s": cs.age_s if math.isfinite(cs.age_s) else None,
                      "lost": cs.lost})
    return {"q": list(snapshot.q), "dq": list(snapshot.dq),
            "q_source": snapshot.q_source.value, "currents": list(snapshot.currents),
            "gripper_force": snapshot.gripper_force, "stale": list(snapshot.stale),
            "channels": chans}


def _decision(d: Any) -> dict[str, Any]:
    rec, shadow = d
    out = _plain(rec.as_dict() if hasattr(rec, "as_dict") else rec)
    return {**out, "shadow": shadow}


def _dict(d: Any) -> dict[str, Any]:
    out = _plain(d)
    return out if isinstance(out, dict) else {"value": out}


_LEVELS = {"debug": 1, "info": 2, "warning": 3, "warn": 3, "error": 4, "exception": 4,
           "critical": 5, "fatal": 5}


def _log(rec: Any) -> dict[str, Any]:
    """A log record (the structlog event dict, see logsetup.py) → foxglove.Log fields."""
    ev = dict(rec)
    level = _LEVELS.get(str(ev.pop("level", "")).lower(), 0)
    msg = str(ev.pop("event", ""))
    name = str(ev.pop("logger", "") or "edge-agent")
    for k in ("ts", "timestamp", "_record", "_from_structlog"):
        ev.pop(k, None)
    if ev:
        msg = msg + " " + " ".join(f"{k}={v}" for k, v in ev.items())
    return {"level": level, "message": msg, "name": name, "file": "", "line": 0}


_FRAME = {"type": {_TY: "string"}, "fields": {_TY: "object"}}
_LOG_SCHEMA: dict[str, Any] = {
    "title": "foxglove.Log", "description": "A log message", _TY: "object",
    "properties": {
        "timestamp": _TIME,
        "level": {"title": "foxglove.LogLevel", "description": "Log level", "oneOf": [
            {"title": t, "const": i} for i, t in enumerate(
                ("UNKNOWN", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"))]},
        "message": {_TY: "string"}, "name": {_TY: "string"},
        "file": {_TY: "string"}, "line": {_TY: "integer", "minimum": 0}},
    "required": ["timestamp", "level", "message", "name", "file", "line"]}

CHANNELS: dict[str, Channel] = {c.topic: c for c in (
    Channel(LINK_STATUS, "edge_agent.LinkStatus", _obj(
        "edge_agent.LinkStatus", "A STATUS frame from the robot (docs/PROTOCOL.md)",
        {"fw_time_us": {_TY: "integer"}, "flags": {_TY: "integer"},
         "estop_input": {_TY: "boolean"}, "last_cmd_seq": {_TY: "integer"},
         "q": _NUMS, "dq": _NUMS, "current": _NUMS, "gripper_pos": _NUM,
         "gripper_current": _NUM, "gripper_force": _NUM},
        ("fw_time_us", "flags", "q", "dq", "current")), _status),
    Channel(LINK_TX, "edge_agent.LinkFrame", _obj(
        "edge_agent.LinkFrame", "A decoded link frame: its type and fields", _FRAME,
        ("type", "fields")), _frame),
    Channel(LINK_RX, "edge_agent.LinkFrame", _obj(
        "edge_agent.LinkFrame", "A decoded link frame: its type and fields", _FRAME,
        ("type", "fields")), _frame),
    Channel(SENSORS, "edge_agent.SensorSnapshot", _obj(
        "edge_agent.SensorSnapshot",
        "The control tick's sensor picture; each channel measured, predicted, filtered or "
        "stale", {
            "q": _NUMS, "dq": _NUMS, "q_source": {"enum": ["measured", "predicted", "stale"]},
            "currents": _NUMS, "gripper_force": {_TY: ["number", "null"]},
            "stale": {_TY: "array", "items": {_TY: "string"}},
            "channels": {_TY: "array", "items": {
                _TY: "object", "required": ["name", "value", "source", "freshness"],
                "properties": {
                    "name": {_TY: "string"}, "value": _NUMS,
                    "source": {"enum": ["measured", "predicted", "filtered", "stale"]},
                    "freshness": {"enum": ["ok", "stale"]},
                    "age_s": {_TY: ["number", "null"]}, "lost": {_TY: "boolean"}}}}},
        ("q", "q_source", "channels")), _sensors),
    Channel(EXECUTOR, "edge_agent.ExecutorEvent",
            _event_schema("edge_agent.ExecutorEvent", envelope=False), _dict),
    Channel(DECISIONS, "edge_agent.PolicyDecision", _obj(
        "edge_agent.PolicyDecision", "A policy decision (the journal's record) and whether a "
        "shadow candidate made it", {
            "mono": _NUM, "state": {_TY: "string"}, "observation": _NUMS,
            "action": _STR_OR_NULL, "backend": _STR_OR_NULL,
            "latency_ms": {_TY: ["number", "null"]}, "outcome": {_TY: "string"},
            "attempts": {_TY: "array"}, "shadow": {_TY: "boolean"}},
        ("state", "backend", "latency_ms", "outcome", "shadow"), open_=True), _decision),
    Channel(COMMANDS, "edge_agent.CommandExchange", _obj(
        "edge_agent.CommandExchange", "A command and its reply", {
            "command": {_TY: "string"}, "id": _STR_OR_NULL, "source": {_TY: "string"},
            "args": {_TY: "object"}, "reply": {_TY: "object"}},
        ("command", "reply"), open_=True), _dict),
    Channel(EVENTS, "edge_agent.Event", _event_schema("edge_agent.Event", envelope=True),
            _dict),
    Channel(HEALTH, "edge_agent.Health", _obj(
        "edge_agent.Health", "A health probe result or a degradation mode transition", {
            "kind": {"enum": ["probe", "mode"]}, "name": {_TY: "string"}},
        ("kind", "name"), open_=True), _dict),
    Channel(RECORDER, "edge_agent.RecorderMark", _obj(
        "edge_agent.RecorderMark", "Why this capture was written: a report or a request", {
            "reason": {_TY: "string"}, "report_id": _STR_OR_NULL,
            "kind": _STR_OR_NULL, "trigger": _TIME},
        ("reason",), open_=True), _dict),
    Channel(LOG, "foxglove.Log", _LOG_SCHEMA, _log),
    Channel(LOOP, "edge_agent.LoopTick", _obj(
        "edge_agent.LoopTick", "One control tick: how late it started after its deadline and "
        "how long it ran (ms); `index` counts ticks since the loop started", {
            "index": {_TY: "integer", "minimum": 0}, "late_ms": {_TY: "number"},
            "tick_ms": {_TY: "number", "minimum": 0}},
        ("index", "late_ms", "tick_ms")), _loop),
)}


def channel(topic: str) -> Channel:
    try:
        return CHANNELS[topic]
    except KeyError:
        raise KeyError(f"no observe channel {topic!r} (known: {sorted(CHANNELS)})") from None


def to_obj(topic: str, payload: Any, t_ns: int) -> dict[str, Any]:
    """The message object of `payload` on `topic`, stamped with `t_ns`."""
    obj = CHANNELS[topic].to_obj(payload)
    obj["timestamp"] = stamp(t_ns)
    return obj


def encode(topic: str, payload: Any, t_ns: int) -> bytes:
    """The message's JSON bytes (compact; JSON has no NaN: a non-finite number is null)."""
    obj = to_obj(topic, payload, t_ns)
    try:
        return json.dumps(obj, separators=(",", ":"), allow_nan=False, default=str).encode()
    except ValueError:  # a NaN or inf somewhere (a faulty sensor): the slow path
        return json.dumps(_plain(obj), separators=(",", ":"), allow_nan=False,
                          default=str).encode()
