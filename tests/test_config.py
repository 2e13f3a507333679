"""edge_agent.config: defaults, each validation path (key + reason), warnings, --set overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from config_helpers import BASE, PASSWORD, ROBOT, load, render, secret_file, write

from edge_agent.config import ConfigError, Secret, config_keys, load_config, parse_override

# --------------------------------------------------------------------------- defaults


def test_minimal_config_gets_documented_defaults(tmp_path: Path) -> None:
    c = load(tmp_path)
    assert c.device.id == "dev-1"
    assert c.state_dir == tmp_path / "state"  # relative to the config file's directory
    m = c.mqtt
    assert (m.host, m.port, m.username, m.password, m.password_file) == (
        "127.0.0.1", 1883, "dev-1", None, None)
    assert (m.topic_prefix, m.protocol, m.keepalive_s, m.fleet_topic) == (
        "edge/dev-1", "5", 10, "edge/fleet/cmd/estop")
    assert (m.max_queued, m.reconnect_min_s, m.reconnect_max_s, m.dedup_window_s,
            m.telemetry_hz) == (1000, 0.5, 30.0, 3600.0, 10.0)
    assert (m.tls.enabled, m.tls.ca_file, m.tls.insecure) == (False, None, False)
    ln = c.link
    assert (ln.port, ln.baudrate, ln.deadman_ms, ln.status_period_us, ln.fault_after) == (
        "/dev/ttyUSB0", 1_000_000, 50, 1000, 16)
    assert (ln.reopen_min_s, ln.reopen_max_s, ln.guardian_priority) == (0.05, 2.0, 30)
    assert (c.control.rate_hz, c.control.decision_hz, c.control.spin_s, c.control.no_spin) == (
        200.0, 20.0, 0.0002, False)
    ex = c.executor
    assert (ex.max_attempts, ex.l3_threshold, ex.tool_tolerance_m, ex.grip_force_n,
            ex.grip_force_band_n, ex.collision_current_factor) == (3, 5, 0.002, 10.0, 1.0, 1.5)
    assert ex.l1_timeouts_s.grasp > 0 and ex.l1_timeouts_s.transfer > 0
    inf = c.inference
    assert (inf.providers, inf.model, inf.triton_url, inf.triton_model, inf.deadline_ms,
            inf.intra_op_threads) == (("CPUExecutionProvider",), None, None, "policy", 20.0, 1)
    assert inf.cache_dir == tmp_path / "state" / "models"
    assert (c.health.period_s, c.health.fail_after, c.health.recover_after) == (10.0, 3, 3)
    assert (c.reports.dir, c.reports.webhook_url, c.reports.max_files) == (
        tmp_path / "state" / "reports", None, 200)
    assert (c.journal.enabled, c.journal.segment_bytes, c.journal.max_segments) == (
        True, 4 * 1024 * 1024, 16)
    assert (c.log.level, c.log.format, c.debug.failure_injection) == ("info", "auto", False)
    assert (c.sim.robot_seed, c.sim.rig_config) == (0, None)
    assert c.robot.name == "edge-arm-4" and c.robot.n_joints == 4
    assert c.robot_file == ROBOT
    assert c.warnings == ()
    assert len(c.hash) == 12 and int(c.hash, 16) >= 0


def test_executor_keys_reach_the_executor(tmp_path: Path) -> None:
    from edge_agent.daemon.control import executor_config

    e = executor_config(load(tmp_path))
    assert (e.regrasp_window_s, e.max_regrasps) == (0.5, 1)  # the documented defaults
    e = executor_config(load(tmp_path, overrides=["executor.regrasp_window_s=0",
                                                   "executor.max_regrasps=2",
                                                   "executor.l3_threshold=7"]))
    assert (e.regrasp_window_s, e.max_regrasps, e.l3_threshold) == (0.0, 2, 7)


def test_sim_mode_lets_link_port_be_absent(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, {"link": {"port": None}})
    assert ei.value.key == "link.port" and "--sim" in ei.value.why
    assert load(tmp_path, {"link": {"port": None}}, sim=True).link.port is None


def test_config_is_frozen(tmp_path: Path) -> None:
    c = load(tmp_path)
    with pytest.raises(AttributeError):
        c.mqtt.port = 1  # type: ignore[misc]


def test_every_schema_key_is_listed() -> None:
    keys = config_keys()
    assert {"device.id", "mqtt.tls.ca_file", "executor.l1_timeouts_s.grasp", "state_dir",
            "debug.failure_injection", "link.port"} <= set(keys)
    assert len(keys) == len(set(keys))


# --------------------------------------------------------------------------- bad values

BAD: list[tuple[str, str, Any, str]] = [
    # (section, key, TOML literal, reason fragment)
    ("device", "id", '"bad id!"', "1-64 of"),
    ("device", "id", '""', "must not be empty"),
    ("device", "id", '"' + "x" * 65 + '"', "1-64 of"),
    ("device", "id", "7", "must be a string"),
    ("mqtt", "host", '"mqtt://broker"', "not a URL"),
    ("mqtt", "port", "0", "must be >= 1 and <= 65535"),
    ("mqtt", "port", "70000", "must be >= 1 and <= 65535"),
    ("mqtt", "port", '"1883"', "must be an integer"),
    ("mqtt", "port", "1883.5", "must be an integer"),
    ("mqtt", "port", "true", "must be an integer"),
    ("mqtt", "protocol", '"4"', 'must be one of "5", "3.1.1"'),
    ("mqtt", "protocol", "5", 'must be a string ("5" or "3.1.1")'),
    ("mqtt", "keepalive_s", "0", "must be >= 1"),
    ("mqtt", "topic_prefix", '"edge/#"', "wildcards"),
    ("mqtt", "topic_prefix", '"edge//x"', "empty levels"),
    ("mqtt", "topic_prefix", '"/edge/x"', "empty levels"),
    ("mqtt", "fleet_topic", '"edge/#/estop"', "'#' only the last"),
    ("mqtt", "fleet_topic", '"edge/a+/estop"', "'+' must fill a whole level"),
    # valid on every major broker: NATS refuses '.' and spaces inside a level
    ("mqtt", "topic_prefix", '"site.a/robot-1"', "NATS refuses '.'"),
    ("mqtt", "topic_prefix", '"plant 1/robot-1"', "not valid on every broker"),
    ("mqtt", "topic_prefix", '"edge/r*1"', "NATS's '*' '>' are wildcards"),
    ("mqtt", "topic_prefix", '"$SYS/x"', "starts with '$'"),
    ("mqtt", "fleet_topic", '"edge/fleet/cmd/e.stop"', "NATS refuses '.'"),
    ("mqtt", "legacy_topics", '"yes"', "must be true or false"),
    ("mqtt", "max_queued", "0", "must be >= 1"),
    ("mqtt", "reconnect_min_s", "0", "must be > 0"),
    ("mqtt", "reconnect_min_s", "60", "must not exceed mqtt.reconnect_max_s (30)"),
    ("mqtt", "dedup_window_s", "-1", "must be > 0"),
    ("mqtt", "telemetry_hz", "1000", "must be >= 0 and <= 100"),
    ("mqtt", "telemetry_hz", "nan", "must be finite"),
    ("mqtt", "username", '""', "must not be empty"),
    ("link", "port", '"ttyUSB0"', "an absolute tty path"),
    ("link", "port", '"b@d://x"', "not a pyserial URL"),
    ("link", "baudrate", "0", "must be >= 1200"),
    ("link", "deadman_ms", "2", "must be >= 5"),
    ("link", "deadman_ms", "8", "at least 2 control periods (10 ms"),
    ("link", "status_period_us", "10000", "at least at the control rate (<= 5000 us"),
    ("link", "guardian_priority", "60", "IRQ threads"),
    ("link", "guardian_priority", "-1", "must be >= 0"),
    ("link", "fault_after", "0", "must be >= 1"),
    ("link", "reopen_min_s", "10", "must not exceed link.reopen_max_s (2)"),
    ("robot", "description", '"nope.toml"', "file not found"),
    ("robot", "description", "3", "must be a string"),
    ("control", "rate_hz", "5", "must be >= 10 and <= 1000"),
    ("control", "rate_hz", "2000", "must be >= 10 and <= 1000"),
    ("control", "decision_hz", "300", "must not exceed control.rate_hz (200)"),
    ("control", "decision_hz", "0", "must be > 0"),
    ("control", "spin_s", "0.004", "under half the control period (2.5 ms)"),
    ("control", "no_spin", '"yes"', "must be true or false"),
    ("control", "priority", "30", "must be below link.guardian_priority (30)"),
    ("control", "priority", "50", "must be >= 0 and <= 49"),
    ("link", "reader_priority", "30", "must be below link.guardian_priority (30)"),
    ("link", "reader_priority", "-2", "must be >= 0"),
    ("executor", "max_attempts", "0", "must be >= 1 and <= 10"),
    ("executor", "regrasp_window_s", "-1", "must be >= 0 and <= 10"),
    ("executor", "max_regrasps", "9", "must be >= 0 and <= 5"),
    ("executor", "l3_threshold", "0", "must be >= 1"),
    ("executor", "tool_tolerance_m", "0", "must be > 0"),
    ("executor", "grip_force_n", "100", "outside the gripper's force range 0..40 N"),
    ("executor", "grip_force_band_n", "11", "smaller than executor.grip_force_n (10)"),
    ("executor", "collision_current_factor", "1.0", "must be > 1"),
    ("executor", "l1_timeouts_s", "5", "must be a table"),
    ("executor.l1_timeouts_s", "grasp", "0", "must be > 0"),
    ("executor.l1_timeouts_s", "grab", "1.0", "unknown key; did you mean "
                                              "executor.l1_timeouts_s.grasp?"),
    ("inference", "providers", "[]", "non-empty list of strings"),
    ("inference", "providers", '"CPUExecutionProvider"', "non-empty list of strings"),
    ("inference", "providers", '["CUDAExecutionProvidr"]', "did you mean CUDAExecutionProvider?"),
    ("inference", "providers", '["CPUExecutionProvider", "CPUExecutionProvider"]', "twice"),
    ("inference", "model", '"missing.onnx"', "file not found"),
    ("inference", "triton_url", '"grpc://triton:8001"', "host:port of Triton's gRPC endpoint"),
    ("inference", "triton_url", '"triton"', "host:port"),
    ("inference", "deadline_ms", "60", "must not exceed the decision period (50 ms"),
    ("inference", "intra_op_threads", "0", "must be >= 1"),
    ("health", "period_s", "0", "must be >= 0.1"),
    ("health", "fail_after", "0", "must be >= 1"),
    ("health", "recover_after", "1.5", "must be an integer"),
    ("reports", "max_files", "0", "must be >= 1"),
    ("journal", "segment_bytes", "1000", "must be >= 65536"),
    ("journal", "max_segments", "1", "must be >= 2"),
    ("journal", "enabled", "1", "must be true or false"),
    ("log", "level", '"verbose"', 'must be one of "debug", "info", "warning", "error"'),
    ("log", "format", '"xml"', 'must be one of "auto", "json", "console"'),
    ("debug", "failure_injection", '"true"', "must be true or false"),
    ("sim", "rig_priority", "100", "must be >= 0 and <= 99"),
    ("sim", "robot_seed", "-1", "must be >= 0"),
    ("sim", "rig_config", '"rig.toml"', "file not found"),
    ("mqtt.tls", "insecure", "true", "has no effect without TLS"),
    ("mqtt.tls", "ca_file", '"ca.pem"', "file not found"),
    ("mqtt.tls", "enabled", '"on"', "must be true or false"),
    ("mqtt", "prot", "1884", "unknown key; did you mean mqtt.port?"),
    ("mqtt", "state_dir", '"x"', "top-level keys must come before the first [section]"),
    ("device", "port", "1", "unknown key; did you mean mqtt.port or link.port?"),
]


@pytest.mark.parametrize(("section", "key", "literal", "why"), BAD,
                         ids=[f"{s}.{k}={v}"[:60] for s, k, v, _ in BAD])
def test_bad_value_names_key_value_and_reason(tmp_path: Path, section: str, key: str,
                                              literal: str, why: str) -> None:
    path = write(tmp_path, {section: {key: literal}})
    with pytest.raises(ConfigError) as ei:
        load_config(path)
    err = ei.value
    assert err.key == f"{section}.{key}"
    assert why in err.why
    assert err.source == str(path)
    assert str(err).startswith(f"{path}: {section}.{key} = ")


TOP_BAD: list[tuple[str, dict[str, dict[str, Any]], str, str]] = [
    ("no schema_version", {"": {"schema_version": None}}, "schema_version", "is required"),
    ("schema 2", {"": {"schema_version": "2"}}, "schema_version", "unsupported"),
    ("schema as text", {"": {"schema_version": '"1"'}}, "schema_version", "unsupported"),
    ("no state_dir", {"": {"state_dir": None}}, "state_dir", "is required"),
    ("no device id", {"device": {"id": None}}, "device.id", "is required"),
    ("no robot", {"robot": {"description": None}}, "robot.description", "is required"),
    ("unknown section", {"mqt": {"port": "1"}}, "mqt", "unknown section; did you mean mqtt?"),
    ("unknown top key", {"": {"sate_dir": '"x"'}}, "sate_dir", "did you mean state_dir?"),
    ("section not a table", {"": {"mqtt": "5"}}, "mqtt", "must be a table ([mqtt])"),
    ("both passwords", {"mqtt": {"password": '"a-password"', "password_file": '"pw"'}},
     "mqtt.password_file", "not both"),
    ("cert without key", {"mqtt.tls": {"cert_file": '"client.crt"'}},
     "mqtt.tls.key_file", "is required when mqtt.tls.cert_file is set"),
    ("tls off with files", {"mqtt.tls": {"enabled": "false", "ca_file": '"ca.pem"'}},
     "mqtt.tls.enabled", "is false but"),
    ("webhook scheme", {"reports": {"webhook_url": '"ftp://hooks/x"'}},
     "reports.webhook_url", "an http:// or https:// URL"),
]


@pytest.mark.parametrize(("changes", "key", "why"), [t[1:] for t in TOP_BAD],
                         ids=[t[0] for t in TOP_BAD])
def test_structural_errors_name_key_and_reason(tmp_path: Path, changes: dict[str, Any],
                                               key: str, why: str) -> None:
    for name in ("pw", "client.crt", "ca.pem"):
        secret_file(tmp_path / name)
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, changes)
    assert (ei.value.key, ei.value.source) == (key, str(tmp_path / "edge-agent.toml"))
    assert why in ei.value.why


def test_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("")
    with pytest.raises(ConfigError) as ei:
        load(tmp_path)
    assert ei.value.key == "state_dir" and "not a directory" in ei.value.why


@pytest.mark.parametrize(("text", "key", "why"), [
    ("schema_version = 1\n[mqtt\n", "(syntax)", "not valid TOML"),
    (b"\xff\xfe".decode("latin-1"), "(syntax)", "not valid TOML"),
])
def test_unparsable_file(tmp_path: Path, text: str, key: str, why: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text=text))
    assert ei.value.key == key and why in ei.value.why


def test_syntax_error_names_the_line_but_never_quotes_it(tmp_path: Path) -> None:
    text = render(BASE) + f'[mqtt]\npassword = "{PASSWORD}\n'
    with pytest.raises(ConfigError) as ei:
        load_config(write(tmp_path, text=text))
    assert ei.value.value == f"line {text.count(chr(10))}"
    assert PASSWORD not in str(ei.value)


def test_missing_file_and_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found") as ei:
        load_config(tmp_path / "none.toml")
    assert ei.value.key == "(file)"
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


def test_robot_description_errors_carry_the_robot_file_and_key(tmp_path: Path) -> None:
    bad = ROBOT.read_text().replace("position_min_rad = -0.3", "position_min_rad = 2.5")
    (tmp_path / "robot.toml").write_text(bad)
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, {"robot": {"description": '"robot.toml"'}})
    assert ei.value.source == str(tmp_path / "robot.toml")
    assert ei.value.key == "joints[1].position_min_rad"
    assert "min is greater than max" in ei.value.why


# --------------------------------------------------------------------------- soft warnings


@pytest.mark.parametrize(("changes", "fragment"), [
    ({"mqtt": {"host": '"broker.example"', "password": '"pw-123456"'}}, "clear text"),
    ({"mqtt.tls": {"ca_file": '"ca.pem"', "insecure": "true"}}, "host name is not checked"),
    ({"mqtt.tls": {"ca_file": '"ca.pem"'}}, "8883 is usual"),
    ({"control": {"decision_hz": "30"}}, "decisions fall unevenly"),
    ({"inference": {"providers": '["CUDAExecutionProvider"]'}}, "no CPU fallback"),
    ({"reports": {"webhook_url": '"http://hooks.example/x"'}}, "unencrypted"),
])
def test_soft_findings_are_warnings(tmp_path: Path, changes: dict[str, Any],
                                    fragment: str) -> None:
    secret_file(tmp_path / "ca.pem", "not really a CA\n", 0o644)
    c = load(tmp_path, changes)
    assert any(fragment in w for w in c.warnings), c.warnings


def test_loopback_password_without_tls_is_not_warned(tmp_path: Path) -> None:
    assert load(tmp_path, {"mqtt": {"password": '"pw-123456"'}}).warnings == ()


# --------------------------------------------------------------------------- --set


@pytest.mark.parametrize(("item", "key", "value"), [
    ("mqtt.port=1884", "mqtt.port", 1884),
    ("debug.failure_injection=true", "debug.failure_injection", True),
    ("link.port=/dev/pts/3", "link.port", "/dev/pts/3"),
    ("mqtt.host=10.0.0.5", "mqtt.host", "10.0.0.5"),
    ("inference.providers=[\"A\", \"B\"]", "inference.providers", ["A", "B"]),
    ("mqtt.password=a=b", "mqtt.password", "a=b"),
    (" control.rate_hz =500", "control.rate_hz", 500),
])
def test_parse_override(item: str, key: str, value: Any) -> None:
    k, v, _ = parse_override(item)
    assert (k, v) == (key, value)


def test_overrides_apply_with_types(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    c = load(tmp_path, overrides=[
        "mqtt.port=1884", "debug.failure_injection=true", "link.port=/dev/pts/3",
        "mqtt.protocol=3.1.1", "mqtt.password=1234", "executor.l1_timeouts_s.grasp=2.5",
        "inference.providers=[\"CUDAExecutionProvider\", \"CPUExecutionProvider\"]",
        "state_dir=elsewhere/state", "log.level=DEBUG", "mqtt.port=1885", "device.id=42"])
    assert c.mqtt.port == 1885  # the last --set wins
    assert c.debug.failure_injection is True and c.link.port == "/dev/pts/3"
    assert c.mqtt.protocol == "3.1.1" and c.mqtt.password == Secret("1234")
    assert c.executor.l1_timeouts_s.grasp == 2.5
    assert c.inference.providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert c.state_dir == tmp_path / "elsewhere" / "state"  # --set paths: working directory
    assert c.log.level == "debug"
    assert c.device.id == "42" and c.mqtt.topic_prefix == "edge/42"


def test_numeric_text_override_of_a_string_key(tmp_path: Path) -> None:
    assert load(tmp_path, overrides=["mqtt.protocol=5"]).mqtt.protocol == "5"


def test_empty_override_unsets_an_optional_key(tmp_path: Path) -> None:
    c = load(tmp_path, {"reports": {"webhook_url": '"https://h/x"'}},
             overrides=["reports.webhook_url="])
    assert c.reports.webhook_url is None
    with pytest.raises(ConfigError, match=r"device\.id = '': must not be empty"):
        load(tmp_path, overrides=["device.id="])  # a required key cannot be unset


@pytest.mark.parametrize(("item", "key", "why"), [
    ("nokey", "--set", "expected KEY=VALUE"),
    ("=5", "--set", "expected KEY=VALUE"),
    ("mqtt.prot=1884", "mqtt.prot", "unknown key; did you mean mqtt.port?"),
    ("mqt.port=1884", "mqt.port", "did you mean mqtt.port?"),
    ("port=1884", "port", "did you mean mqtt.port or link.port?"),
    ("mqtt.port.x=1", "mqtt.port.x", "unknown key"),
    ("nosection.key=1", "nosection.key", "unknown key"),
    ("mqtt=1", "mqtt", "is a table: set one of its keys"),
    ("mqtt.tls=1", "mqtt.tls", "is a table: set one of its keys, e.g. mqtt.tls."),
    ("mqtt.port=x", "mqtt.port", "must be an integer"),
    ("mqtt.port=99999", "mqtt.port", "must be >= 1 and <= 65535"),
    ("control.decision_hz=500", "control.decision_hz", "must not exceed control.rate_hz"),
    ("mqtt.tls.insecure=true", "mqtt.tls.insecure", "has no effect without TLS"),
])
def test_bad_overrides(tmp_path: Path, item: str, key: str, why: str) -> None:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, overrides=[item])
    assert ei.value.key == key and why in ei.value.why
    if key != "--set":
        assert ei.value.source == f"{tmp_path / 'edge-agent.toml'} (--set)"


def test_override_of_a_secret_with_an_unknown_key_is_not_echoed(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as ei:
        load(tmp_path, overrides=["mqtt.passwd=hunter2-secret"])
    assert "did you mean mqtt.password?" in ei.value.why
    assert "hunter2-secret" not in str(ei.value)
