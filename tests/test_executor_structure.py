"""The executor's shape (#17): small modules; nothing outside it reads its private names."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXECUTOR = ROOT / "edge_agent" / "executor"
# Names the daemon, the benches and the tests give an Executor (or its owner's attribute).
EXECUTOR_NAMES = {"executor", "_executor", "ex", "exe"}


def _py(*dirs: Path) -> list[Path]:
    return sorted(p for d in dirs for p in d.rglob("*.py") if ".venv" not in p.parts)


def test_nothing_outside_the_executor_reads_an_executor_private_name() -> None:
    found = []
    for path in _py(ROOT / "edge_agent", ROOT / "hil", ROOT / "tests"):
        if EXECUTOR in path.parents:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            owner = node.value
            name = (owner.id if isinstance(owner, ast.Name)
                    else owner.attr if isinstance(owner, ast.Attribute) else None)
            if name in EXECUTOR_NAMES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}.{node.attr}")
    assert found == []


def test_executor_modules_import_no_private_name() -> None:
    found = [f"{p.name}: from {n.module} import {a.name}"
             for p in _py(EXECUTOR) for n in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
             if isinstance(n, ast.ImportFrom) for a in n.names
             if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
