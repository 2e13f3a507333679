"""store/json_pieces.py: the same text as json.dumps, from pieces the C encoder makes quickly."""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from enum import StrEnum
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.store import json_pieces


class Color(StrEnum):
    RED = "red"


SAMPLES: list[Any] = [
    {}, [], (), "", 0, -1.5, None, True, "é\n\"x\"", [[]], [[], [1]], {"a": []},
    {"window": {"columns": ["t", "q0"], "rows": [[0.1 * i, -i, None, "x"] for i in range(600)]}},
    list(range(1000)), [1, [2, [3, [4]]], {"k": (5, 6)}], {"e": Color.RED, "l": [Color.RED, 1]},
    {1: "int key", "s": 2},  # json coerces non-str keys: left to json
]

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5),
                    st.floats(allow_nan=False, allow_infinity=False))
values = st.recursive(scalars, lambda kids: st.one_of(
    st.lists(kids, max_size=40), st.dictionaries(st.text(max_size=4), kids, max_size=6)),
    max_leaves=300)


@pytest.mark.parametrize("obj", SAMPLES, ids=range(len(SAMPLES)))
def test_the_text_is_json_dumps_text(obj: Any) -> None:
    for kw in ({}, {"ensure_ascii": False}, {"allow_nan": False}):
        assert json_pieces.dumps(obj, **kw) == json.dumps(obj, separators=(",", ":"), **kw)


@settings(max_examples=300, deadline=None)
@given(values, st.integers(1, 50))
def test_any_json_value_any_piece_size(obj: Any, piece: int) -> None:
    assert json_pieces.dumps(obj, piece=piece) == json.dumps(obj, separators=(",", ":"))


def test_nan_is_refused_as_json_refuses_it() -> None:
    with pytest.raises(ValueError):
        json_pieces.dumps({"rows": [[1.0, math.nan]] * 300}, allow_nan=False)
    assert json_pieces.dumps([math.inf]) == "[Infinity]"


def test_another_thread_runs_while_a_big_window_is_encoded() -> None:
    """The point of the module: json.dumps of a big window is one C call (no thread switch
    inside it); in pieces, a thread that wants the GIL gets it within a few pieces."""
    rows = [[round(0.001 * i, 4), *(0.5 + 1e-6 * j for j in range(10))] for i in range(20_000)]
    obj = {"rows": rows}
    gaps: list[float] = []
    stop, running = threading.Event(), threading.Event()

    def ticker() -> None:  # notes how long it waited between two of its own steps
        last = time.perf_counter()
        running.set()
        while not stop.is_set():
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0002)
    t = threading.Thread(target=ticker)
    t.start()
    try:
        assert running.wait(10.0)
        gaps.clear()
        t0 = time.perf_counter()
        json.dumps(obj, separators=(",", ":"))
        whole = time.perf_counter() - t0
        in_c = max(gaps, default=0.0)
        gaps.clear()
        text = json_pieces.dumps(obj)
        pieces = max(gaps, default=0.0)
    finally:
        stop.set()
        t.join()
        sys.setswitchinterval(old)
    assert text == json.dumps(obj, separators=(",", ":"))
    # the C encoder shut the ticker out for about the whole encode; the pieces did not
    why = (f"encode {whole * 1e3:.1f} ms; longest wait: C {in_c * 1e3:.1f}, "
           f"pieces {pieces * 1e3:.2f}")
    assert in_c > 0.5 * whole, why  # (here: 82-174 ms against 86-179 ms)
    assert pieces < in_c / 3, why  # (here: 4-6 ms, a collection in this process included)
