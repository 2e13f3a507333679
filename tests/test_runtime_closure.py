"""What `pip install` of the wheel without extras puts on a robot: no scipy, no filterpy.

The runtime closure is walked from pyproject's `[project] dependencies` through each installed
distribution's own requirements (importlib.metadata; no network, no build), markers evaluated for
this machine without extras. filterpy is the tests' reference for the Kalman estimators (the dev
extra): nothing the wheel ships (edge_agent/, hil/) may import it or scipy. docs/INSTALL.md lists
the closure: the list there must name exactly these distributions.
"""

from __future__ import annotations

import ast
import re
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
NOT_ON_A_ROBOT = {"scipy", "filterpy"}


def _requirements() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def _applies(req: Requirement, extras: set[str]) -> bool:
    """The requirement's marker holds on this machine with one of `extras` (or none) asked."""
    return req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""})


def runtime_closure() -> dict[str, set[str]]:
    """Every distribution installing the wheel without extras pulls in -> who requires it."""
    seen: dict[str, set[str]] = {}
    todo = [(r, "edge-agent") for r in _requirements() if _applies(r, set())]
    while todo:
        req, parent = todo.pop()
        name = canonicalize_name(req.name)
        first = name not in seen
        seen.setdefault(name, set()).add(parent)
        if not first:
            continue
        try:
            dist = metadata.distribution(req.name)
        except metadata.PackageNotFoundError:
            continue  # not installed here (a platform marker we evaluated true): named anyway
        todo += [(sub, name) for sub in map(Requirement, dist.requires or [])
                 if _applies(sub, set(req.extras))]
    return seen


def test_the_runtime_closure_has_no_scipy_nor_filterpy() -> None:
    closure = runtime_closure()
    assert {"paho-mqtt", "numpy", "onnxruntime", "matplotlib"} <= closure.keys(), closure
    assert not closure.keys() & NOT_ON_A_ROBOT, {n: closure[n] for n in
                                                 closure.keys() & NOT_ON_A_ROBOT}


def test_filterpy_is_only_in_the_dev_extra() -> None:
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    holders = {k for k, reqs in extras.items()
               if any(canonicalize_name(Requirement(r).name) == "filterpy" for r in reqs)}
    assert holders == {"dev"}, holders


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_nothing_the_wheel_ships_imports_scipy_or_filterpy() -> None:
    """edge_agent/ and hil/ (pyproject's packages) — every import, lazy ones included."""
    files = [p for pkg in ("edge_agent", "hil") for p in sorted((REPO / pkg).rglob("*.py"))]
    assert len(files) > 100, len(files)
    bad = {str(p.relative_to(REPO)): hits for p in files
           if (hits := _imported_modules(p) & NOT_ON_A_ROBOT)}
    assert not bad, bad


def test_install_md_lists_the_runtime_closure() -> None:
    """docs/INSTALL.md's closure table names exactly the distributions the walk finds."""
    text = (REPO / "docs" / "INSTALL.md").read_text()
    start = text.index("<!-- runtime closure -->")
    end = text.index("<!-- /runtime closure -->")
    listed = {canonicalize_name(m) for m in re.findall(r"^\| `([A-Za-z0-9_.-]+)`", text[start:end],
                                                       flags=re.M)}
    closure = set(runtime_closure())
    assert listed == closure, {"documented, not pulled in": listed - closure,
                               "pulled in, not documented": closure - listed}
