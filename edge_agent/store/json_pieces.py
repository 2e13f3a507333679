"""JSON text in small pieces, so that no single C call holds the GIL for long.

`json.dumps` runs its C encoder in one call: a repair report's sensor window (500 rows of 11
numbers, ~36 kB) took 2-4 ms of the GIL on this project's machine — long enough to make the
500 Hz control thread miss periods each time the outbox persisted an entry (issue #19's fault
storm). `dumps(obj)` gives exactly `json.dumps(obj, separators=(",", ":"), **kw)` but encodes
the containers itself and hands the C encoder only leaves and short runs of scalars, so the
interpreter can switch threads between pieces (`sys.setswitchinterval`).
"""

from __future__ import annotations

import json
from typing import Any

PIECE = 256  # scalars handed to the C encoder at once (~0.05 ms; a window's row has ~11)
_SCALARS = (str, int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)


def dumps(obj: Any, *, piece: int = PIECE, **kw: Any) -> str:
    """`json.dumps(obj, separators=(",", ":"), **kw)`, built from small pieces."""
    kw["separators"] = (",", ":")
    out: list[str] = []
    _encode(obj, out, piece, kw)
    return "".join(out)


def _encode(obj: Any, out: list[str], piece: int, kw: dict[str, Any]) -> None:
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):  # json's key coercion: leave it to json
            out.append(json.dumps(obj, **kw))
            return
        out.append("{")
        for i, (k, v) in enumerate(obj.items()):
            out.append(("," if i else "") + json.dumps(k, **kw) + ":")
            _encode(v, out, piece, kw)
        out.append("}")
    elif isinstance(obj, list | tuple):
        sizes = [_flat_size(v) for v in obj]
        if all(n is not None for n in sizes):  # scalars and flat rows: in slices of ~`piece`
            slices, start, count = [], 0, 0
            for i, n in enumerate(sizes):
                count += n or 1  # type: ignore[operator]
                if count >= piece or i == len(obj) - 1:
                    slices.append(json.dumps(obj[start:i + 1], **kw)[1:-1])
                    start, count = i + 1, 0
            out.append("[" + ",".join(slices) + "]")
            return
        out.append("[")
        for i, v in enumerate(obj):
            if i:
                out.append(",")
            _encode(v, out, piece, kw)
        out.append("]")
    else:
        out.append(json.dumps(obj, **kw))


def _flat_size(v: Any) -> int | None:
    """1 for a scalar, its length for a list of scalars; None for anything deeper."""
    t = type(v)
    if t in _SCALAR_TYPES:
        return 1
    if (t is list or t is tuple) and set(map(type, v)) <= _SCALAR_TYPES:  # C loops: cheap
        return len(v)
    return None
