"""How a configuration key is declared: its `Spec` (kind, limits, why), `opt()` (a dataclass
field carrying the Spec) and `Secret` (a value whose repr is '***'). schema.py declares the keys.
"""

from __future__ import annotations

import hashlib
import hmac
from dataclasses import field
from typing import Any, Literal

Kind = Literal["bool", "int", "float", "str", "path", "secret", "strlist", "table"]
Exists = Literal["", "file", "dir"]


class Secret:
    """A secret string (a password, a webhook URL with a token): repr and str are '***'."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        """The secret itself: call it only where it is handed to the library that needs it."""
        return self._value

    def digest(self) -> str:
        """sha256 hex of the secret (what the config hash sees instead of the secret)."""
        return hashlib.sha256(b"edge-agent secret\0" + self._value.encode()).hexdigest()

    def __repr__(self) -> str:
        return "***"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash(("Secret", self._value))


class Spec:
    """How one key is read: its kind, whether it is required, its limits and why they exist.

    A plain class, not a dataclass: every dataclass costs ~1 ms of start-up on a slow CPU.
    """

    __slots__ = ("choices", "derived", "exists", "hi", "hint", "kind", "lo", "lo_open",
                 "pattern", "required", "table")

    def __init__(self, kind: Kind, *, required: bool = False, lo: float | None = None,
                 hi: float | None = None, lo_open: bool = False, choices: tuple[str, ...] = (),
                 pattern: str | None = None, hint: str = "", exists: Exists = "",
                 derived: str = "", table: type | None = None) -> None:
        self.kind = kind
        self.required = required
        self.lo, self.hi, self.lo_open = lo, hi, lo_open
        self.choices = choices
        self.pattern = pattern  # the whole string must match (re.fullmatch)
        self.hint = hint  # appended to range / pattern errors: why the limit exists
        self.exists = exists  # "file": a regular file; "dir": a directory if present
        self.derived = derived  # the default is computed from other keys (documented here)
        self.table = table

    def __repr__(self) -> str:
        return f"Spec({self.kind!r}, required={self.required})"


def opt(kind: Kind, default: Any = None, **kw: Any) -> Any:
    """A dataclass field with its Spec in the metadata."""
    spec = Spec(kind, **kw)
    if kind == "table":
        assert spec.table is not None
        return field(default_factory=spec.table, metadata={"spec": spec})
    return field(default=default, metadata={"spec": spec})


def secs(default: float) -> Any:
    """A duration in seconds: positive, at most an hour."""
    return opt("float", default, lo=0.0, lo_open=True, hi=3600.0)
