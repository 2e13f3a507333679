"""A CPU session's input and output bound once to numpy buffers (onnxruntime's IOBinding).

`OnnxBackend.submit` otherwise builds a fresh input array per decision and `session.run` checks
the feed's names, allocates the output and wraps it in a list: ~1.5 µs of a ~5 µs decision here
(hil/bench_inference). Bound, a decision copies the observation into the input buffer, runs, and
reads the scores out of the output buffer. Only for sessions on the CPU with one float input of
shape (1, width) and one float output of a fixed shape (`bind` says None otherwise: the caller
keeps the plain `session.run`). One thread at a time: `scores` answers None while another thread
runs it, and that caller takes the plain path (no thread ever waits here).
"""

from __future__ import annotations

import threading
from typing import Any

from edge_agent.inference.backend import Row

_FLOAT = "tensor(float)"


class BoundRun:
    """One session's bound buffers; see the module docstring."""

    __slots__ = ("_binding", "_in", "_lock", "_out", "_run", "_width")

    def __init__(self, session: Any, x_name: str, y_name: str, np: Any, width: int,
                 y_shape: tuple[int, ...]) -> None:
        self._width = width
        self._in = np.zeros((1, width), dtype=np.float32)
        self._out = np.zeros(y_shape, dtype=np.float32)
        binding = session.io_binding()
        binding.bind_cpu_input(x_name, self._in)
        binding.bind_output(y_name, "cpu", 0, np.float32, list(y_shape), self._out.ctypes.data)
        self._binding = binding
        self._run = session.run_with_iobinding
        self._lock = threading.Lock()

    def scores(self, row: Row) -> list[float] | None:
        """The model's first output row for `row`; None while another thread runs it, or for a
        row of the wrong width (the plain run then reports what onnxruntime says of it)."""
        if len(row) != self._width or not self._lock.acquire(blocking=False):
            return None
        try:
            self._in[0] = row
            self._run(self._binding)
            out: list[float] = self._out[0].tolist()
            return out
        finally:
            self._lock.release()


def bind(session: Any, np: Any, width: int, y: Any) -> BoundRun | None:
    """A BoundRun for a CPU `session` whose last warm-up output was `y`, or None where the
    session cannot be bound that way (not onnxruntime's, several inputs/outputs, not float)."""
    if not hasattr(session, "io_binding") or not hasattr(session, "run_with_iobinding"):
        return None
    ins, outs = session.get_inputs(), session.get_outputs()
    if len(ins) != 1 or len(outs) != 1 or ins[0].type != _FLOAT or outs[0].type != _FLOAT:
        return None
    if getattr(y, "dtype", None) != np.float32 or y.ndim != 2 or y.shape[0] != 1:
        return None
    try:
        return BoundRun(session, ins[0].name, outs[0].name, np, width, tuple(y.shape))
    except Exception:  # an onnxruntime without IOBinding on this build: the plain path
        return None
