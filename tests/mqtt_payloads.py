"""Test helper: a seeded generator of command payloads — valid, almost valid, and garbage.

Used by tests/test_mqtt_fuzz.py (payloads into a running daemon) and tests/test_asyncapi.py
(the documented JSON schemas and the code's validators must agree on every generated object).
Each fuzz payload records whether the protocol promises a reply to it (`expects_reply`): a JSON
object with a valid `id`, or undecodable text that starts with a recoverable `"id"`.
"""

from __future__ import annotations

import json
import random
import string
from dataclasses import dataclass
from typing import Any

COMMANDS = ("task.start", "task.cancel", "resume", "reset", "estop", "manual.enter",
            "manual.jog", "manual.exit", "status", "model.update", "failure.inject",
            "journal.label", "model.shadow")
EXTRA_TOPICS = ("bogus", "task.stop", "Status")  # unknown command names (unknown_command)
_FAILURES = {
    "sensor:wrist_force": ("dropout", "stuck", "noise", "spikes"),
    "sensor:object_pose": ("dropout", "noise"),
    "gripper": ("weak_close", "slip"),
    "collision": ("impact",),
    "link": ("corrupt",),
    "gpu": ("fail",),
    "triton": ("down",),
    "estop": ("press", "release"),
}


def _vec(rng: random.Random, n: int = 3, bound: float = 0.8) -> list[float]:
    return [round(rng.uniform(-bound, bound), 4) for _ in range(n)]


def valid_args(name: str, rng: random.Random) -> dict[str, Any]:
    """Arguments that the command's validator accepts (optional fields sometimes present)."""
    coin = rng.random
    out: dict[str, Any] = {}
    if name == "task.start":
        if coin() < 0.5:
            out["task"] = "pick_place"
        if coin() < 0.5:
            out["params"] = {k: _vec(rng) for k in ("object", "place") if coin() < 0.7}
    elif name == "task.cancel":
        if coin() < 0.4:
            out["task_id"] = f"t-{rng.randrange(1000)}"
        if coin() < 0.3:
            out["reason"] = "operator"
    elif name == "resume":
        out["task_id"] = f"t-{rng.randrange(1000)}"
    elif name in ("reset", "estop", "manual.enter"):
        if coin() < 0.3:
            out["reason"] = rng.choice(["fuzz", "x" * 256, "é✓"])
    elif name == "manual.jog":
        out["ttl_ms"] = rng.randint(1, 200)
        out["dq"] = _vec(rng, rng.randint(1, 6), 1.0)
        if coin() < 0.3:
            out["gripper"] = round(rng.uniform(-1, 1), 3)
        if coin() < 0.3:
            out["seq"] = rng.randrange(2**53)
    elif name == "model.update":
        out["uri"] = rng.choice(["file:///nonexistent/policy.onnx", "https://models.invalid/p"])
        out["sha256"] = "".join(rng.choice("0123456789abcdef") for _ in range(64))
        if coin() < 0.5:
            out["version"] = "1.2.3"
    elif name == "model.shadow":
        if coin() < 0.3:
            out["stop"] = True
        else:
            out["uri"] = rng.choice(["file:///nonexistent/c.onnx", "https://models.invalid/c"])
            out["sha256"] = "".join(rng.choice("0123456789abcdef") for _ in range(64))
    elif name == "record.start":
        if coin() < 0.5:
            out["name"] = rng.choice(["probe", "a" * 40, "before-fix_2"])
    elif name == "journal.label":
        out["task_id"] = f"t-{rng.randrange(1000)}"
        out["verdict"] = rng.choice(("correct", "wrong", "needs_work"))
        if coin() < 0.5:
            out["note"] = rng.choice(["late grip", "n" * 280, "é✓"])
        if coin() < 0.5:
            out["step"] = rng.randrange(500)
    elif name == "failure.inject":
        target = rng.choice(list(_FAILURES))
        out["target"] = target
        out["mode"] = rng.choice(_FAILURES[target])
        out["duration_s"] = round(rng.uniform(0.0, 0.3), 3)  # short: the rig heals at once
        if coin() < 0.3:
            out["severity"] = round(rng.random(), 3)
    return out


_BAD_VALUES: tuple[Any, ...] = (
    None, True, False, 0, -1, 1.0, 5.0, 1e308, -1e308, 201, 2**64, "", "x" * 300, "5",
    [], [1, 2], [1, 2, 3, 4], ["a", 1, 2], {}, {"a": 1}, [[1], [2], [3]], 0.5, -0.5, 11.0,
    "pick_place", "sensor:", "sensor:X", "GPU", "\x00", "ümlaut",
)
_BAD_IDS: tuple[Any, ...] = ("", "x" * 129, "a\nb", "tab\there", "\x7f", 123, None, [], {},
                             True, 1.5)


_R, _H = "r" * 256, "0123456789abcdef" * 4
# Values at and just past each field's documented limits (the schema and the code must agree).
BOUNDARY: dict[str, tuple[Any, ...]] = {
    "task": ("pick_place", "pick", "", None),
    "params": ({"object": [10, -10, 10.0]}, {"object": [10.001, 0, 0]}, {"place": [0, 0]},
               {"place": [0, 0, 0, 0]}, {"other": [0, 0, 0]}, {}, {"object": [0, 0, True]}),
    "task_id": ("t" * 128, "t" * 129, "", "t"),
    "reason": (_R, _R + "r", "", "r"),
    "ttl_ms": (0, 1, 200, 201, 250, 200.0, 1.5, -1),
    "dq": ([10.0], [10.01], [-10], [0.0] * 16, [0.0] * 17, [], [0, "1"]),
    "gripper": (-1, 1, 1.01, -1.01, 0),
    "seq": (0, -1, 2**53, 2**53 + 1, 1.0),
    "uri": ("u" * 1024, "u" * 1025, ""),
    "sha256": (_H, _H.upper(), _H[:-1], _H + "0", "g" * 64),
    "version": ("v" * 64, "v" * 65, ""),
    "target": ("sensor:a", "sensor:" + "a" * 32, "sensor:" + "a" * 33, "sensor:1a", "sensor:a-b",
               "x" * 65, "link", "estop", "sensor:wrist_force", "SENSOR:a"),
    "mode": ("press", "release", "unplug", "dropout", "impact", "slip", "fail", "down", "PRESS"),
    "duration_s": (0, 3600, 3600.1, -0.1, 0.5),
    "severity": (0, 1, 1.1, -0.01, 0.5),
    "verdict": ("correct", "wrong", "needs_work", "Correct", "", "ok"),
    "note": ("n" * 280, "n" * 281, "", "n"),
    "name": ("a", "a" * 40, "a" * 41, "", "A", "-a", "a b", "0_x-y"),
    "step": (0, -1, 2**31, 2**31 + 1, 1.0, True),
    "expires_at": (0, 1e11, 1e11 + 1, -0.001, 4e9),
    "ts": (0, 1e11, 1e11 + 1, -0.001, 1.7e9, "now"),
    "id": ("i" * 128, "i" * 129, "ok"),
}


def mutate(obj: dict[str, Any], rng: random.Random, keys: tuple[str, ...]) -> dict[str, Any]:
    """One or two small changes that usually (not always) make the payload invalid."""
    out = dict(obj)
    for _ in range(rng.choice((1, 1, 2))):
        op = rng.randrange(10)
        if op == 9:
            key = rng.choice((*keys, "expires_at", "id"))
            out[key] = rng.choice(BOUNDARY.get(key, _BAD_VALUES))
        elif op == 0 and out:
            out.pop(rng.choice(list(out)))
        elif op == 1:
            out[rng.choice(("ttl_msec", "extra", "Task", "ID", "params2", ""))] = 1
        elif op == 2:
            out["id"] = rng.choice(_BAD_IDS)
        elif op == 3:
            out["v"] = rng.choice((0, 2, "1", 1.0, True, None, -1))
        elif op == 4:
            out["expires_at"] = rng.choice((0, 1.0, -5, 2e11, "soon", None, True, 1e10))
        else:
            out[rng.choice(keys)] = rng.choice(_BAD_VALUES)
    return out


ARG_KEYS: dict[str, tuple[str, ...]] = {
    "task.start": ("task", "params"), "task.cancel": ("task_id", "reason"),
    "resume": ("task_id",), "reset": ("reason",), "estop": ("reason",),
    "manual.enter": ("reason",), "manual.jog": ("ttl_ms", "dq", "gripper", "seq"),
    "manual.exit": ("reason",), "status": ("reason",),
    "model.update": ("uri", "sha256", "version"),
    "failure.inject": ("target", "mode", "duration_s", "severity"),
    "journal.label": ("task_id", "verdict", "note", "step"),
    "model.shadow": ("uri", "sha256", "version", "stop"),
    "record.start": ("name",),
    "record.stop": ("reason",),
}


def command_object(name: str, rng: random.Random, command_id: str) -> dict[str, Any]:
    """A JSON object for command `name`: valid about half the time, else mutated."""
    obj: dict[str, Any] = {"v": 1, "id": command_id, **valid_args(name, rng)}
    if rng.random() < 0.5:
        obj = mutate(obj, rng, ARG_KEYS.get(name, ("reason",)))
    return obj


@dataclass(frozen=True)
class FuzzMessage:
    topic_name: str  # the command name used as the topic's last level
    payload: bytes
    id: str  # the unique id embedded (if any)
    expects_reply: bool  # the protocol promises a reply carrying `id`


def _garbage(rng: random.Random, cid: str) -> tuple[bytes, bool]:
    """Undecodable or non-object payloads; True when a reply is promised (id recoverable)."""
    head = json.dumps({"id": cid, "v": 1})[:-1]  # '{"id": "...", "v": 1' (unterminated)
    kind = rng.randrange(12)
    if kind == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200))), False
    if kind == 1:
        return (head + rng.choice((",", ", \"x\":", "}}", ", [", ", NaN}"))).encode(), True
    if kind == 2:
        return b"", False
    if kind == 3:
        return json.dumps(rng.choice(([1, 2], 3, "str", None, True, [{"id": cid}]))).encode(), False
    if kind == 4:
        depth = rng.randint(9, 40)
        return ('{"v": 1, "id": "' + cid + '", "a": ' + "[" * depth + "]" * depth
                + "}").encode(), True
    if kind == 5:
        return (head + ', "x": "' + "\\ud800" + '"}').encode(), True  # lone surrogate escape
    if kind == 6:
        return (head + "}").encode("utf-8") + b"\xff\xfe", True  # invalid UTF-8 after the id
    if kind == 7:
        return (json.dumps({"v": 1, "id": cid, "reason": "big"})[:-1] + ', "pad": "'
                + "p" * 70000 + '"}').encode(), True  # too large, id at the start
    if kind == 8:
        return ('{"v": 1, "id": "' + cid + '", "ttl_ms": Infinity}').encode(), True
    if kind == 9:
        text = "".join(rng.choice(string.printable) for _ in range(rng.randrange(80)))
        return text.encode(), False
    if kind == 10:
        return ('{"v":1,"id":"' + cid + '","id":"' + cid + '"}').encode(), True  # duplicate key
    return json.dumps({"v": 1, "reason": "no id"}).encode(), False


def fuzz_message(i: int, rng: random.Random, prefix: str = "fz") -> FuzzMessage:
    """Message number `i` of a fuzz run: a topic and a payload (ids are unique per `i`)."""
    cid = f"{prefix}-{i}"
    name = rng.choice(COMMANDS) if rng.random() < 0.95 else rng.choice(EXTRA_TOPICS)
    if rng.random() < 0.2:
        payload, promised = _garbage(rng, cid)
        return FuzzMessage(name, payload, cid, promised)
    obj = command_object(name if name in ARG_KEYS else "status", rng, cid)
    promised = obj.get("id") == cid
    if not promised and isinstance(obj.get("id"), str):
        # a mutated id that is still a valid id is answered under that id: make it unique too
        bad = obj["id"]
        promised = 1 <= len(bad) <= 128 and not any(ord(c) < 32 or ord(c) == 127 for c in bad)
        if promised:
            obj["id"] = cid = f"{cid}-{len(bad)}"
    return FuzzMessage(name, json.dumps(obj).encode(), cid, promised)


def fuzz_stream(n: int, seed: int, prefix: str = "fz") -> list[FuzzMessage]:
    rng = random.Random(seed)
    return [fuzz_message(i, rng, prefix) for i in range(n)]


def objects_for(name: str, n: int, seed: int) -> list[dict[str, Any]]:
    """`n` JSON objects for command `name` (for schema/validator agreement): random ones, then
    every boundary value of every field the command takes, each in an otherwise valid payload."""
    rng = random.Random(f"{seed}-{name}")
    out = [command_object(name, rng, f"a-{i}") for i in range(n)]
    for key in (*ARG_KEYS[name], "expires_at", "ts", "id"):
        for value in BOUNDARY.get(key, ()):
            base = {"v": 1, "id": f"b-{len(out)}", **valid_args(name, rng)}
            if name == "failure.inject" and key == "mode":
                base["target"] = rng.choice(("estop", "link", "sensor:a", "gripper"))
            out.append({**base, key: value})
    return out

