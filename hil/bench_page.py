"""docs/PERFORMANCE.md and its plots (docs/perf/bench-*.png) from a `python -m hil.bench` JSON.

    python -m hil.bench_page [JSON] [--doc docs/PERFORMANCE.md]

Without JSON, the newest hil/results/bench-*.json (by its start time). The page: how to
regenerate it, the machine and the commit, a table per area (median / P99 / max, the baseline,
the ratio, the target and whether it is met, the steal and wall time of the bench's window),
the notes, latency distributions (each figure that kept its samples, beside its baseline's) and
the period error over time (each that kept a series); then, when present, the soak section
(hil/results/soak.json's "markdown", verbatim) and the footprint (hil/results/footprint*.json's
"markdown", or a table of its top-level numbers).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from hil.bench_suite import AREAS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "hil" / "results"
DOC = ROOT / "docs" / "PERFORMANCE.md"

REGENERATE = """\
```sh
python -m hil.bench --page
python -m hil.bench --quick --page
python -m hil.bench_page
```

The first runs every figure with full samples (an hour or more; run it on a quiet machine),
the second the same figures with small samples in minutes (P99 of a small sample is close to
its max), each writing `hil/results/bench-<UTC date>-<commit>[-quick].json` and this page;
the third renders the page again from the newest JSON. The JSON is written after each bench: a
run stopped midway keeps what it measured and the page says "partial run".
`python -m hil.bench --list` names the benches, `--only NAME[,NAME]` runs some of them."""


def latest(results: Path = RESULTS) -> Path:
    runs = sorted(results.glob("bench-*.json"),
                  key=lambda p: (json.loads(p.read_text()).get("started_utc", ""), p.name))
    if not runs:
        raise SystemExit(f"no {results}/bench-*.json: run `python -m hil.bench --quick` first")
    return runs[-1]


def num(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if x != x:
            return "–"
        return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
    return str(x)


def _rel(p: Path) -> str:
    """`p` relative to the checkout where it is inside it, else its name."""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return p.name


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower())[:40].strip("-")


def _met(t: dict[str, Any] | None) -> str:
    met = (t or {}).get("met")
    return "–" if met is None else "**yes**" if met else "**no**"


def _cdf(ax: Any, xs: list[float], label: str) -> None:
    s = sorted(xs)
    ax.step(s, [(k + 1) / len(s) for k in range(len(s))], where="post", label=label)


def plot(fig: dict[str, Any], out: Path) -> list[str]:
    """The figure's PNGs under `out` (docs/perf): its distribution, its series; their names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    base = f"bench-{fig.get('bench', 'x')}-{_slug(fig['name'])}"
    if fig.get("samples"):
        f, ax = plt.subplots(figsize=(7, 3.2), dpi=100)
        _cdf(ax, fig["samples"], fig["name"][:60])
        if fig.get("baseline_samples"):
            _cdf(ax, fig["baseline_samples"], "baseline: " + fig["baseline"]["name"])
        ax.set_xscale("log")
        ax.set_xlabel(fig["unit"])
        ax.set_ylabel("fraction ≤ x")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title(f"distribution (n = {fig['n']:,}"
                     + (f"; {len(fig['samples'])} quantiles)" if fig["n"] > len(fig["samples"])
                        else ")"), fontsize=9)
        f.tight_layout()
        f.savefig(out / f"{base}-cdf.png")
        plt.close(f)
        names.append(f"{base}-cdf.png")
    if fig.get("series"):
        f, ax = plt.subplots(figsize=(7, 3.0), dpi=100)
        ts, vs = zip(*fig["series"], strict=True)
        ax.plot(ts, vs, ".", markersize=2)
        ax.set_xlabel("s since the first sample (the gaps between windows included)")
        ax.set_ylabel(fig["unit"])
        ax.set_yscale("log")
        ax.grid(True, alpha=0.3)
        ax.set_title(f"{fig['name'][:80]}\nover time ({len(ts):,} points, the worst of each "
                     "bucket)", fontsize=8)
        f.tight_layout()
        f.savefig(out / f"{base}-time.png")
        plt.close(f)
        names.append(f"{base}-time.png")
    return names


def machine_section(r: dict[str, Any], src: str) -> list[str]:
    m = r["machine"]
    dirty = " (uncommitted changes in the tree)" if r.get("dirty") else ""
    return ["## Machine and commit", "",
            "| | |", "|---|---|",
            f"| results | `{src}` ({r['kind']} run, started "
            f"{r['started_utc'].replace('T', ' ').replace('+00:00', '')} UTC, "
            f"{num(r.get('wall_s'))} s) |",
            f"| commit | `{r.get('short')}`{dirty} {r.get('subject', '')} |",
            f"| CPU | {m.get('cpu')}, {m.get('cores')} cores |",
            f"| kernel, Python, onnxruntime | {m.get('kernel')}, {m.get('python')}, "
            f"{m.get('onnxruntime') or 'not installed'} |",
            f"| load average (1, 5, 15 min) before → after | {m.get('load_before')} → "
            f"{m.get('load_after')} |",
            f"| host steal over the whole run | {num(m.get('steal_pct'))} % |",
            *([f"| note | {r['assembled']} |"] if r.get("assembled") else []),
            *([f"| partial run | {r['partial']} |"] if r.get("partial") else []), ""]


def area_section(area: str, benches: list[dict[str, Any]], perf: Path) -> list[str]:
    mine = [b for b in benches if b["area"] == area]
    if not mine:
        return []
    lines = [f"## {area}", "",
             "| figure | n | median | P99 | max | baseline: median / P99 | ratio | target "
             "| met | steal | wall |", "|---|--:|--:|--:|--:|---|--:|---|:-:|--:|--:|"]
    notes, images = [], []
    for b in mine:
        if b.get("error"):
            notes.append(f"`{b['module']}` failed ({b['error']}): "
                         + " / ".join(x.strip() for x in b.get("output_tail", [])[-3:]))
        for f in b["figures"]:
            if f.get("skipped"):
                lines.append(f"| {f['name']} | skipped: {f['skipped']} | | | | | | | | | |")
                continue
            bl = f.get("baseline") or {}
            base = (f"{bl['name']}: {num(bl.get('median'))} / {num(bl.get('p99'))}"
                    if bl else "–")
            t = f.get("target") or {}
            ratio = f"{num(f['ratio'])} ({'median' if f['ratio_of'] == 'p50' else 'P99'})" \
                if f.get("ratio") is not None else "–"
            lines.append(f"| {f['name']} ({f['unit']}) | {num(f['n'])} | {num(f['median'])} | "
                         f"{num(f['p99'])} | {num(f['max'])} | {base} | {ratio} | "
                         f"{t.get('text', '–')} | {_met(t)} | {num(f.get('steal_pct'))} % | "
                         f"{num(f.get('wall_s'))} s |")
            if f.get("notes"):
                notes.append(f"{f['name']}: {f['notes']}")
            images += [(f["name"], n) for n in plot(f, perf)]
    lines.append("")
    benches_line = "; ".join(f"`python {' '.join(b['argv'][:-2])}` (load {b['load_before'][0]} "
                             f"→ {b['load_after'][0]})" for b in mine)
    lines += [f"Run as: {benches_line}.", ""]
    lines += [f"- {n}" for n in notes]
    if notes:
        lines.append("")
    lines += [f"![{name}](perf/{png})" for name, png in images]
    return [*lines, ""] if images else lines


def footprint_section(results: Path) -> list[str]:
    files = sorted(results.glob("footprint*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        return []
    data = json.loads(files[-1].read_text())
    lines = ["## Footprint", ""]
    if isinstance(data.get("markdown"), str):
        return [*lines, data["markdown"].rstrip(), ""]
    lines += [f"From `{_rel(files[-1])}`.", "", "| | |", "|---|--:|"]
    lines += [f"| {k} | {num(v)} |" for k, v in data.items()
              if isinstance(v, int | float) and not isinstance(v, bool)]
    return [*lines, ""]


def soak_section(results: Path) -> list[str]:
    soak = results / "soak.json"
    if not soak.exists():
        return []
    md = json.loads(soak.read_text()).get("markdown")
    return ["## Soak", "", md.rstrip(), ""] if isinstance(md, str) else []


def page(r: dict[str, Any], src: str, perf: Path, results: Path) -> str:
    for old in perf.glob("bench-*.png"):
        old.unlink()
    perf.mkdir(parents=True, exist_ok=True)
    benches = r["benches"]
    figs = [f for b in benches for f in b["figures"] if not f.get("skipped")]
    judged = [f for f in figs if (f.get("target") or {}).get("met") is not None]
    met = sum(1 for f in judged if f["target"]["met"])
    lines = ["# Performance", "",
             f"<!-- generated by `python -m hil.bench_page` from {src}: edit hil/bench*.py, "
             "not this page -->", "",
             "Every figure here comes from one run of `python -m hil.bench` on the machine "
             "below, each beside a baseline measured in the same run on the same machine (a "
             "loaded or stolen-from VM shows in both). Regenerate with:", "", REGENERATE, ""]
    if r["kind"] == "quick":
        lines += ["> **A quick run**: small samples on a shared machine, to show the bench "
                  "works; the lead's full run on a quiet machine replaces it.", ""]
    lines += machine_section(r, src)
    lines += [f"Targets met: {met} of {len(judged)} figures with a target "
              f"({len(figs)} figures in all). Median, P99 and max of each figure's samples "
              "(P99: the sample at index int(0.99 n) of the sorted samples: with n < 100 it "
              "is the max); ratio: the figure's P99 (or median, where marked) over its "
              "baseline's; steal: the host's steal over the bench's window (/proc/stat, "
              "hil/steal.py), the same for every figure of one bench.", ""]
    for area in AREAS:
        lines += area_section(area, benches, perf)
    lines += soak_section(results)
    lines += footprint_section(results)
    return "\n".join(lines).rstrip() + "\n"


def render(path: Path, doc: Path = DOC, results: Path | None = None) -> Path:
    """Write `doc` (and its PNGs in doc's folder / perf) from the bench JSON at `path`."""
    r = json.loads(path.read_text())
    src = _rel(path)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(page(r, src, doc.parent / "perf", results or path.parent))
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hil.bench_page",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("json", nargs="?", type=Path, help="default: the newest hil/results one")
    ap.add_argument("--doc", type=Path, default=DOC, help="the page (its PNGs: DOC's dir/perf)")
    a = ap.parse_args(argv)
    print(f"wrote {render(a.json or latest(), a.doc)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
