"""What hil/footprint.py reads from /proc, and the import walk in a fresh interpreter.

- `rollup(pid)`: /proc/PID/smaps_rollup (RSS, PSS, USS = private clean + dirty, anonymous).
- `parts(pid)`: /proc/PID/smaps, each mapping's RSS put in one part: the shared objects by
  package (onnxruntime, numpy, libpython, …), the main malloc arena (`[heap]`), glibc's thread
  arenas (a read-write head on a 64 MiB-aligned reservation whose rest is PROT_NONE), thread
  stacks (a read-write block right above a one-page PROT_NONE guard), and the other anonymous
  memory (pymalloc's 1 MiB arenas, which the kernel merges when adjacent, and large mallocs).
- `cpu_s(pid)`: utime + stime of the whole process (all threads), in seconds.
- `import_walk(modules, ...)`: a fresh interpreter (`python -c`, nothing imported but what the
  interpreter itself brings) imports `modules` in the given order (the daemon's completion
  order from `-X importtime`: a module's own imports complete before it, so each step costs
  only itself) and reads its RSS after each; then builds the policy session the daemon builds
  (edge_agent.inference.providers' options) and runs it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

_MAP = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S+) \S+ \S+ \S+\s*(.*)$")
_ARENA = 64 << 20  # glibc's HEAP_MAX_SIZE on 64-bit: a thread arena reserves this, aligned
CLK_TCK = os.sysconf("SC_CLK_TCK")


def rollup(pid: int) -> dict[str, int]:
    """smaps_rollup in bytes: rss, pss, uss, anon, file (rss - anon), swap."""
    kb: dict[str, int] = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            p = line.split()
            if len(p) >= 3 and p[-1] == "kB":
                kb[p[0].rstrip(":")] = int(p[1]) * 1024
    return {"rss": kb["Rss"], "pss": kb["Pss"], "uss": kb["Private_Clean"] + kb["Private_Dirty"],
            "anon": kb["Anonymous"], "file": kb["Rss"] - kb["Anonymous"], "swap": kb["Swap"]}


def threads(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/task"))


def cpu_s(pid: int) -> float:
    """utime + stime of every thread of `pid` so far (s)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> dict[str, int]:
    """The direct children of `pid` by role: guardian, rig (the simulated robot), other."""
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            kids = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            continue
        for k in kids:
            try:
                cmd = Path(f"/proc/{k}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            role = ("guardian" if "link.guardian" in cmd else "rig" if "hil.rig" in cmd
                    else f"other:{k}")
            out[role] = int(k)
    return out


def _lib_part(path: str) -> str:
    for key, part in (("onnxruntime", "onnxruntime .so"), ("numpy", "numpy .so (+ OpenBLAS)"),
                      ("libpython", "libpython"), ("libcrypto", "libcrypto/libssl"),
                      ("libssl", "libcrypto/libssl"), ("libstdc++", "libstdc++"),
                      ("/site-packages/", "other extension modules"),
                      ("/lib-dynload/", "stdlib extension modules")):
        if key in path:
            return part
    return "system libraries (libc, libm, …)" if path.startswith("/") else f"other {path}"


def parts(pid: int) -> dict[str, int]:
    """RSS (bytes) per part of the address space (see the module doc)."""
    maps: list[tuple[int, int, str, str, int]] = []  # start, end, perms, name, rss
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            m = _MAP.match(line)
            if m:
                maps.append((int(m[1], 16), int(m[2], 16), m[3], m[4].strip(), 0))
            elif line.startswith("Rss:") and maps:
                s, e, p, n, _ = maps[-1]
                maps[-1] = (s, e, p, n, int(line.split()[1]) * 1024)
    out: dict[str, int] = {}
    for i, (start, end, _, name, rss) in enumerate(maps):
        if not rss:
            continue
        prev = maps[i - 1] if i else None
        nxt = maps[i + 1] if i + 1 < len(maps) else None
        if name == "[heap]":
            part = "malloc main arena ([heap])"
        elif name == "[stack]":
            part = "main thread stack"
        elif name.startswith("["):
            part = f"kernel {name}"
        elif name:
            part = _lib_part(name)
        elif (start % _ARENA == 0 and nxt is not None and nxt[0] == end and nxt[2] == "---p"
              and nxt[1] - start == _ARENA):
            part = "malloc thread arenas"
        elif (prev is not None and prev[1] == start and prev[2] == "---p"
              and prev[1] - prev[0] == 4096):
            part = "thread stacks"
        else:
            part = "other anonymous (pymalloc arenas, large blocks)"
        out[part] = out.get(part, 0) + rss
    return out


_WALK = r"""
import json, sys, time
def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE
import os
PAGE = os.sysconf("SC_PAGE_SIZE")
mods, model, threads = json.loads(sys.stdin.read())
out = {"interpreter": rss(), "steps": []}
for m in mods:
    before = rss()
    t0 = time.perf_counter()
    try:
        __import__(m)
        ok = True
    except Exception as exc:
        ok = repr(exc)
    out["steps"].append([m, rss() - before, time.perf_counter() - t0, ok])
if model:
    import numpy as np
    import onnxruntime as ort
    from edge_agent.inference.providers import configure_session_options
    before = rss()
    s = ort.InferenceSession(model, sess_options=configure_session_options(
        ort.SessionOptions(), threads), providers=["CPUExecutionProvider"])
    out["session"] = rss() - before
    i = s.get_inputs()[0]
    x = np.zeros((1, i.shape[1]), dtype=np.float32)
    before = rss()
    for _ in range(1000):
        s.run(None, {i.name: x})
    out["runs"] = rss() - before
out["total"] = rss()
print(json.dumps(out))
"""


def group_of(module: str) -> str:
    top = module.split(".", 1)[0]
    if top in sys.stdlib_module_names or (top.startswith("_") and top != "_cffi_backend"):
        return "stdlib"
    return {"lz4": "mcap (+lz4, zstandard)", "zstandard": "mcap (+lz4, zstandard)",
            "mcap": "mcap (+lz4, zstandard)", "serial": "pyserial", "paho": "paho-mqtt",
            "_cffi_backend": "cryptography", "typing_extensions": "typing_extensions"
            }.get(top, top)


def import_walk(modules: list[str], model: str | None, threads: int = 1,
                env: dict[str, str] | None = None) -> dict[str, Any]:
    """The walk (see the module doc): interpreter RSS, per-group RSS delta and import seconds,
    the session's RSS delta, the total."""
    proc = subprocess.run([sys.executable, "-c", _WALK], input=json.dumps(
        [modules, model, threads]), capture_output=True, text=True, check=True,
        env=env or os.environ.copy(), timeout=300)
    raw = json.loads(proc.stdout)
    groups: dict[str, dict[str, float]] = {}
    failed = []
    for m, delta, secs, ok in raw["steps"]:
        g = groups.setdefault(group_of(m), {"rss": 0, "s": 0.0, "modules": 0})
        g["rss"] += delta
        g["s"] += secs
        g["modules"] += 1
        if ok is not True:
            failed.append(m)
    top = sorted(raw["steps"], key=lambda st: -st[1])[:15]
    return {"interpreter": raw["interpreter"], "groups": groups, "session": raw.get("session"),
            "runs": raw.get("runs"), "total": raw["total"], "failed": failed,
            "largest": [[m, delta] for m, delta, _, _ in top]}


def importtime_modules(log_text: str) -> list[str]:
    """The modules `-X importtime` reported, each once, ordered for the walk: group by group
    (`group_of`), a group after every group it imported (its tree's nesting: numpy before
    onnxruntime, stdlib first), each group's modules in completion order. A package's
    `__init__` completes after what it imports, so completion order alone would import a
    package's first-completed submodule with the whole package (and its dependencies)
    behind it."""
    lines: list[tuple[int, str]] = []
    for line in log_text.splitlines():
        if line.startswith("import time:") and line.count("|") == 2:
            field = line.rsplit("|", 1)[1]
            name = field.strip()
            if name and name != "imported package":
                lines.append(((len(field) - len(field.lstrip()) - 1) // 2, name))
    order: dict[str, None] = {}
    first: dict[str, int] = {}
    deps: dict[str, set[str]] = {}
    stack: list[tuple[int, str]] = []
    for level, name in reversed(lines):  # parents before children
        while stack and stack[-1][0] >= level:
            stack.pop()
        if stack:
            parent = group_of(stack[-1][1])
            if parent != group_of(name):
                deps.setdefault(parent, set()).add(group_of(name))
        stack.append((level, name))
    for i, (_, name) in enumerate(lines):
        order.setdefault(name, None)
        first.setdefault(group_of(name), i)
    done: list[str] = []

    def visit(g: str, path: tuple[str, ...]) -> None:
        if g in done or g in path:  # a cycle (threads importing at once): first seen wins
            return
        for d in sorted(deps.get(g, ()), key=lambda x: first.get(x, 0)):
            visit(d, (*path, g))
        done.append(g)

    # the standard library first: every group uses it, and threads importing at once can make
    # its modules look nested under another group's (which would then be charged for them)
    for g in sorted(first, key=lambda g: (g != "stdlib", first[g])):
        visit(g, ())
    rank = {g: i for i, g in enumerate(done)}
    return sorted(order, key=lambda m: rank[group_of(m)])  # stable: completion order within
