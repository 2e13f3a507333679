"""hil.soak's plots (matplotlib, Agg): RSS per process, threads and fds, state dir disk use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hil.soak_verdict import MB, series


def plot_all(result: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    samples = result["samples"]
    roles = sorted({r for s in samples for r in s["procs"]})
    warm = result["warmup_s"] / 60
    paths = []

    fig, ax = plt.subplots(figsize=(8, 4))
    for role in roles:
        pts = series(samples, role, "rss_bytes")
        line, = ax.plot([t / 60 for t, _ in pts], [y / MB for _, y in pts], label=role)
        anon = series(samples, role, "rss_anon_bytes") if role == "daemon" else []
        if anon:  # its heap: the rest is mapped files (libraries)
            ax.plot([t / 60 for t, _ in anon], [y / MB for _, y in anon], ls="--", lw=1,
                    color=line.get_color(), label="daemon: anonymous (heap)")
    ax.axvline(warm, color="grey", ls=":", lw=1, label="end of warm-up")
    ax.set(xlabel="minutes since READY", ylabel="RSS (MiB)",
           title=f"hil.soak {result['minutes']:g} min: resident memory per process")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out_dir / "soak-rss.png"))

    fig, (a1, a2) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    for role in roles:
        for ax, key in ((a1, "threads"), (a2, "fds")):
            pts = series(samples, role, key)
            ax.step([t / 60 for t, _ in pts], [y for _, y in pts], where="post", label=role)
    a1.set(ylabel="threads", title="threads and open file descriptors per process")
    a2.set(xlabel="minutes since READY", ylabel="fds")
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
        ax.axvline(warm, color="grey", ls=":", lw=1)
    a1.legend(fontsize=8)
    paths.append(_save(fig, out_dir / "soak-threads-fds.png"))

    fig, ax = plt.subplots(figsize=(8, 4))
    folders = sorted({f for s in samples for f in s["disk"]})
    for f in folders:
        ts = [s["t_s"] / 60 for s in samples if f in s["disk"]]
        ys = [s["disk"][f]["bytes"] / MB for s in samples if f in s["disk"]]
        ax.plot(ts, ys, label=f)
    ax.set(xlabel="minutes since READY", ylabel="MiB", title="state directory use by folder")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    paths.append(_save(fig, out_dir / "soak-disk.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
