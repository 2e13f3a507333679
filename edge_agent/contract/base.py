"""The contract's field annotations: how a record's field carries its description and extra schema.

A field is `Annotated[T, "what it means", S(minimum=0), Ref("TaskId")]`: every `str` in the
metadata is the field's description (joined), `S(...)` adds JSON Schema keywords, `Ref(name)`
makes docs/asyncapi.yaml point at a hand-written shared component (`#/components/schemas/name`)
instead of the inline type (the stand-alone schemas of `schema_for` inline `T`). A record's class
docstring is its schema's description. Nothing here costs anything at run time: the records
are TypedDicts (plain dicts). `EventBase` is what every event record inherits.
"""

# No `from __future__ import annotations`: TypedDict reads NotRequired from live annotations.
from typing import Any, Literal, NotRequired, TypedDict


class S:
    """Extra JSON Schema keywords for one field: `Annotated[int, S(minimum=0)]`."""

    __slots__ = ("kw",)

    def __init__(self, **kw: Any) -> None:
        self.kw = kw

    def __repr__(self) -> str:
        return f"S(**{self.kw!r})"


def values_of(enum_cls: Any) -> S:
    """`S(enum=[...])`: a `str` field that holds one of a StrEnum's values (the stand-alone
    schema lists them; with a `Ref` the document's component does)."""
    return S(enum=[m.value for m in enum_cls])


class Ref:
    """In docs/asyncapi.yaml, the field is `$ref: '#/components/schemas/<name>'`."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"Ref({self.name!r})"


class EventBase(TypedDict):
    """What every record inherits: the envelope, set by the hub (CommsHub.event), the bridge
    (`v`) and the executor's EventLog (`t`), never by a producer (EventEnvelope documents it)."""

    v: NotRequired[Literal[1]]
    ts: NotRequired[float]
    mono: NotRequired[float]
    boot_id: NotRequired[str]
    t: NotRequired[float]
