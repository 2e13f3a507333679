"""Labels per verdict given in a time span, counted in a subprocess for the drift report.

    python -m edge_agent.store.label_counts JOURNAL_DIR START END   # prints {"correct": n, ...}

`count_labels(directory, start, end)` is the count itself (the last label of each decision or
episode wins, as everywhere; a label counts in the span its wall time falls in).
`count_in_subprocess` is the daemon's side: reading the label journal is JSON decoding of up to
its bound (store/labels.py), CPU-bound pure Python that stays out of the daemon (DESIGN.md), so
it runs in its own process at a lower priority with a timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

from edge_agent.store.labels import VERDICTS, latest_labels


def count_labels(directory: str | Path, start: float, end: float) -> dict[str, int]:
    out = dict.fromkeys(VERDICTS, 0)
    for rec in latest_labels(directory).values():
        wall = rec.get("wall")
        if isinstance(wall, int | float) and start <= wall < end:
            out[rec["verdict"]] += 1
    return out


def count_in_subprocess(directory: Path, start: float, end: float, *, timeout_s: float = 60.0,
                        nice: int = 10) -> dict[str, int] | str:
    """The counts, or why there are none (the process failed or took too long)."""
    cmd = [sys.executable, "-m", "edge_agent.store.label_counts", str(directory),
           repr(start), repr(end)]
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
    except OSError as exc:
        return f"cannot start the label count: {exc}"
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"the label count took more than {timeout_s:g} s"
    try:
        counts = json.loads(out)
        if proc.returncode == 0 and isinstance(counts, dict):
            return {str(k): int(v) for k, v in counts.items()}
    except (ValueError, TypeError):
        pass
    return f"the label count failed (exit {proc.returncode}): {err.decode(errors='replace')[-200:]}"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: python -m edge_agent.store.label_counts JOURNAL_DIR START END",
              file=sys.stderr)
        return 2
    print(json.dumps(count_labels(args[0], float(args[1]), float(args[2]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
