"""Every key of the config schema is read by the code it configures (no documented dead keys).

An AST scan of edge_agent/ outside the config package. A key `section.field` is read when a
module reads `x.section.field`, or `t.field` after `t = x.section`, or `p.field` in a module
that names the section's class (`MqttSection`: a function handed that section). A sub-table's
keys (`mqtt.tls.ca_file`) need `x.tls.ca_file` or `MqttTlsSection` likewise.
`getattr(x.table, name)` counts for each of the table's field names the module spells as a string,
or for all of them where the module walks the table's fields (`x.table.__dataclass_fields__`).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from dataclasses import fields
from pathlib import Path

from edge_agent.config.schema import SECTIONS
from edge_agent.config.spec import Spec

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "edge_agent"

# Keys the loader itself consumes: each becomes another key's value, which must then be read.
LOADER_INPUTS = {
    "mqtt.password_file": "mqtt.password",  # the password file is read into mqtt.password
    "reports.webhook_url_file": "reports.webhook_url",  # likewise the webhook URL
    "robot.description": "robot",  # loaded into cfg.robot (and cfg.robot_file)
}


class _Module:
    """What one module reads: `(table attribute, field)` pairs and fields read off a bare name."""

    def __init__(self, source: str) -> None:
        tree = ast.parse(source)
        self.source = source
        self.chains: set[tuple[str, str]] = set()  # `x.table.field`, or `t = x.table` ... `t.field`
        self.off_names: set[str] = set()  # `param.field`: counts where the table's class is named
        self.strings: set[str] = set()
        self.getattr_on: set[str] = set()  # `getattr(x.table, ...)`: the table's attribute name
        self.all_fields: set[str] = set()  # `x.table.__dataclass_fields__` / `fields(x.table)`
        bound: dict[str, set[str]] = {}  # local name -> the table attributes assigned to it
        for n in ast.walk(tree):
            if (isinstance(n, ast.Assign) and isinstance(n.value, ast.Attribute)
                    and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)):
                bound.setdefault(n.targets[0].id, set()).add(n.value.attr)
        for n in ast.walk(tree):
            if isinstance(n, ast.Attribute):
                if isinstance(n.value, ast.Attribute):
                    self.chains.add((n.value.attr, n.attr))
                elif isinstance(n.value, ast.Name):
                    self.off_names.add(n.attr)
                    self.chains.update((t, n.attr) for t in bound.get(n.value.id, ()))
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                self.strings.add(n.value)
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.args
                    and isinstance(n.args[0], ast.Attribute)):
                if n.func.id == "getattr":
                    self.getattr_on.add(n.args[0].attr)
                elif n.func.id == "fields":
                    self.all_fields.add(n.args[0].attr)
            if (isinstance(n, ast.Attribute) and n.attr == "__dataclass_fields__"
                    and isinstance(n.value, ast.Attribute)):
                self.all_fields.add(n.value.attr)

    def reads(self, table_attr: str, cls: type, name: str) -> bool:
        return ((table_attr, name) in self.chains
                or (name in self.off_names and re.search(rf"\b{cls.__name__}\b", self.source)
                    is not None)
                or (table_attr in self.getattr_on
                    and (name in self.strings or table_attr in self.all_fields)))


def _modules() -> list[_Module]:
    out = []
    for p in sorted(PKG.rglob("*.py")):
        if (PKG / "config") in p.parents:
            continue
        out.append(_Module(p.read_text(encoding="utf-8")))
    return out


def _keys() -> Iterator[tuple[str, str, type, str]]:
    """(dotted key, the attribute naming its table, the table's class, the field name)."""
    def walk(cls: type, prefix: str, attr: str) -> Iterator[tuple[str, str, type, str]]:
        for f in fields(cls):
            spec: Spec = f.metadata["spec"]
            if spec.kind == "table" and spec.table is not None:
                yield from walk(spec.table, f"{prefix}{f.name}.", f.name)
            else:
                yield prefix + f.name, attr, cls, f.name

    for name, cls in SECTIONS.items():
        yield from walk(cls, f"{name}.", name)


def _unread() -> list[str]:
    mods = _modules()
    unread = []
    for key, attr, cls, name in _keys():
        target = LOADER_INPUTS.get(key)
        if target == "robot":
            # the description is loaded into cfg.robot (the daemon's robot) and its path kept
            # as cfg.robot_file (the guardian and the rig load it themselves)
            cfg_names = ("cfg", "config")
            if not (any((c, "robot") in m.chains for m in mods for c in cfg_names)
                    and any((c, "robot_file") in m.chains for m in mods for c in cfg_names)):
                unread.append(key)
            continue
        if target is not None:
            key, name = target, target.rpartition(".")[2]
        if not any(m.reads(attr, cls, name) for m in mods):
            unread.append(key)
    return unread


def test_every_config_key_is_read_by_the_code_it_configures() -> None:
    unread = _unread()
    assert unread == [], (f"config keys nothing in edge_agent reads: {unread} — wire each to the "
                          "code it configures, or delete it from the schema, sim.toml and docs")


def test_the_scan_sees_a_key_that_nothing_reads() -> None:
    """The scan can fail: a module that never touches `fault_after` does not count as reading it."""
    m = _Module("def f(cfg):\n    return cfg.link.baudrate\n")
    link = SECTIONS["link"]
    assert m.reads("link", link, "baudrate")
    assert not m.reads("link", link, "fault_after")
    assert not _Module("x.fault_after\n").reads("link", link, "fault_after")
    # a `.link` and a `.fault_after` in one module are not enough: not the same object
    assert not _Module("self.link = 1\nargs.fault_after\n").reads("link", link, "fault_after")
    assert _Module("ln = cfg.link\nln.fault_after\n").reads("link", link, "fault_after")
    walk = "{k: getattr(h.link, k) for k in h.link.__dataclass_fields__}\n"
    assert _Module(walk).reads("link", link, "fault_after")
    assert not _Module("getattr(h.link, k)\n").reads("link", link, "fault_after")
