"""docs/asyncapi.yaml is the MQTT contract: its enums equal the code's, its command schemas agree
with the daemon's validators, and real messages captured from a running daemon validate.

The schemas are JSON Schema draft 7 (AsyncAPI 3's schema format), validated with `jsonschema`;
"integer" is checked strictly (5.0 is not an integer), as the daemon does.
"""

from __future__ import annotations

import enum
import functools
import importlib
import json
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from daemon_proc import DaemonProc
from jsonschema.validators import Draft7Validator, extend
from mosquitto import Mosquitto, Probe, wait_until
from mqtt_payloads import objects_for
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT7

from edge_agent.commands.schema import COMMANDS, FAILURE_MODES, Limits, PayloadError, parse
from edge_agent.comms.mqtt_common import FLEET_ESTOP_TOPIC, Topics

REPO = Path(__file__).resolve().parents[1]
SPEC_PATH = REPO / "docs" / "asyncapi.yaml"
BASE = "urn:edge-agent:asyncapi"
StrictValidator = extend(Draft7Validator, type_checker=Draft7Validator.TYPE_CHECKER.redefine(
    "integer", lambda _checker, x: isinstance(x, int) and not isinstance(x, bool)))


@functools.cache
def spec() -> dict[str, Any]:
    data = yaml.safe_load(SPEC_PATH.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


@functools.cache
def validator(ref: str) -> Any:
    """A validator for `#/components/schemas/Name` (or any JSON pointer into the spec)."""
    registry: Registry[Any] = Registry().with_resource(
        BASE, Resource.from_contents(spec(), default_specification=DRAFT7))
    return StrictValidator({"$ref": BASE + ref}, registry=registry)


def schemas() -> dict[str, Any]:
    out: dict[str, Any] = spec()["components"]["schemas"]
    return out


def _walk(node: Any, path: str = "#") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}/{i}")


def _resolve(pointer: str) -> Any:
    node: Any = spec()
    for part in pointer.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


# ------------------------------------------------------------------------- the document itself

def test_document_is_asyncapi_3_with_every_topic_of_the_design() -> None:
    doc = spec()
    assert doc["asyncapi"].startswith("3.")
    for path, node in _walk(doc):
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            assert node["$ref"].startswith("#/"), path
            _resolve(node["$ref"])  # raises KeyError when dangling
    for name, schema in schemas().items():
        Draft7Validator.check_schema(schema)  # each is a valid draft-7 schema
        assert name
    addresses = {c["address"] for c in doc["channels"].values()}
    for topic in ("status", "state", "event", "report", "telemetry"):
        assert f"edge/{{deviceId}}/{topic}" in addresses
    assert FLEET_ESTOP_TOPIC in addresses
    topics = Topics("edge/{deviceId}")  # the daemon's own topic builder
    for name in COMMANDS:
        assert topics.cmd(name) in addresses, name
        assert topics.reply(name) in addresses, name
        assert doc["channels"][f"cmd.{name}"]["address"] == topics.cmd(name)
        assert "." not in topics.cmd(name).replace("{deviceId}", "dev1"), name  # NATS
    # the deprecated dotted aliases are documented as such
    assert doc["channels"]["cmd.legacy"]["address"] == "edge/{deviceId}/cmd/{dottedName}"
    assert "mqtt.legacy_topics" in doc["channels"]["cmd.legacy"]["description"]
    ops = doc["operations"]
    for op in ops.values():
        _resolve(op["channel"]["$ref"])
    receives = {_resolve(op["channel"]["$ref"])["address"] for op in ops.values()
                if op["action"] == "receive"}
    assert receives == ({topics.cmd(n) for n in COMMANDS} | {FLEET_ESTOP_TOPIC}
                        | {"edge/{deviceId}/cmd/{dottedName}"})


# ------------------------------------------------------------------------- enums equal the code

def _code_values(source: str, transform: str | None) -> set[str] | None:
    """The values of the code object named `module:attr`; None when it does not exist (yet)."""
    module, _, attr = source.partition(":")
    obj = getattr(importlib.import_module(module), attr, None)
    if obj is None:
        return None
    if isinstance(obj, type) and issubclass(obj, enum.Enum):
        if transform == "lower-name":
            return {m.name.lower() for m in obj}
        return {str(m.value) for m in obj}
    if isinstance(obj, Mapping):
        return {str(k) for k in obj}
    return {str(v) for v in obj}


ENUM_SCHEMAS = sorted(n for n, s in schemas().items() if "x-enum-source" in s)


@pytest.mark.parametrize("name", ENUM_SCHEMAS)
def test_documented_enum_equals_the_code(name: str) -> None:
    schema = schemas()[name]
    code = _code_values(schema["x-enum-source"], schema.get("x-enum-transform"))
    if code is None:  # e.g. DegradationMode before edge_agent/health defines one
        # an empty `enum` is invalid AsyncAPI: a schema that admits nothing says "none yet"
        assert "enum" not in schema and schema.get("not") == {}, (
            f"{name}: documented values but {schema['x-enum-source']} does not exist")
        return
    documented = schema["enum"]
    assert len(documented) == len(set(documented)), f"{name}: duplicates"
    assert set(documented) == code, (
        f"{name} differs from {schema['x-enum-source']}: only in docs "
        f"{sorted(set(documented) - code)}, only in code {sorted(code - set(documented))}")


def test_the_enums_the_issue_names_are_documented() -> None:
    wanted = {"ErrorCode", "EventType", "StopCause", "StopKind", "Mode", "DegradationMode",
              "CommandName"}
    assert wanted <= set(schemas())
    assert set(schemas()["Mode"]["enum"]) == {"idle", "running", "holding", "diagnostic",
                                              "manual", "protective_stop", "estop"}


_TYPE_LITERAL = re.compile(r'"type":\s*"[a-z]|\b_emit\(\s*"')


def test_event_types_come_from_the_enum() -> None:
    """Every event is published with a `vocab.EventType` member, never a bare string."""
    offenders = []
    schema_gen = REPO / "edge_agent" / "contract" / "schema_gen.py"  # JSON Schema's "type"
    for path in sorted((REPO / "edge_agent").rglob("*.py")):
        for no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if path != schema_gen and _TYPE_LITERAL.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{no}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_inference_event_kinds_are_event_types() -> None:
    from edge_agent.inference.backend import EventKind
    from edge_agent.vocab import EventType

    assert {k.value for k in EventKind} <= {t.value for t in EventType}


def test_failure_inject_modes_equal_the_code() -> None:
    documented: dict[str, set[str]] = {}
    for rule in schemas()["FailureInjectCommand"]["allOf"]:
        target = rule["if"]["properties"]["target"]
        family = target.get("const") or target["pattern"].strip("^:")
        documented[family] = set(rule["then"]["properties"]["mode"]["enum"])
    assert documented == {k: set(v) for k, v in FAILURE_MODES.items()}


# ------------------------------------------------------------- schemas agree with the validators

SCHEMA_OF = {"task.start": "TaskStartCommand", "task.cancel": "TaskCancelCommand",
             "resume": "ResumeCommand", "reset": "ResetCommand", "estop": "EstopCommand",
             "manual.enter": "ManualEnterCommand", "manual.jog": "ManualJogCommand",
             "manual.exit": "ManualExitCommand", "status": "StatusCommand",
             "model.update": "ModelUpdateCommand", "failure.inject": "FailureInjectCommand",
             "journal.label": "JournalLabelCommand", "model.shadow": "ModelShadowCommand",
             "record.start": "RecordStartCommand", "record.stop": "RecordStopCommand"}


def _code_accepts(name: str, obj: dict[str, Any]) -> bool:
    try:
        parse(name, obj, Limits())
    except PayloadError:
        return False
    return True


@pytest.mark.parametrize("name", COMMANDS)
def test_command_schema_agrees_with_the_daemon_validator(name: str) -> None:
    assert set(SCHEMA_OF) == set(COMMANDS)
    v = validator(f"#/components/schemas/{SCHEMA_OF[name]}")
    verdicts = {True: 0, False: 0}
    for obj in objects_for(name, 400, seed=7):
        code = _code_accepts(name, obj)
        documented = v.is_valid(obj)
        assert code == documented, (
            f"{name}: the daemon {'accepts' if code else 'refuses'} but the schema "
            f"{'accepts' if documented else 'refuses'} {obj!r}")
        verdicts[code] += 1
    assert min(verdicts.values()) >= 40, verdicts  # both kinds were exercised


def test_failure_target_with_a_trailing_colon_is_refused_by_the_daemon_too() -> None:
    obj = {"v": 1, "id": "c-1", "target": "gripper:", "mode": "slip"}
    assert not validator("#/components/schemas/FailureInjectCommand").is_valid(obj)
    assert not _code_accepts("failure.inject", obj)


# ------------------------------------------------------------------ real messages, real daemon

def _schema_for_topic(topic: str, device: str) -> str | None:
    """The payload schema pointer for a topic the daemon publishes (None: not an outbound one)."""
    doc = spec()
    parts = topic.split("/")
    if len(parts) < 3 or parts[2] == "cmd":
        return None
    for channel in doc["channels"].values():
        if channel["address"].replace("{deviceId}", device) == topic:
            (message,) = channel["messages"].values()
            return str(_resolve(message["$ref"])["payload"]["$ref"])
    if parts[2] == "reply":
        return "#/components/schemas/Reply"
    raise AssertionError(f"the daemon published on an undocumented topic {topic}")


class Operator:
    def __init__(self, probe: Probe, device: str) -> None:
        self.probe, self.device, self.n = probe, device, 0

    def cmd(self, name: str, payload: dict[str, Any] | bytes | None = None,
            cid: str | None = None, *, legacy: bool = False) -> dict[str, Any]:
        self.n += 1
        cid = cid or f"op-{self.n}"
        body = payload if isinstance(payload, bytes) else json.dumps(
            {"v": 1, "id": cid, **(payload or {})}).encode()
        topics = Topics(f"edge/{self.device}")
        self.probe.publish(topics.legacy_cmd(name) if legacy else topics.cmd(name), body)
        msg = self.probe.expect(lambda m: m.topic == topics.reply_for(name, legacy=legacy)
                                and json.loads(m.payload).get("id") == cid, timeout=30)
        out: dict[str, Any] = json.loads(msg.payload)
        return out


@pytest.fixture
def capture(broker: Mosquitto) -> Iterator[tuple[Probe, list[Any]]]:
    seen: list[Any] = []
    p = Probe(broker, "operator", "operator-pw")
    p.client.on_message = lambda c, u, m: (seen.append(m), p.messages.put(m))
    assert p.connect() == 0
    p.subscribe("edge/#")
    yield p, seen
    p.close()


def test_real_daemon_messages_validate_against_the_spec(
        tmp_path: Path, broker: Mosquitto, capture: tuple[Probe, list[Any]]) -> None:
    probe, seen = capture
    d = DaemonProc(tmp_path, broker).start()
    op = Operator(probe, "dev1")
    try:
        ready = d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        # MQTT starts on its own thread after READY: a command published before the daemon
        # subscribed would reach nobody. This boot's `online` follows its SUBSCRIBE on the
        # same connection (a retained one from an earlier test carries another boot_id).
        probe.expect(lambda m: m.topic == "edge/dev1/status" and json.loads(m.payload).get(
            "boot_id") == ready["boot_id"] and json.loads(m.payload).get("state") == "online",
            timeout=30)
        assert op.cmd("status")["ok"]
        for name, payload in [
            ("status", {"bogus": 1}), ("task.start", {"params": {"object": [0.3, 0.0, 0.05]}}),
            ("task.cancel", {}), ("reset", {"reason": "nothing latched"}),
            ("manual.jog", {"ttl_ms": 500, "dq": [0.1]}), ("failure.inject", {"target": "x"}),
            ("model.update", {"uri": "file:///nope", "sha256": "0" * 64}), ("no.such", {}),
            ("status", b'{"v": 1, "id": "broken-1", '), ("status", {"v": 2}),
        ]:
            cid = "broken-1" if isinstance(payload, bytes) else None
            reply = op.cmd(name, payload, cid)
            assert reply["id"] is not None, reply
        # a deprecated dotted topic (mqtt.legacy_topics, on by default): its own reply topic
        assert op.cmd("task.cancel", {}, legacy=True)["ok"]
        # the simulated robot's physical button, a refused reset, release, reset
        assert d.rig({"cmd": "inject", "target": "estop", "mode": "press"})["ok"]
        probe.expect(lambda m: m.topic == "edge/dev1/state"
                     and json.loads(m.payload)["mode"] == "estop", timeout=30)
        assert op.cmd("reset")["error"]["code"] == "estop_active"
        assert d.rig({"cmd": "inject", "target": "estop", "mode": "release"})["ok"]
        wait_until(lambda: not d.socket_cmd("status")["result"]["stop"]["hardware_input"],
                   30, "e-stop input released")
        wait_until(lambda: op.cmd("reset")["ok"], 30, "reset accepted")
        # a remote e-stop (and a malformed one, which still stops) and its reset
        assert op.cmd("estop", {"reason": "asyncapi test"})["result"]["latched"]
        assert "payload_error" in op.cmd("estop", {"bad": True})["result"]
        wait_until(lambda: op.cmd("reset")["ok"], 30, "reset accepted")
        probe.expect(lambda m: m.topic == "edge/dev1/state"
                     and json.loads(m.payload)["mode"] == "idle", timeout=30)
        probe.expect("edge/dev1/telemetry", timeout=30)
        assert d.stop() == 0
        probe.expect(lambda m: m.topic == "edge/dev1/status"
                     and json.loads(m.payload)["state"] == "offline", timeout=30)
    except BaseException:
        print("\n".join(d.lines[-60:]))
        raise
    finally:
        d.stop()

    failures, kinds = [], set()
    for m in list(seen):
        ref = _schema_for_topic(m.topic, "dev1")
        if ref is None:
            continue
        payload = json.loads(m.payload)
        kind = m.topic.split("/", 2)[2]
        kinds.add(f"{kind}:{payload.get('type') or payload.get('state') or payload.get('ok')}")
        errors = sorted(validator(ref).iter_errors(payload), key=lambda e: list(e.path))
        failures += [f"{m.topic} {payload}: {jsonschema.exceptions.best_match(errors).message}"
                     ] if errors else []
    assert not failures, "\n".join(failures)
    for wanted in ("status:online", "status:offline", "event:ready", "event:stop",
                   "event:estop_input", "event:stop_cleared", "reply/status:True",
                   "reply/status:False", "reply/reset:True", "reply/reset:False",
                   "reply/estop:True", "reply/no/such:False", "reply/task.cancel:True"):
        assert wanted in kinds, (wanted, sorted(kinds))
    assert any(k.startswith("telemetry:") for k in kinds) and any(
        k.startswith("state:") for k in kinds)
