"""The report's sensor-window plot, drawn in a subprocess (`python -m edge_agent.reports.plot`).

IN is a report as JSON (`Report.as_dict()`), OUT the PNG to write. matplotlib (Agg) is imported
only by that subprocess — never by the daemon: plotting is CPU-bound pure Python that would hold
the GIL against the control loop (DESIGN.md). `render_plot` is the daemon side: it starts the
subprocess at a lower CPU priority with a timeout and says whether a PNG came out.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PLOT_DPI = 80
MAX_PNG_BYTES = 2 * 1024 * 1024  # WeCom's image limit


def render_plot(report_json: Path, out_png: Path, *, timeout_s: float = 60.0,
                nice: int = 10, cache_dir: Path | None = None) -> str | None:
    """Draw the plot in a subprocess; None when the PNG was written, else why not.
    `cache_dir`: matplotlib's font cache (the service has no writable home: without one each
    plot would rebuild it)."""
    tmp = out_png.with_name(f".{out_png.name}.tmp.png")
    cmd = [sys.executable, "-m", "edge_agent.reports.plot", str(report_json), str(tmp)]
    env = {**os.environ, "MPLBACKEND": "Agg"}
    if cache_dir is not None:
        env["MPLCONFIGDIR"] = str(cache_dir)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        return f"cannot start the plot process: {exc}"
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, proc.pid, nice)
    try:
        _, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return f"the plot process took more than {timeout_s:g} s"
    if proc.returncode != 0 or not tmp.exists():
        with contextlib.suppress(OSError):
            tmp.unlink()
        last = err.decode("utf-8", "replace").strip().splitlines()[-1:] if err else []
        return f"the plot process failed (exit {proc.returncode}): {' '.join(last)}"
    os.replace(tmp, out_png)
    return None


def draw(report: dict[str, Any], out: Path) -> None:
    """The plot itself (in the subprocess): joints, currents and the gripper over time (a drift
    report: its action distribution per state, reports/drift_plot.py)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if report.get("kind") == "drift":  # the drift report's action bars (reports/drift_plot.py)
        from edge_agent.reports.drift_plot import draw_drift

        draw_drift(report, out, plt, PLOT_DPI)
        return
    window = report.get("window") or {}
    cols: list[str] = list(window.get("columns") or [])
    rows: list[list[float]] = list(window.get("rows") or [])
    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True, dpi=PLOT_DPI)
    fig.suptitle(str(report.get("title", ""))[:100], fontsize=10)
    if not rows:
        for ax in axes:
            ax.text(0.5, 0.5, "no sensor samples captured", ha="center", va="center")
    else:
        t0 = rows[-1][0]
        t = [r[0] - t0 for r in rows]
        groups = (("joint position [rad]", "_rad", 1.0), ("joint current [A]", "current", 1.0),
                  ("gripper: force [N], opening [mm]", "gripper", 0.0))
        for ax, (label, key, scale) in zip(axes, groups, strict=True):
            for i, c in enumerate(cols):
                if i and key in c:
                    k = scale or (1000.0 if c.endswith("_m") else 1.0)  # metres as mm
                    ax.plot(t, [r[i] * k for r in rows], label=c, linewidth=1.2)
            ax.set_ylabel(label, fontsize=8)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7, loc="upper left", ncols=4)
        axes[-1].set_xlabel("time before the report [s]", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m edge_agent.reports.plot REPORT.json OUT.png", file=sys.stderr)
        return 2
    try:
        report = json.loads(Path(args[0]).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"error: {args[0]}: {exc}", file=sys.stderr)
        return 2
    if isinstance(report, dict) and isinstance(report.get("report"), dict):
        report = report["report"]  # an outbox entry
    draw(report, Path(args[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
