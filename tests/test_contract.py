"""The typed contract (edge_agent/contract/): one record per event type, the generated part of
docs/asyncapi.yaml equals the generator's output, and the stand-alone schemas (the recorder's and
live view's channels) accept what a real daemon publishes and refuse what it must not.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import DaemonProc
from jsonschema.validators import Draft7Validator, Draft202012Validator, extend
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.contract import asyncapi, events, schema_for, schema_names, status
from edge_agent.contract.schema_gen import event_records
from edge_agent.vocab import EventType

Strict = extend(Draft202012Validator, type_checker=Draft202012Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool)))


def _errors(name: str, payload: Any) -> list[str]:
    return [e.message for e in Strict(schema_for(name)).iter_errors(payload)]


def test_every_event_type_has_one_record_and_a_schema() -> None:
    records = event_records()
    assert set(records) == {t.value for t in EventType}
    assert len(set(records.values())) == len(EventType)  # one definition each
    for t in EventType:
        s = schema_for(f"event:{t.value}")
        assert s["properties"]["type"]["const"] == t.value
        assert {"v", "type", "ts", "mono", "boot_id"} <= set(s["required"])
        assert s["description"], t  # every record says what it means


@pytest.mark.parametrize("name", schema_names())
def test_stand_alone_schemas_are_valid_json_schema_without_refs(name: str) -> None:
    s = schema_for(name)
    Draft202012Validator.check_schema(s)
    Draft7Validator.check_schema(s)
    assert "$ref" not in json.dumps(s)  # a recorder channel carries the schema alone
    assert schema_for(name) is not schema_for(name)  # callers may change their copy


def test_the_envelope_every_record_inherits_is_the_documented_one() -> None:
    from edge_agent.contract.base import EventBase

    assert EventBase.__annotations__.keys() == events.EventEnvelope.__annotations__.keys() - {
        "type"}
    assert not EventBase.__required_keys__  # set by the hub, never by a producer
    for cls in event_records().values():
        assert EventBase.__annotations__.keys() <= cls.__annotations__.keys(), cls


def test_unknown_names_are_refused() -> None:
    for bad in ("event:nope", "nope", "Event"):
        with pytest.raises(KeyError):
            schema_for(bad)


def test_the_document_block_is_what_the_records_generate() -> None:
    text = asyncapi.DOC.read_text(encoding="utf-8")
    assert asyncapi.rewrite(text) == text, (
        "docs/asyncapi.yaml differs from edge_agent/contract/: run "
        "`python -m edge_agent.contract.asyncapi --write`")


def test_rewrite_replaces_only_the_block() -> None:
    text = asyncapi.DOC.read_text(encoding="utf-8")
    stale = text.replace("      description: A task ended.", "      description: stale", 1)
    assert stale != text and asyncapi.rewrite(stale) == text
    with pytest.raises(ValueError, match="no generated block"):
        asyncapi.rewrite(text.replace(asyncapi.BEGIN, "", 1))


def test_check_command_fails_on_a_stale_document(tmp_path: Path) -> None:
    doc = tmp_path / "asyncapi.yaml"
    doc.write_text(asyncapi.DOC.read_text(encoding="utf-8").replace(
        "      description: A task ended.", "      description: stale", 1), encoding="utf-8")
    assert asyncapi.main(["--check", "--doc", str(doc)]) == 1
    assert asyncapi.main(["--write", "--doc", str(doc)]) == 0
    assert asyncapi.main(["--check", "--doc", str(doc)]) == 0


def test_schemas_refuse_wrong_events() -> None:
    env = {"v": 1, "ts": 1.0, "mono": 2.0, "boot_id": "b"}
    good = {**env, "type": "stop", "kind": "estop", "cause": "estop_mqtt"}
    assert _errors("event:stop", good) == [] and _errors("event", good) == []
    for bad in ({**good, "kind": "bogus"}, {k: v for k, v in good.items() if k != "cause"},
                {**good, "type": "stop_update"}, {k: v for k, v in good.items() if k != "ts"}):
        assert _errors("event:stop", bad), bad
    assert _errors("event", {**good, "kind": "bogus"})  # the any-event rules apply by type
    assert _errors("event:task_done", {**env, "type": "task_done", "task_id": "t",
                                       "outcome": "success", "attempts": 1.5})  # integer
    assert _errors("event:shadow_stopped", {**env, "type": "shadow_stopped", "decisions": 1,
                                            "candidate": {"name": "m"}, "agreement": 2,
                                            "dropped": 0, "report": None})


def test_nullable_and_not_required_fields() -> None:
    hints = typing.get_type_hints(events.TaskDoneEvent)
    assert "failures" in hints and "failures" not in events.TaskDoneEvent.__required_keys__
    s = schema_for("event:task_frozen")
    assert s["properties"]["stop"]["enum"][-1] is None
    assert "t" not in s["required"]  # only executor events carry it
    st = schema_for("status")
    assert st["properties"]["health"]["type"] == ["object", "null"]
    assert "level" in st["properties"]["health"]["properties"]["probes"][
        "additionalProperties"]["required"]
    assert status.StatusResult.__required_keys__ >= status.StateFields.__required_keys__


def test_real_daemon_events_state_and_status_validate(
        tmp_path: Path, broker: Mosquitto) -> None:
    """A real daemon's events, state, status, report and telemetry against the stand-alone
    schemas."""
    seen: list[tuple[str, Any]] = []
    p = Probe(broker, "operator", "operator-pw")
    p.client.on_message = lambda c, u, m: (seen.append((m.topic, json.loads(m.payload))),
                                           p.messages.put(m))
    assert p.connect() == 0
    p.subscribe("edge/dev1/#")
    d = DaemonProc(tmp_path, broker).start()
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        assert d.rig({"cmd": "inject", "target": "estop", "mode": "press"})["ok"]
        wait_until(lambda: d.socket_cmd("status")["result"].get("stop") is not None, 30, "stop")
        assert d.rig({"cmd": "inject", "target": "estop", "mode": "release"})["ok"]
        wait_until(lambda: not d.socket_cmd("status")["result"]["stop"]["hardware_input"],
                   30, "e-stop input released")
        wait_until(lambda: d.socket_cmd("reset")["ok"], 30, "reset accepted")
        st = d.socket_cmd("status")["result"]
        assert _errors("status", st) == []
        assert _errors("status", {**st, "mode": "flying"})  # not vacuous
        wait_until(lambda: any(t.endswith("/event") and e.get("type") == "stop_cleared"
                               for t, e in list(seen)), 30, "stop_cleared event")
        for kind in ("state", "telemetry"):  # housekeeping's: ≤ 10/s state, telemetry_hz 10
            wait_until(lambda k=kind: any(t.endswith(f"/{k}") for t, _ in list(seen)), 30, kind)
        assert d.stop() == 0
    finally:
        d.stop()
        p.close()
    types, failures = set(), []
    for topic, payload in seen:
        if topic.endswith("/event"):
            types.add(payload["type"])
            name = f"event:{payload['type']}"
        elif topic.endswith("/state"):
            name = "state"
        elif topic.endswith(("/report", "/telemetry")):
            name = topic.rsplit("/", 1)[1]
        else:
            continue
        failures += [f"{name} {payload}: {e}" for e in _errors(name, payload)]
        if name.startswith("event"):
            failures += [f"event {payload}: {e}" for e in _errors("event", payload)]
    assert not failures, "\n".join(failures)
    assert {"ready", "estop_input", "stop", "stop_cleared", "link_up"} <= types, types
    assert any(t.endswith("/report") for t, _ in seen), "the e-stop's report was published"
