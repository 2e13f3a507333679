"""The daemon's parts stand alone: none imports the composition root; every module stays small.

(No module reads another's private names: tests/test_private_names.py, over edge_agent and hil.)
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DAEMON = sorted((ROOT / "edge_agent" / "daemon").glob("*.py"))


@pytest.mark.parametrize("path", [p for p in DAEMON if p.name != "app.py"],
                         ids=lambda p: p.name)
def test_no_part_imports_the_composition_root(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert "edge_agent.daemon.app" not in imported
