"""Command payloads: decoding with size/depth limits and a hand-written validator per command.

Every error names the field and the problem (`params.object: expected 3 numbers, got 2`). The
envelope is `{"v": 1, "id": "<1..128 chars>", "expires_at"?: <unix s>, "ts"?: <unix s>, ...args}`
(`ts`: when the publisher sent it, by its clock; see commands/freshness.py); unknown fields
are refused so that a typo (`ttl_msec`) never silently becomes a default.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edge_agent.commands.codes import PROTOCOL_VERSION
from edge_agent.vocab import ErrorCode

COMMANDS = (
    "task.start", "task.cancel", "resume", "reset", "estop", "manual.enter", "manual.jog",
    "manual.exit", "status", "model.update", "failure.inject", "journal.label", "model.shadow",
    "record.start", "record.stop",
)
ENVELOPE = frozenset({"v", "id", "expires_at", "ts"})
JOG_TTL_MAX_MS = 200
FAILURE_MODES: Mapping[str, tuple[str, ...]] = {
    "sensor": ("dropout", "stuck", "noise", "spikes"),
    "gripper": ("weak_close", "slip"),
    "collision": ("impact",),
    "link": ("corrupt", "unplug"),
    "gpu": ("fail",),
    "model": ("slow",),  # the local model's session runs latency_ms slower (the ORT seam)
    "triton": ("down",),
    "estop": ("press", "release"),
    "control_loop": ("hang", "release"),  # the daemon's own control thread (watchdog tests)
}
_ID_RE = re.compile(r'"id"\s*:\s*"([^"\\\x00-\x1f]{1,128})"')
_CHANNEL_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")
_RECORD_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")
_SHA256_RE = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Limits:
    max_bytes: int = 64 * 1024
    max_depth: int = 8
    max_id_len: int = 128


@dataclass(frozen=True)
class ParsedCommand:
    id: str
    args: dict[str, Any]
    expires_at: float | None  # wall-clock unix seconds, from the payload
    ts: float | None = None  # when the publisher sent it (unix seconds, its clock)


class PayloadError(Exception):
    """A payload was refused; `command_id` is the id when one could be recovered."""

    def __init__(self, code: ErrorCode, message: str, command_id: str | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.command_id = command_id


def recover_id(text: str | bytes | bytearray) -> str | None:
    """Best effort: the id of a payload that could not be decoded, for the error reply."""
    if not isinstance(text, str):
        text = bytes(text[:4096]).decode("utf-8", "replace")
    m = _ID_RE.search(text[:4096])
    return m.group(1) if m else None


def _reject_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def decode(raw: bytes | bytearray | str | Mapping[str, Any], limits: Limits) -> dict[str, Any]:
    """Bytes/str/mapping → a JSON object within the limits; raises PayloadError."""
    if isinstance(raw, Mapping):
        obj: object = dict(raw)
    else:
        size = len(raw.encode("utf-8", "surrogatepass") if isinstance(raw, str) else raw)
        if size > limits.max_bytes:
            raise PayloadError(ErrorCode.TOO_LARGE,
                               f"payload is {size} bytes, limit {limits.max_bytes}",
                               recover_id(raw[:4096]))
        try:
            text = raw if isinstance(raw, str) else bytes(raw).decode("utf-8")
            obj = json.loads(text, parse_constant=_reject_constant)
        except RecursionError:
            raise PayloadError(ErrorCode.TOO_DEEP, f"nesting deeper than {limits.max_depth}",
                               recover_id(raw)) from None
        except (ValueError, UnicodeError) as exc:
            raise PayloadError(ErrorCode.BAD_JSON, f"not JSON: {exc}", recover_id(raw)) from None
    if not isinstance(obj, dict):
        raise PayloadError(ErrorCode.NOT_OBJECT, f"expected a JSON object, got {_kind(obj)}")
    depth = _depth(obj, limits.max_depth)
    if depth > limits.max_depth:
        raise PayloadError(ErrorCode.TOO_DEEP, f"nesting deeper than {limits.max_depth}",
                           _valid_id(obj.get("id"), limits))
    return obj


def _depth(obj: object, limit: int) -> int:
    """Nesting depth of containers, stopping early past `limit` (iterative: no recursion)."""
    deepest = 0
    stack: list[tuple[object, int]] = [(obj, 1)]
    while stack:
        node, d = stack.pop()
        if isinstance(node, dict | list | tuple):
            deepest = max(deepest, d)
            if deepest > limit:
                return deepest
            children = node.values() if isinstance(node, dict) else node
            stack.extend((c, d + 1) for c in children)
    return deepest


def _kind(obj: object) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    for t, n in names.items():
        if type(obj) is t:
            return n
    return "number" if isinstance(obj, int | float) else type(obj).__name__


def _valid_id(raw: object, limits: Limits) -> str | None:
    if (isinstance(raw, str) and 1 <= len(raw) <= limits.max_id_len
            and not any(ord(c) < 32 or ord(c) == 127 for c in raw)):
        return raw
    return None


def parse(name: str, obj: Mapping[str, Any], limits: Limits) -> ParsedCommand:
    """Validate the envelope and the arguments of command `name`; raises PayloadError."""
    raw_id = obj.get("id")
    if raw_id is None:
        raise PayloadError(ErrorCode.MISSING_ID, "id: missing (a string of 1..128 characters)")
    command_id = _valid_id(raw_id, limits)
    if command_id is None:
        raise PayloadError(ErrorCode.BAD_ID, f"id: expected a string of 1..{limits.max_id_len} "
                           f"printable characters, got {_kind(raw_id)} {_short(raw_id)}")
    v = obj.get("v")
    if type(v) is not int or v != PROTOCOL_VERSION:
        raise PayloadError(ErrorCode.BAD_VERSION,
                           f"v: expected {PROTOCOL_VERSION}, got {_short(v)}", command_id)
    validator = VALIDATORS.get(name)
    if validator is None:
        raise PayloadError(ErrorCode.UNKNOWN_COMMAND, f"unknown command {name!r}", command_id)
    try:
        expires_at = _number(obj, "expires_at", "", lo=0.0, hi=1e11)
        ts = _number(obj, "ts", "", lo=0.0, hi=1e11)
        args = validator({k: val for k, val in obj.items() if k not in ENVELOPE})
    except _Bad as exc:
        raise PayloadError(ErrorCode.BAD_ARGS, str(exc), command_id) from None
    return ParsedCommand(command_id, args, expires_at, ts)


class _Bad(Exception):
    pass


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _at(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _keys(obj: Mapping[Any, Any], allowed: frozenset[str], path: str) -> None:
    for key in obj:
        if key not in allowed:
            where = f"{path}: " if path else ""
            raise _Bad(f"{where}unknown field {_short(key)} (allowed: {', '.join(sorted(allowed))})"
                       if allowed else f"{where}unknown field {_short(key)} (takes no arguments)")


def _string(obj: Mapping[str, Any], key: str, path: str, *, required: bool = False,
            max_len: int = 256, pattern: re.Pattern[str] | None = None,
            choices: tuple[str, ...] | None = None) -> str | None:
    where = _at(path, key)
    if key not in obj:
        if required:
            raise _Bad(f"{where}: missing")
        return None
    val = obj[key]
    if not isinstance(val, str):
        raise _Bad(f"{where}: expected a string, got {_kind(val)}")
    if not 1 <= len(val) <= max_len:
        raise _Bad(f"{where}: expected 1..{max_len} characters, got {len(val)}")
    if choices is not None and val not in choices:
        raise _Bad(f"{where}: expected one of {', '.join(choices)}, got {_short(val)}")
    if pattern is not None and not pattern.fullmatch(val):
        raise _Bad(f"{where}: {_short(val)} does not match {pattern.pattern}")
    return val


def _bool(obj: Mapping[str, Any], key: str, path: str) -> bool | None:
    if key not in obj:
        return None
    val = obj[key]
    if not isinstance(val, bool):
        raise _Bad(f"{_at(path, key)}: expected true or false, got {_kind(val)}")
    return val


def _number(obj: Mapping[str, Any], key: str, path: str, *, lo: float, hi: float,
            required: bool = False, integer: bool = False) -> Any:
    where = _at(path, key)
    if key not in obj:
        if required:
            raise _Bad(f"{where}: missing")
        return None
    val = obj[key]
    kind = "an integer" if integer else "a number"
    if isinstance(val, bool) or not isinstance(val, int | float) or (integer and
                                                                      not isinstance(val, int)):
        raise _Bad(f"{where}: expected {kind}, got {_kind(val)}")
    if not math.isfinite(val) or not lo <= val <= hi:
        raise _Bad(f"{where}: expected {kind} in [{lo:g}, {hi:g}], got {_short(val)}")
    return val


def _vector(obj: Mapping[str, Any], key: str, path: str, *, n_min: int, n_max: int, bound: float,
            required: bool = False) -> list[float] | None:
    where = _at(path, key)
    if key not in obj:
        if required:
            raise _Bad(f"{where}: missing")
        return None
    val = obj[key]
    count = f"{n_min}" if n_min == n_max else f"{n_min}..{n_max}"
    if not isinstance(val, list):
        raise _Bad(f"{where}: expected {count} numbers, got {_kind(val)}")
    if not n_min <= len(val) <= n_max:
        raise _Bad(f"{where}: expected {count} numbers, got {len(val)}")
    for i, x in enumerate(val):
        if isinstance(x, bool) or not isinstance(x, int | float) or not math.isfinite(x):
            raise _Bad(f"{where}[{i}]: expected a finite number, got {_short(x)}")
        if abs(x) > bound:
            raise _Bad(f"{where}[{i}]: |{x:g}| exceeds {bound:g}")
    return [float(x) for x in val]


def _object(obj: Mapping[str, Any], key: str, path: str) -> dict[str, Any] | None:
    if key not in obj:
        return None
    val = obj[key]
    if not isinstance(val, dict):
        raise _Bad(f"{_at(path, key)}: expected an object, got {_kind(val)}")
    return val


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


def _only_reason(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset({"reason"}), "")
    return _drop_none({"reason": _string(a, "reason", "")})


def _no_args(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset(), "")
    return {}


def _task_start(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset({"task", "params"}), "")
    task = _string(a, "task", "", choices=("pick_place",)) or "pick_place"
    out: dict[str, Any] = {"task": task}
    params = _object(a, "params", "")
    if params is not None:
        _keys(params, frozenset({"object", "place"}), "params")
        out["params"] = _drop_none({
            k: _vector(params, k, "params", n_min=3, n_max=3, bound=10.0)
            for k in ("object", "place")})
    return out


def _task_cancel(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset({"task_id", "reason"}), "")
    return _drop_none({"task_id": _string(a, "task_id", "", max_len=128),
                       "reason": _string(a, "reason", "")})


def _resume(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset({"task_id"}), "")
    # no task_id: the single saved task (the executor keeps at most one; it names it on a mismatch)
    return _drop_none({"task_id": _string(a, "task_id", "", max_len=128)})


def _jog(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset({"ttl_ms", "dq", "gripper", "seq"}), "")
    return _drop_none({
        "ttl_ms": _number(a, "ttl_ms", "", lo=1, hi=JOG_TTL_MAX_MS, required=True, integer=True),
        "dq": _vector(a, "dq", "", n_min=1, n_max=16, bound=10.0, required=True),
        "gripper": _number(a, "gripper", "", lo=-1.0, hi=1.0),
        "seq": _number(a, "seq", "", lo=0, hi=2**53, integer=True),
    })


def _model_update(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset({"uri", "sha256", "version", "allow_bad"}), "")
    return _drop_none({
        "uri": _string(a, "uri", "", required=True, max_len=1024),
        "sha256": _string(a, "sha256", "", required=True, pattern=_SHA256_RE),
        "version": _string(a, "version", "", max_len=64),
        "allow_bad": _bool(a, "allow_bad", ""),
    })


def _model_shadow(a: dict[str, Any]) -> dict[str, Any]:
    """`{"uri", "sha256", "version"?}` starts a shadow, `{"stop": true}` stops it."""
    _keys(a, frozenset({"uri", "sha256", "version", "stop"}), "")
    if "stop" in a:
        if a["stop"] is not True:
            raise _Bad(f"stop: expected true, got {_short(a['stop'])}")
        extra = sorted(k for k in a if k != "stop")
        if extra:
            raise _Bad(f"stop: give it alone (not with {', '.join(extra)})")
        return {"stop": True}
    if "uri" not in a:
        raise _Bad('uri: required to start a shadow (or {"stop": true} to stop one)')
    return _model_update(a)


def _failure_inject(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset({"target", "mode", "duration_s", "severity", "latency_ms"}), "")
    target = _string(a, "target", "", required=True, max_len=64)
    assert target is not None
    family, colon, channel = target.partition(":")
    if family not in FAILURE_MODES or (family == "sensor") != bool(channel) or (
            colon and not channel):
        raise _Bad(f"target: expected sensor:<channel> or one of "
                   f"{', '.join(k for k in FAILURE_MODES if k != 'sensor')}, got {_short(target)}")
    if channel and not _CHANNEL_RE.fullmatch(channel):
        raise _Bad(f"target: channel {_short(channel)} does not match {_CHANNEL_RE.pattern}")
    mode = _string(a, "mode", "", required=True, choices=FAILURE_MODES[family])
    return _drop_none({
        "target": target, "mode": mode,
        "duration_s": _number(a, "duration_s", "", lo=0.0, hi=3600.0),
        "severity": _number(a, "severity", "", lo=0.0, hi=1.0),
        "latency_ms": _number(a, "latency_ms", "", lo=0.0, hi=1000.0),
    })


def _journal_label(a: dict[str, Any]) -> dict[str, Any]:
    # bounds as store/labels.py's (the label file checks them again, and the task id)
    _keys(a, frozenset({"task_id", "verdict", "note", "step"}), "")
    return _drop_none({
        "task_id": _string(a, "task_id", "", required=True, max_len=128),
        "verdict": _string(a, "verdict", "", required=True,
                           choices=("correct", "wrong", "needs_work")),
        "note": _string(a, "note", "", max_len=280),
        "step": _number(a, "step", "", lo=0, hi=2**31, integer=True),
    })


def _record_start(a: dict[str, Any]) -> dict[str, Any]:
    _keys(a, frozenset({"name"}), "")  # the file's name part (the flight recorder)
    return _drop_none({"name": _string(a, "name", "", max_len=40, pattern=_RECORD_NAME)})


VALIDATORS: Mapping[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "task.start": _task_start,
    "task.cancel": _task_cancel,
    "resume": _resume,
    "reset": _only_reason,
    "estop": _only_reason,
    "manual.enter": _only_reason,
    "manual.jog": _jog,
    "manual.exit": _no_args,
    "status": _no_args,
    "model.update": _model_update,
    "failure.inject": _failure_inject,
    "journal.label": _journal_label,
    "model.shadow": _model_shadow,
    "record.start": _record_start,
    "record.stop": _no_args,
}
assert set(VALIDATORS) == set(COMMANDS)
