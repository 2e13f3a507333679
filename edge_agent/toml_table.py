"""Typed, validated access to one parsed TOML table: every bad value a ConfigError naming the key
(with its table path), the value and why; an unknown key suggests the closest known one."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from edge_agent.errors import ConfigError


class TableReader:
    """Typed access to one TOML table that remembers which keys were used (unknown = error)."""

    def __init__(self, table: Mapping[str, Any], prefix: str, source: str) -> None:
        self.t = table
        self.prefix = prefix
        self.source = source
        self.used: set[str] = set()

    def key(self, k: str) -> str:
        return f"{self.prefix}{k}"

    def fail(self, k: str, v: object, why: str) -> ConfigError:
        return ConfigError(self.key(k), v, why, self.source)

    def raw(self, k: str, default: Any = ...) -> Any:
        self.used.add(k)
        if k not in self.t:
            if default is ...:
                typo = _close(k, [x for x in self.t if x not in self.used])
                raise self.fail(k, None, f"is required; is {self.key(typo)!r} a typo?" if typo
                                else "is required")
            return default
        return self.t[k]

    def num(self, k: str, default: Any = ..., *, lo: float | None = None,
            hi: float | None = None, lo_open: bool = False) -> float:
        v = self.raw(k, default)
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise self.fail(k, v, "must be a number")
        f = float(v)
        if not math.isfinite(f):
            raise self.fail(k, v, "must be finite")
        if lo is not None and (f < lo or (lo_open and f == lo)):
            raise self.fail(k, v, f"must be {'>' if lo_open else '>='} {lo}")
        if hi is not None and f > hi:
            raise self.fail(k, v, f"must be <= {hi}")
        return f

    def text(self, k: str, default: Any = ..., choices: tuple[str, ...] | None = None) -> str:
        v = self.raw(k, default)
        if not isinstance(v, str) or not v:
            raise self.fail(k, v, "must be a non-empty string")
        if choices is not None and v not in choices:
            raise self.fail(k, v, f"must be one of {', '.join(choices)}")
        return v

    def vec3(self, k: str, default: Any = ...) -> tuple[float, float, float]:
        v = self.raw(k, default)
        if (not isinstance(v, list) or len(v) != 3
                or not all(isinstance(x, int | float) and not isinstance(x, bool) for x in v)
                or not all(math.isfinite(float(x)) for x in v)):
            raise self.fail(k, v, "must be a list of 3 finite numbers")
        return (float(v[0]), float(v[1]), float(v[2]))

    def table(self, k: str) -> TableReader:
        v = self.raw(k)
        if not isinstance(v, Mapping):
            raise self.fail(k, v, "must be a table")
        return TableReader(v, f"{self.key(k)}.", self.source)

    def tables(self, k: str) -> list[TableReader]:
        v = self.raw(k)
        if not isinstance(v, list) or not v or not all(isinstance(x, Mapping) for x in v):
            raise self.fail(k, v, "must be a non-empty array of tables")
        return [TableReader(x, f"{self.key(k)}[{i}].", self.source) for i, x in enumerate(v)]

    def integer(self, k: str, default: Any = ..., *, lo: int, hi: int) -> int:
        v = self.raw(k, default)
        if isinstance(v, bool) or not isinstance(v, int):
            raise self.fail(k, v, "must be an integer")
        if not lo <= v <= hi:
            raise self.fail(k, v, f"must be >= {lo} and <= {hi}")
        return v

    def done(self) -> None:
        unknown = sorted(set(self.t) - self.used)
        if unknown:
            k = unknown[0]
            close = _close(k, sorted(self.used))
            why = f"unknown key; did you mean {self.key(close)}?" if close else "unknown key"
            raise self.fail(k, "{...}" if isinstance(self.t[k], Mapping) else self.t[k], why)


def _close(word: str, candidates: list[str]) -> str | None:
    import difflib

    found = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return found[0] if found else None
