"""The house as a newcomer reads it: no import circle between edge_agent's modules, no module over
400 lines (issue #17). Every import counts — TYPE_CHECKING blocks and lazy imports inside
functions too: a circle hidden behind a lazy import is still a circle to the reader."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "edge_agent"
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = p.relative_to(REPO).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = p
    return out


def import_graph(mods: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the edge_agent modules it imports (a package's submodule when named)."""
    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, path in mods.items():
        for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(n, ast.Import):
                targets = [a.name for a in n.names]
            elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
                # `from pkg import sub` imports pkg.sub (a module) or a name of pkg itself
                targets = [f"{n.module}.{a.name}" if f"{n.module}.{a.name}" in mods else n.module
                           for a in n.names]
            for t in targets:
                r = resolve(t) if t.startswith("edge_agent") else None
                if r is not None and r != m:
                    graph[m].add(r)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_no_import_circle_in_edge_agent() -> None:
    found = cycles(import_graph(_modules()))
    assert found == [], f"import circles: {found}"


def test_the_cycle_finder_finds_one() -> None:
    """The check can fail: a -> b -> c -> a is found, a tree is not."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []


def test_no_edge_agent_module_is_over_400_lines() -> None:
    big = {str(p.relative_to(REPO)): n for p in sorted(PKG.rglob("*.py"))
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert big == {}, f"modules over {MAX_LINES} lines: {big}"
