"""Payload decoding limits and the per-command validators: every error names field and problem."""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.commands import ErrorCode, Limits
from edge_agent.commands.schema import COMMANDS, PayloadError, decode, parse, recover_id

LIM = Limits()
EXAMPLES = int(os.environ.get("EDGE_HYPOTHESIS_EXAMPLES", "200"))


def _err(name: str, payload: Any) -> PayloadError:
    with pytest.raises(PayloadError) as info:
        parse(name, decode(payload, LIM), LIM)
    return info.value


def _ok(name: str, **args: Any) -> dict[str, Any]:
    return parse(name, {"v": 1, "id": "x1", **args}, LIM).args


@pytest.mark.parametrize(("payload", "code", "cid"), [
    (b"not json", ErrorCode.BAD_JSON, None),
    (b'{"id": "abc", "v": 1,', ErrorCode.BAD_JSON, "abc"),
    (b"\xff\xfe{}", ErrorCode.BAD_JSON, None),
    (b'{"v": 1, "id": "n", "x": NaN}', ErrorCode.BAD_JSON, "n"),
    (b"[1, 2]", ErrorCode.NOT_OBJECT, None),
    (b'"text"', ErrorCode.NOT_OBJECT, None),
    (b'{"v": 1}', ErrorCode.MISSING_ID, None),
    (b'{"v": 1, "id": ""}', ErrorCode.BAD_ID, None),
    (b'{"v": 1, "id": 7}', ErrorCode.BAD_ID, None),
    (json.dumps({"v": 1, "id": "x" * 129}).encode(), ErrorCode.BAD_ID, None),
    (b'{"v": 1, "id": "a\\u0001b"}', ErrorCode.BAD_ID, None),
    (b'{"id": "q"}', ErrorCode.BAD_VERSION, "q"),
    (b'{"id": "q", "v": 2}', ErrorCode.BAD_VERSION, "q"),
    (b'{"id": "q", "v": true}', ErrorCode.BAD_VERSION, "q"),
    (b'{"id": "q", "v": 1.0}', ErrorCode.BAD_VERSION, "q"),
    (b'{"id": "d", "v": 1, "a": ' + b"[" * 20 + b"]" * 20 + b"}", ErrorCode.TOO_DEEP, "d"),
    (b'{"id": "r", "v": 1, "a": ' + b"[" * 100000 + b"]" * 100000 + b"}",
     ErrorCode.TOO_LARGE, "r"),
])
def test_payload_errors(payload: bytes, code: ErrorCode, cid: str | None) -> None:
    err = _err("status", payload)
    assert err.code is code, err
    assert err.command_id == cid


def test_recursion_past_the_interpreter_limit_is_too_deep() -> None:
    deep = b'{"id": "deep", "v": 1, "a": ' + b"[" * 30000 + b"]" * 30000 + b"}"
    assert len(deep) <= LIM.max_bytes  # json's C scanner hits RecursionError on this
    err = _err("status", deep)
    assert err.code is ErrorCode.TOO_DEEP and err.command_id == "deep"


def test_depth_limit_is_exact() -> None:
    ok = {"v": 1, "id": "a", "p": {"q": {"r": {"s": {"t": {"u": {"w": 1}}}}}}}  # depth 7
    decode(ok, LIM)
    too = {"v": 1, "id": "a", "p": {"q": {"r": {"s": {"t": {"u": {"w": {"z": [1]}}}}}}}}
    with pytest.raises(PayloadError) as info:
        decode(too, LIM)
    assert info.value.code is ErrorCode.TOO_DEEP


@pytest.mark.parametrize(("name", "args", "message"), [
    ("task.start", {"params": {"object": [1, 2]}}, "params.object: expected 3 numbers, got 2"),
    ("task.start", {"params": {"object": [1, 2, "x"]}},
     "params.object[2]: expected a finite number, got 'x'"),
    ("task.start", {"params": {"place": [0, 0, 11]}}, "params.place[2]: |11| exceeds 10"),
    ("task.start", {"params": []}, "params: expected an object, got array"),
    ("task.start", {"params": {"obj": [1, 2, 3]}}, "params: unknown field 'obj'"),
    ("task.start", {"task": "weld"}, "task: expected one of pick_place, got 'weld'"),
    ("resume", {"task_id": ""}, "task_id"),
    ("manual.jog", {"dq": [0.1]}, "ttl_ms: missing"),
    ("manual.jog", {"dq": [0.1], "ttl_ms": 201}, "ttl_ms: expected an integer in [1, 200]"),
    ("manual.jog", {"dq": [0.1], "ttl_ms": 50.5}, "ttl_ms: expected an integer, got number"),
    ("manual.jog", {"dq": [0.1], "ttl_ms": True}, "ttl_ms: expected an integer, got boolean"),
    ("manual.jog", {"dq": [], "ttl_ms": 100}, "dq: expected 1..16 numbers, got 0"),
    ("manual.jog", {"dq": [0.1], "ttl_ms": 100, "ttl_msec": 5}, "unknown field 'ttl_msec'"),
    ("status", {"x": 1}, "unknown field 'x' (takes no arguments)"),
    ("model.update", {"uri": "file:///m.onnx", "sha256": "zz"}, "sha256: 'zz' does not match"),
    ("model.shadow", {}, 'uri: required to start a shadow (or {"stop": true}'),
    ("model.shadow", {"stop": 1}, "stop: expected true, got 1"),
    ("model.shadow", {"stop": True, "uri": "/m.onnx"}, "stop: give it alone (not with uri)"),
    ("model.shadow", {"uri": "/m.onnx"}, "sha256"),
    ("failure.inject", {"target": "sensor:", "mode": "stuck"}, "target: expected sensor:<channel>"),
    ("failure.inject", {"target": "gripper:x", "mode": "slip"}, "target: expected sensor:"),
    ("failure.inject", {"target": "laser", "mode": "on"}, "target: expected sensor:<channel>"),
    ("failure.inject", {"target": "gripper", "mode": "stuck"},
     "mode: expected one of weak_close, slip, got 'stuck'"),
    ("failure.inject", {"target": "gpu", "mode": "fail", "duration_s": -1},
     "duration_s: expected a number in [0, 3600]"),
    ("failure.inject", {"target": "link", "mode": "unplug", "severity": 2},
     "severity: expected a number in [0, 1], got 2"),
])
def test_bad_args_name_the_problem(name: str, args: dict[str, Any], message: str) -> None:
    err = _err(name, {"v": 1, "id": "x1", **args})
    assert err.code is ErrorCode.BAD_ARGS
    assert message in err.message, err.message
    assert err.command_id == "x1"


def test_valid_arguments_are_normalised() -> None:
    assert _ok("task.start") == {"task": "pick_place"}
    assert _ok("task.start", params={"object": [0.4, 0, 0.05]}) == {
        "task": "pick_place", "params": {"object": [0.4, 0.0, 0.05]}}
    assert _ok("manual.jog", ttl_ms=200, dq=[0, 0.1, 0, 0]) == {
        "ttl_ms": 200, "dq": [0.0, 0.1, 0.0, 0.0]}
    assert _ok("failure.inject", target="sensor:wrist_force", mode="spikes", duration_s=2) == {
        "target": "sensor:wrist_force", "mode": "spikes", "duration_s": 2}
    for target, mode in [("collision", "impact"), ("estop", "press"), ("triton", "down")]:
        assert _ok("failure.inject", target=target, mode=mode)["mode"] == mode
    assert _ok("model.update", uri="file:///m.onnx", sha256="ab" * 32)["sha256"] == "ab" * 32
    assert _ok("resume", task_id="t-1") == {"task_id": "t-1"}
    assert _ok("model.shadow", stop=True) == {"stop": True}
    assert _ok("model.shadow", uri="/d/c.onnx", sha256="ab" * 32)["uri"] == "/d/c.onnx"
    assert _ok("resume") == {}  # no task_id: the single saved task (issue #20)
    assert parse("status", {"v": 1, "id": "e", "expires_at": 1.5e9}, LIM).expires_at == 1.5e9


def test_unknown_command_keeps_the_id() -> None:
    err = _err("teleport", {"v": 1, "id": "t"})
    assert err.code is ErrorCode.UNKNOWN_COMMAND and err.command_id == "t"


def test_recover_id() -> None:
    assert recover_id(b'garbage {"id": "abc-1", oops') == "abc-1"
    assert recover_id('{"id": 5}') is None


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                  max_size=4),
    max_leaves=20)


@settings(deadline=None, max_examples=EXAMPLES)
@given(name=st.sampled_from([*COMMANDS, "bogus"]), body=st.dictionaries(
    st.sampled_from(["v", "id", "task", "params", "ttl_ms", "dq", "target", "mode", "task_id",
                     "uri", "sha256", "expires_at", "duration_s", "x"]), json_values, max_size=6))
def test_parse_raises_only_payload_errors(name: str, body: dict[str, Any]) -> None:
    try:
        parse(name, decode(body, LIM), LIM)
    except PayloadError as exc:
        assert exc.message


@settings(deadline=None, max_examples=EXAMPLES)
@given(st.binary(max_size=300) | st.text(max_size=300))
def test_decode_arbitrary_bytes_raises_only_payload_errors(raw: bytes | str) -> None:
    with contextlib.suppress(PayloadError):
        decode(raw, LIM)
