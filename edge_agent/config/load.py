"""Loads the daemon's TOML configuration (plus --set overrides) into frozen, validated dataclasses.

    cfg = load_config("configs/sim.toml", ["mqtt.port=1884"], sim=True)
    cfg.mqtt.port, cfg.robot.n_joints, cfg.hash

Every bad value raises ConfigError naming the dotted key, the value and why; unknown keys and
sections are errors with a did-you-mean. Relative paths are resolved against the config file's
directory (paths given with --set: against the working directory); `${CREDENTIALS_DIRECTORY}`,
`${STATE_DIRECTORY}`, `${RUNTIME_DIRECTORY}` and `${CONFIGURATION_DIRECTORY}` (set by systemd) and
`~` are expanded in paths. Secrets (mqtt.password, reports.webhook_url) are `Secret`s: repr '***',
and the config hash leaves them out (it is published: a hash over a password would let anyone
test guesses offline); the *_file keys that name them are hashed as paths. The schema is
edge_agent/config/schema.py; checks that span keys are in edge_agent/config/checks.py. Cheap
to import: stdlib only, no logging.

With `sim=True`, link.port may be absent (None): the daemon fills it with the rig's pty using
`dataclasses.replace`, which keeps `hash` as loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Any

import edge_agent.config.checks as config_checks
from edge_agent.config.checks import LoadContext
from edge_agent.config.schema import (
    SCHEMA_VERSION,
    SECTIONS,
    TOP_LEVEL,
    ControlSection,
    DebugSection,
    DeviceSection,
    ExecutorSection,
    HealthSection,
    InferenceSection,
    JournalSection,
    LinkSection,
    LogSection,
    MqttSection,
    ObserveSection,
    ReportsSection,
    SimSection,
    StoreSection,
)
from edge_agent.config.spec import Secret, Spec
from edge_agent.config.values import Elided, config_keys, convert, read_table, unknown
from edge_agent.errors import ConfigError
from edge_agent.robot import RobotDescription, load_robot

__all__ = ["Config", "load_config", "parse_override"]


@dataclass(frozen=True, slots=True)
class Config:
    """The effective configuration: one attribute per section, the loaded robot, the hash."""

    source: Path
    schema_version: int
    state_dir: Path
    device: DeviceSection
    mqtt: MqttSection
    link: LinkSection
    robot_file: Path
    control: ControlSection
    executor: ExecutorSection
    inference: InferenceSection
    health: HealthSection
    reports: ReportsSection
    journal: JournalSection
    observe: ObserveSection
    store: StoreSection
    log: LogSection
    debug: DebugSection
    sim: SimSection
    robot: RobotDescription = field(repr=False)
    hash: str  # short sha256 of the canonical effective config (published in `status`)
    warnings: tuple[str, ...] = ()  # soft findings; the daemon logs them, check-config prints

    def as_dict(self) -> dict[str, Any]:
        """The effective config as plain data (TOML layout), secrets shown as '***'."""
        return _canonical_doc(self, reveal_digest=False)

    def secret_values(self) -> tuple[str, ...]:
        """The configured secrets in clear, for the log redactor only."""
        found = (self.mqtt.password, self.reports.webhook_url)
        return tuple(s.reveal() for s in found if s is not None)


def load_config(path: str | os.PathLike[str], overrides: Iterable[str] = (), *,
                sim: bool = False) -> Config:
    """Read, override, validate; raise ConfigError (key, value, why, source) on the first fault."""
    if isinstance(overrides, str):
        raise TypeError("overrides is a list of KEY=VALUE strings, not one string")
    p = Path(path)
    ctx = LoadContext(source=str(p), base_dir=p.absolute().parent, cwd=Path.cwd(), sim=sim)
    raw = _read_toml(p)
    for item in overrides:
        _apply_override(raw, item, ctx)
    version = raw.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        why = "is required" if version is None else "unsupported"
        raise ctx.fail("schema_version", version,
                       f"{why} (this edge-agent reads schema_version = {SCHEMA_VERSION})")
    known_top = [*TOP_LEVEL, *SECTIONS]
    for k in raw:
        if k not in known_top:
            raise unknown(k, raw[k], known_top, ctx)
    if "state_dir" not in raw:
        raise ctx.fail("state_dir", None, "is required (where snapshots, journal and the control "
                                          "socket live); it goes before the first [section]")
    state_dir = convert(TOP_LEVEL["state_dir"], raw["state_dir"], "state_dir", ctx)
    values: dict[str, dict[str, Any]] = {}
    for name, cls in SECTIONS.items():
        table = raw.get(name, {})
        if not isinstance(table, Mapping):
            raise ctx.fail(name, table, f"must be a table ([{name}])")
        values[name] = read_table(cls, table, f"{name}.", ctx)
    config_checks.fill_derived(values, state_dir, ctx)
    config_checks.check(values, ctx)
    robot_file: Path = values["robot"]["description"]
    try:
        robot = load_robot(robot_file)
        robot_digest = hashlib.sha256(robot_file.read_bytes()).hexdigest()
    except ConfigError as exc:
        if exc.source:
            raise
        raise ctx.fail(exc.key, exc.value, exc.why) from None
    except OSError as exc:
        raise ctx.fail("robot.description", str(robot_file), f"cannot be read: {exc}") from None
    config_checks.check_robot(values, robot, ctx)
    built = {name: _build(cls, values[name]) for name, cls in SECTIONS.items()}
    del built["robot"]
    cfg = Config(source=p, schema_version=SCHEMA_VERSION, state_dir=state_dir,
                 robot_file=robot_file, robot=robot, hash="", warnings=tuple(ctx.warnings),
                 **built)
    doc = _canonical_doc(cfg, reveal_digest=False)  # secrets as '***': not in the hash
    doc["robot"]["sha256"] = robot_digest
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    return replace(cfg, hash=hashlib.sha256(blob).hexdigest()[:12])


def parse_override(item: str) -> tuple[str, Any, str]:
    """`KEY=VALUE` → (key, value parsed as TOML when it parses, else the text, raw text)."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError("--set", item, "expected KEY=VALUE, e.g. mqtt.port=1884")
    value: Any = text
    if "\n" not in text and "\r" not in text:
        try:
            value = tomllib.loads(f"v = {text}")["v"]
        except tomllib.TOMLDecodeError:
            value = text
    return key, value, text


# --------------------------------------------------------------------------- reading


def _read_toml(p: Path) -> dict[str, Any]:
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError("(file)", str(p), "file not found", str(p)) from None
    except IsADirectoryError:
        raise ConfigError("(file)", str(p), "is a directory, not a config file", str(p)) from None
    except OSError as exc:
        raise ConfigError("(file)", str(p), f"cannot be read: {exc.strerror}", str(p)) from None
    except UnicodeDecodeError:
        raise ConfigError("(file)", str(p), "is not UTF-8 text", str(p)) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        # The message never quotes the line: it could hold a password.
        m = re.search(r"\(at line (\d+), column \d+\)", str(exc))
        where = f"line {m.group(1)}" if m else "?"
        msg = re.sub(r"\s*\(at line.*\)$", "", str(exc))
        raise ConfigError("(syntax)", where, f"not valid TOML: {msg}", str(p)) from None


def _apply_override(raw: dict[str, Any], item: str, ctx: LoadContext) -> None:
    key, value, text = parse_override(item)
    parts = key.split(".")
    try:
        spec = _override_spec(key, value, ctx)
        if spec.kind == "table":
            example = next(k for k in config_keys() if k.startswith(key + "."))
            raise ConfigError(key, Elided(), f"is a table: set one of its keys, e.g. {example}=...")
    except ConfigError as exc:
        raise ConfigError(exc.key, exc.value, exc.why, f"{ctx.source} (--set)") from None
    ctx.overridden.add(key)
    if spec.kind in ("str", "secret", "path") and not isinstance(value, str):
        value = text  # `--set mqtt.protocol=5`, `--set mqtt.password=1234` are strings
    node = raw
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(part, child, f"must be a table ([{part}])", ctx.source)
        node = child
    if text == "" and not spec.required:
        node.pop(parts[-1], None)  # `--set reports.webhook_url=` unsets an optional key
    else:
        node[parts[-1]] = value


def _override_spec(key: str, value: Any, ctx: LoadContext) -> Spec:
    parts = key.split(".")
    spec: Spec | None = TOP_LEVEL.get(key)
    if spec is None and parts[0] in SECTIONS:
        spec = Spec("table", table=SECTIONS[parts[0]])
        for part in parts[1:]:
            by_name = {f.name: f.metadata["spec"] for f in fields(spec.table)} if spec.table else {}
            spec = by_name.get(part)
            if spec is None:
                break
    if spec is None:
        raise unknown(key, value, [*config_keys(), *SECTIONS], ctx)
    return spec


# --------------------------------------------------------------------------- building, hashing


def _build(cls: type, vals: dict[str, Any]) -> Any:
    kw = {}
    for f in fields(cls):
        spec: Spec = f.metadata["spec"]
        v = vals[f.name]
        kw[f.name] = _build(spec.table, v) if spec.table is not None else v
    return cls(**kw)


def _plain(obj: Any, reveal_digest: bool) -> Any:
    if isinstance(obj, Secret):
        return f"sha256:{obj.digest()}" if reveal_digest else "***"
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, tuple):
        return [_plain(x, reveal_digest) for x in obj]
    if is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name), reveal_digest) for f in fields(obj)}
    return obj


def _canonical_doc(cfg: Config, *, reveal_digest: bool) -> dict[str, Any]:
    doc: dict[str, Any] = {"schema_version": cfg.schema_version, "state_dir": str(cfg.state_dir)}
    for name in SECTIONS:
        if name == "robot":
            doc[name] = {"description": str(cfg.robot_file)}
        else:
            doc[name] = _plain(getattr(cfg, name), reveal_digest)
    return doc


