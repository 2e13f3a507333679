"""The drift report's plot: the action distribution per executor state, last period and this one.

Drawn by the report plot subprocess (reports/plot.py hands it a drift report): two bar charts
one above the other, each state a group of bars (one per action, the share of that state's
decisions), the state's decision count and KL under its name. Never imported by the daemon.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edge_agent.reports.drift import ACTIONS


def draw_drift(report: dict[str, Any], out: Path, plt: Any, dpi: int) -> None:
    d = report.get("details") or {}
    this = (d.get("this") or {}).get("actions") or {}
    last = (d.get("last") or {}).get("actions") or {}
    per = d.get("kl_per_state") or {}
    states = sorted({*this, *last})
    acts = [a for a in ACTIONS if any(a in row for row in (*this.values(), *last.values()))]
    acts += sorted({a for row in (*this.values(), *last.values()) for a in row} - set(acts))
    fig, axes = plt.subplots(2, 1, figsize=(9, 7), sharex=True, sharey=True, dpi=dpi)
    fig.suptitle(str(report.get("title", ""))[:100], fontsize=10)
    width = 0.8 / max(1, len(acts))
    for ax, (name, data) in zip(axes, (("last period", last), ("this period", this)),
                                strict=True):
        ax.set_title(name, fontsize=9)
        ax.set_ylabel("share of the state's decisions", fontsize=8)
        ax.set_ylim(0, 1.3)  # room for the legend above the bars
        ax.grid(True, axis="y", alpha=0.3)
        if not data:
            ax.text(0.5, 0.5, "no decisions", ha="center", va="center",
                    transform=ax.transAxes)
        for j, a in enumerate(acts):
            shares = []
            for s in states:
                row = data.get(s) or {}
                n = sum(row.values())
                shares.append(row.get(a, 0) / n if n else 0.0)
            xs = [i + (j - (len(acts) - 1) / 2) * width for i in range(len(states))]
            ax.bar(xs, shares, width, label=a)
        ax.legend(fontsize=7, loc="upper right", ncols=max(1, len(acts)))
    labels = []
    for s in states:
        kl = per.get(s)
        n_this = sum((this.get(s) or {}).values())
        n_last = sum((last.get(s) or {}).values())
        labels.append(f"{s}\n{n_last} → {n_this}\nKL " + ("—" if kl is None else f"{kl:.3g}"))
    axes[-1].set_xticks(range(len(states)), labels, fontsize=7)
    fig.tight_layout()
    fig.savefig(out, format="png")
    plt.close(fig)
