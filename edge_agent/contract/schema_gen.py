"""JSON Schema from the contract's TypedDicts (edge_agent/contract/events.py, status.py).

Two forms: stand-alone (`schema_by_name`, for the flight recorder's and the live view's channels:
every type inline, no `$ref`) and document (`doc_schema`, for docs/asyncapi.yaml: enums, shared
pieces and named records as `$ref: '#/components/schemas/...'`). The output is valid draft 7 (the
AsyncAPI 3 schema format) and draft 2020-12 alike.

Mapping: str/int/float/bool/None -> string/integer/number/boolean/null; Literal -> const or enum;
a StrEnum -> its values; list[T] -> array; dict[str, T] -> object with additionalProperties;
Any -> {}; `T | None` -> nullable; a TypedDict -> object (`required` from Required/NotRequired,
its docstring the description); `Annotated` metadata: str (description), S (keywords), Ref.
Not imported by the daemon: only by the tools and consumers that need schemas.
"""

from __future__ import annotations

import enum
import functools
import inspect
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, NotRequired, Required, Union, get_args, get_origin

from edge_agent.contract import events, events_more, payloads, status, status_model, status_parts
from edge_agent.contract.base import EventBase, Ref, S

DOC_PREFIX = "#/components/schemas/"
_SIMPLE: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean",
                           type(None): "null"}

# Records named in docs/asyncapi.yaml (a `$ref` there, inline in the stand-alone form).
NAMED_RECORDS: tuple[type, ...] = (status.StopInfo, status.StateFields, status_model.ModelRef,
                                   status_model.ShadowStatus, status_model.ModelStatus,
                                   status_parts.TaskInfo, payloads.TelemetryFields)
_ENVELOPE = frozenset(EventBase.__annotations__)  # set by the hub, not the producer
# A record built on a named one (Python 3.11's TypedDict does not keep its bases).
EXTENDS: dict[type, type] = {status.StatePayload: status.StateFields,
                             status.StatusResult: status.StateFields,
                             payloads.TelemetryPayload: payloads.TelemetryFields}


def is_typeddict(tp: Any) -> bool:
    return isinstance(tp, type) and typing.is_typeddict(tp)


def _describe(text: str | None) -> str | None:
    return " ".join(inspect.cleandoc(text).split()) if text else None


class Gen:
    """One schema build: `doc` True for the document form (with `$ref`s)."""

    def __init__(self, doc: bool) -> None:
        self.doc = doc

    def ref(self, name: str) -> dict[str, Any]:
        return {"$ref": DOC_PREFIX + name}

    def of(self, tp: Any) -> dict[str, Any]:
        meta: list[Any] = []
        while get_origin(tp) is Annotated or get_origin(tp) in (Required, NotRequired):
            if get_origin(tp) is Annotated:
                meta.extend(tp.__metadata__)
                tp = tp.__origin__
            else:
                tp = get_args(tp)[0]
        refs = [m.name for m in meta if isinstance(m, Ref)]
        out = self._nullable(self.ref(refs[0]), tp) if self.doc and refs else self._bare(tp)
        for m in meta:
            if isinstance(m, S) and "$ref" not in out and "anyOf" not in out:
                out.update(m.kw)  # with a Ref, the document's component holds them
        text = " ".join(m for m in meta if isinstance(m, str))
        if text:
            out = {"description": text, **out} if "$ref" not in out else {
                "description": text, "allOf": [out]}
        return out

    def _nullable(self, schema: dict[str, Any], tp: Any) -> dict[str, Any]:
        """`schema` (a `$ref`) or null when `tp` is `X | None`."""
        if type(None) in get_args(tp) and (get_origin(tp) in (Union, types.UnionType)):
            return {"anyOf": [schema, {"type": "null"}]}
        return schema

    def _bare(self, tp: Any) -> dict[str, Any]:
        origin = get_origin(tp)
        if tp is Any:
            return {}
        if tp in _SIMPLE:
            return {"type": _SIMPLE[tp]}
        if origin in (Union, types.UnionType):
            return self._union(get_args(tp))
        if origin is Literal:
            values = [v.value if isinstance(v, enum.Enum) else v for v in get_args(tp)]
            kinds = {_SIMPLE[type(v)] for v in values}
            head = {"type": kinds.pop()} if len(kinds) == 1 else {}
            return {**head, "const": values[0]} if len(values) == 1 else {**head, "enum": values}
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            return {"type": "string", "enum": [m.value for m in tp]}
        if origin in (list, tuple) or tp in (list, tuple):
            args = get_args(tp)
            return {"type": "array", "items": self.of(args[0])} if args else {"type": "array"}
        if origin in (dict, Mapping) or tp is dict:
            args = get_args(tp)
            if not args or args[1] is Any:
                return {"type": "object"}
            return {"type": "object", "additionalProperties": self.of(args[1])}
        if is_typeddict(tp):
            if self.doc and tp in NAMED_RECORDS:
                return self.ref(tp.__name__)
            return self.record(tp)
        raise TypeError(f"no JSON Schema for {tp!r}")

    def _union(self, args: tuple[Any, ...]) -> dict[str, Any]:
        parts = [self.of(a) for a in args]
        # `T | None` with T a plain type (or enum / const): one schema with "null" added.
        if len(parts) == 2 and {"type": "null"} in parts:
            other = parts[0] if parts[1] == {"type": "null"} else parts[1]
            if isinstance(other.get("type"), str) and "$ref" not in other:
                out = {**other, "type": [other["type"], "null"]}
                if "const" in out:
                    out["enum"] = [out.pop("const"), None]
                elif "enum" in out:
                    out["enum"] = [*out["enum"], None]
                return out
            if "const" in other:
                return {"enum": [other["const"], None]}
            if "enum" in other:
                return {"enum": [*other["enum"], None]}
        return {"anyOf": parts}

    def record(self, cls: type) -> dict[str, Any]:
        """A TypedDict's object schema (its fields in definition order, base classes first).

        In the document form, a record built on a named record is `allOf: [base, own fields]`.
        """
        hints = typing.get_type_hints(cls, include_extras=True)
        base = EXTENDS.get(cls)
        if self.doc and base is not None:
            own = {k: v for k, v in hints.items() if k not in base.__annotations__}
            body = self._object(cls, own)
            desc = body.pop("description", None)
            return {**({"description": desc} if desc else {}),
                    "allOf": [self.ref(base.__name__), body]}
        return self._object(cls, hints)

    def _object(self, cls: type, hints: dict[str, Any]) -> dict[str, Any]:
        if cls not in (EventBase, events.EventEnvelope) and hints.keys() >= _ENVELOPE:
            hints = {k: v for k, v in hints.items() if k not in _ENVELOPE}
        required = [k for k in hints if k in cls.__required_keys__]  # type: ignore[attr-defined]
        out: dict[str, Any] = {}
        desc = _describe(cls.__doc__)
        if desc:
            out["description"] = desc
        out["type"] = "object"
        if required:
            out["required"] = required
        out["properties"] = {k: self.of(v) for k, v in hints.items()}
        return out


def doc_schemas() -> dict[str, dict[str, Any]]:
    """docs/asyncapi.yaml's generated `components.schemas` entries, in document order."""
    gen = Gen(doc=True)
    out: dict[str, dict[str, Any]] = {}
    cls: type
    for cls in (status_model.ModelRef, status_model.ShadowStatus, status_model.ModelStatus,
                status_parts.TaskInfo, status.StopInfo, status.StateFields, status.StatePayload,
                status.StatusResult, payloads.ReportPayload, payloads.TelemetryFields,
                payloads.TelemetryPayload):
        out[cls.__name__] = gen.record(cls)
    out["EventPayload"] = any_event_schema(doc=True)
    for cls in event_records().values():
        out[cls.__name__] = gen.record(cls)
    return out


def event_records() -> dict[str, type]:
    """`EventType` value -> its record class."""
    out: dict[str, type] = {}
    for cls in get_args(events.Event):
        tp = typing.get_type_hints(cls)["type"]
        out[get_args(tp)[0].value] = cls
    return out


def event_schema(type_: str) -> dict[str, Any]:
    """One event type's stand-alone schema: the envelope and the type's fields, flattened."""
    gen = Gen(doc=False)
    env, rec = gen.record(events.EventEnvelope), gen.record(event_records()[type_])
    props = {**env["properties"], **rec["properties"]}
    req = list(dict.fromkeys([*env["required"], *rec.get("required", [])]))
    return {"description": rec.get("description", ""), "type": "object", "required": req,
            "properties": props}


def any_event_schema(doc: bool) -> dict[str, Any]:
    """Every event: the envelope, and per type an `if type is X then X's fields`."""
    gen = Gen(doc)
    out = gen.record(events.EventEnvelope)
    rules = []
    for value, cls in event_records().items():
        then = gen.ref(cls.__name__) if doc else _fields_only(gen.record(cls))
        rules.append({"if": {"properties": {"type": {"const": value}}}, "then": then})
    out["allOf"] = rules
    return out


def _fields_only(schema: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schema.items() if k != "description"}


_PAYLOADS: dict[str, type] = {"state": status.StatePayload, "status": status.StatusResult,
                              "report": payloads.ReportPayload,
                              "telemetry": payloads.TelemetryPayload}


def payload_names() -> list[str]:
    return ["event", *_PAYLOADS, *(f"event:{t}" for t in event_records())]


@functools.cache
def _by_name(name: str) -> dict[str, Any]:
    if name == "event":
        return any_event_schema(doc=False)
    if name.startswith("event:"):
        return event_schema(name.removeprefix("event:"))
    if name in _PAYLOADS:
        return Gen(doc=False).record(_PAYLOADS[name])
    for mod in (events, events_more, status, status_model, status_parts, payloads):
        cls = getattr(mod, name, None)
        if is_typeddict(cls):
            return Gen(doc=False).record(typing.cast(type, cls))
    raise KeyError(name)


def schema_by_name(name: str) -> dict[str, Any]:
    import copy

    return copy.deepcopy(_by_name(name))
