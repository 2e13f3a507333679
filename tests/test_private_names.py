"""No module reaches into another module's private names (issue #17's "Done means").

An AST scan of edge_agent/ and hil/ (the code; tests may touch the privates of what they test)
for two things:

1. `from m import _name`: a private name of another module.
2. `obj._name` read where `obj` is not `self`/`cls` and `_name` is defined nowhere in the same
   module's source (no `def _name`, `class _name`, `_name = …`, `x._name = …`, `__slots__`
   entry, parameter or import alias). So a class comparing `other._x` of its own kind, or a
   module using its own `_helper`, passes; `daemon._tick` from another file does not.
   `getattr(obj, "_name")` with a literal name counts the same way.

Dunder names are public. `os._exit` and the namedtuple API (`_replace`, `_asdict`, `_fields`,
`_make`) are public despite the underscore.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCANNED = ("edge_agent", "hil")

PUBLIC_DESPITE_UNDERSCORE = frozenset({"_exit", "_replace", "_asdict", "_fields", "_make"})

# Violations in files other engineers are changing now; a violation that is gone must leave the
# list too (checked below), so it cannot go stale. Empty since the daemon's parts got their
# collaborators injected (#17 items 2 and 3).
KNOWN: frozenset[str] = frozenset()


def _private(name: str) -> bool:
    dunder = name.startswith("__") and name.endswith("__")
    return name.startswith("_") and not dunder and name not in PUBLIC_DESPITE_UNDERSCORE


def _defined_here(tree: ast.AST) -> set[str]:
    """Every name the module itself defines or binds, at any depth."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
            names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__slots__" for t in node.targets):
            names |= {c.value for c in ast.walk(node.value)
                      if isinstance(c, ast.Constant) and isinstance(c.value, str)}
    return names


def violations_in(source: str) -> list[str]:
    """`obj._name` / `from m import _name` findings in one module's source, as `expr._name`."""
    tree = ast.parse(source)
    here = _defined_here(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if _private(a.name)]
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
            owner = node.value
            if isinstance(owner, ast.Name) and owner.id in ("self", "cls"):
                continue
            if _private(node.attr) and node.attr not in here:
                found.append(f"{ast.unparse(owner)}.{node.attr}")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr") and len(node.args) >= 2):
            owner, name = node.args[0], node.args[1]
            if (isinstance(name, ast.Constant) and isinstance(name.value, str)
                    and _private(name.value) and name.value not in here
                    and not (isinstance(owner, ast.Name) and owner.id in ("self", "cls"))):
                found.append(f"{ast.unparse(owner)}.{name.value}")
    return found


def _scan() -> set[str]:
    out: set[str] = set()
    for top in SCANNED:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO).as_posix()
            out |= {f"{rel}: {v}" for v in violations_in(path.read_text(encoding="utf-8"))}
    return out


def test_no_module_touches_another_modules_private_names() -> None:
    new = sorted(_scan() - KNOWN)
    assert not new, "private names of another module:\n" + "\n".join(new)


def test_the_known_list_holds_only_violations_that_still_exist() -> None:
    gone = sorted(KNOWN - _scan())
    assert not gone, "fixed — take these out of KNOWN:\n" + "\n".join(gone)


def test_the_rule_catches_what_it_should_and_passes_what_it_should() -> None:
    assert violations_in("from edge_agent.daemon.app import _helper\n") == [
        "from edge_agent.daemon.app import _helper"]
    assert violations_in("def f(d):\n    d._tick(1.0)\n") == ["d._tick"]
    assert violations_in("def f(d):\n    return getattr(d, '_stop_event')\n") == [
        "d._stop_event"]
    assert violations_in("import m\nm.a._b\n") == ["m.a._b"]
    own = ("class P:\n    def __init__(self):\n        self._x = 1\n"
           "    def __eq__(self, other):\n        return self._x == other._x\n")
    assert violations_in(own) == []
    assert violations_in("import os\nos._exit(0)\nx.__class__.__name__\nt._replace(a=1)\n") == []
