"""Reads raw TOML values into typed ones by their Spec: kinds, ranges, choices, paths, unknowns.

Used by edge_agent.config.load; every fault raises ConfigError through LoadContext.fail, naming the
dotted key. Paths: `${VAR}` (systemd's directory variables only) and `~` are expanded; relative
paths resolve against the config file's directory, or the working directory for --set values.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from edge_agent.config.checks import LoadContext
from edge_agent.config.schema import SECTIONS, TOP_LEVEL
from edge_agent.config.spec import Secret, Spec
from edge_agent.errors import ConfigError

ENV_VARS = ("CREDENTIALS_DIRECTORY", "STATE_DIRECTORY", "RUNTIME_DIRECTORY",
            "CONFIGURATION_DIRECTORY")


def config_keys() -> list[str]:
    """Every dotted key the schema knows (tables expanded), in declaration order."""
    out = list(TOP_LEVEL)

    def walk(cls: type, prefix: str) -> None:
        for f in fields(cls):
            spec: Spec = f.metadata["spec"]
            if spec.kind == "table" and spec.table is not None:
                walk(spec.table, f"{prefix}{f.name}.")
            else:
                out.append(prefix + f.name)

    for name, cls in SECTIONS.items():
        walk(cls, f"{name}.")
    return out


def read_table(cls: type, table: Mapping[str, Any], prefix: str,
               ctx: LoadContext) -> dict[str, Any]:
    """One section (or sub-table) as a dict of typed values; derived defaults are None."""
    known = {f.name: f for f in fields(cls)}
    for k in table:
        if k not in known:
            raise unknown(prefix + k, table[k], [prefix + n for n in known], ctx)
    out: dict[str, Any] = {}
    for name, f in known.items():
        spec: Spec = f.metadata["spec"]
        key = prefix + name
        if name in table:
            out[name] = convert(spec, table[name], key, ctx)
        elif spec.required:
            raise ctx.fail(key, None, "is required")
        elif spec.kind == "table":
            assert spec.table is not None
            out[name] = read_table(spec.table, {}, f"{key}.", ctx)
        else:
            out[name] = None if spec.derived else f.default
    return out


def convert(spec: Spec, v: Any, key: str, ctx: LoadContext) -> Any:
    """One raw TOML value → its typed value, or ConfigError naming `key`."""
    kind = spec.kind
    shown = (Secret(v) if isinstance(v, str) else Secret("")) if kind == "secret" else v
    if kind == "table":
        if not isinstance(v, Mapping):
            raise ctx.fail(key, v, f"must be a table ([{key}])")
        assert spec.table is not None
        return read_table(spec.table, v, f"{key}.", ctx)
    if kind == "bool":
        if not isinstance(v, bool):
            raise ctx.fail(key, v, "must be true or false")
        return v
    if kind in ("int", "float"):
        if isinstance(v, bool) or not isinstance(v, int | float) or (
                kind == "int" and not isinstance(v, int)):
            raise ctx.fail(key, v, "must be an integer" if kind == "int" else "must be a number")
        if not math.isfinite(v):
            raise ctx.fail(key, v, "must be finite")
        _range(spec, v, key, ctx)
        return v if kind == "int" else float(v)
    if kind == "strlist":
        if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
            raise ctx.fail(key, v, "must be a non-empty list of strings")
        for x in v:
            _choice(spec, x, key, v, ctx)
        if len(set(v)) != len(v):
            raise ctx.fail(key, v, "lists an entry twice")
        return tuple(v)
    if not isinstance(v, str):
        quoted = " (" + " or ".join(f'"{c}"' for c in spec.choices) + ")" if spec.choices else ""
        raise ctx.fail(key, shown, f"must be a string{quoted}")
    if not v:
        raise ctx.fail(key, shown, "must not be empty")
    if kind == "path":
        return _path(spec, v, key, ctx)
    if key == "log.level":
        v = v.lower()
    _choice(spec, v, key, v, ctx)
    if spec.pattern is not None and not re.fullmatch(spec.pattern, v):
        raise ctx.fail(key, shown, f"must be {spec.hint}" if spec.hint else "has a bad format")
    return Secret(v) if kind == "secret" else v


def _range(spec: Spec, v: float, key: str, ctx: LoadContext) -> None:
    lo_bad = spec.lo is not None and (v < spec.lo or (spec.lo_open and v == spec.lo))
    hi_bad = spec.hi is not None and v > spec.hi
    if lo_bad or hi_bad:
        parts = []
        if spec.lo is not None:
            parts.append(f"{'>' if spec.lo_open else '>='} {_num(spec.lo)}")
        if spec.hi is not None:
            parts.append(f"<= {_num(spec.hi)}")
        why = f"must be {' and '.join(parts)}"
        raise ctx.fail(key, v, f"{why} ({spec.hint})" if spec.hint else why)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def _choice(spec: Spec, v: str, key: str, shown: object, ctx: LoadContext) -> None:
    if spec.choices and v not in spec.choices:
        import difflib

        close = difflib.get_close_matches(v, spec.choices, n=1)
        why = "must be one of " + ", ".join(f'"{c}"' for c in spec.choices)
        raise ctx.fail(key, shown, f"{why}; did you mean {close[0]}?" if close else why)


def _path(spec: Spec, text: str, key: str, ctx: LoadContext) -> Path:
    def env(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in ENV_VARS:
            raise ctx.fail(key, text, f"${name}: only {', '.join(ENV_VARS)} are expanded")
        if not os.environ.get(name):
            raise ctx.fail(key, text, f"${name} is not set (systemd sets it for the service)")
        return os.environ[name]

    expanded = re.sub(r"\$\{(\w+)\}|\$(\w+)", env, text)
    p = Path(expanded).expanduser()
    if not p.is_absolute():
        p = (ctx.cwd if key in ctx.overridden else ctx.base_dir) / p
    p = Path(os.path.normpath(p))
    if spec.exists == "file" and not p.is_file():
        why = "is not a regular file" if p.exists() else "file not found"
        raise ctx.fail(key, text, f"{why} ({p})")
    if spec.exists == "dir" and p.exists() and not p.is_dir():
        raise ctx.fail(key, text, f"exists but is not a directory ({p})")
    return p


def unknown(key: str, value: Any, known: list[str], ctx: LoadContext) -> ConfigError:
    """ConfigError for a key the schema lacks, with a did-you-mean among `known` dotted keys."""
    import difflib

    prefix, _, leaf = key.rpartition(".")
    is_table = isinstance(value, Mapping)
    cands = [k for k in known if (k in _table_keys()) == is_table]
    siblings = {k.rpartition(".")[2]: k for k in cands if k.rpartition(".")[0] == prefix}
    close = [siblings[m] for m in difflib.get_close_matches(leaf, list(siblings), n=1)]
    close = close or difflib.get_close_matches(key, cands, n=1, cutoff=0.85)
    close = close or [k for k in config_keys() if k.rpartition(".")[2] == leaf and k != key]
    what = "unknown section" if is_table else "unknown key"
    if close:
        what += f"; did you mean {' or '.join(close)}?"
    if prefix and leaf in TOP_LEVEL:
        what += " (top-level keys must come before the first [section])"
    # Never the value of an unknown key: a misspelt `pasword` holds a password.
    shown: object = Elided() if is_table else Secret("")
    return ctx.fail(key, shown, what)


def _table_keys() -> set[str]:
    out = set(SECTIONS)
    for name, cls in SECTIONS.items():
        out.update(f"{name}.{f.name}" for f in fields(cls) if f.metadata["spec"].kind == "table")
    return out


class Elided:
    """Stands in for a table's contents in an error message."""

    def __repr__(self) -> str:
        return "{...}"
