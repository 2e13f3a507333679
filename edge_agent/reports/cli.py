"""`edge-agent reports list | show ID`: the repair reports in the state dir (daemon running or not).

    edge-agent reports list [--config PATH | --state-dir D] [--json]
    edge-agent reports show ID [--config PATH | --state-dir D] [--json]

Reads `<reports.dir>/<id>.json|.md` (delivered to disk) and `<state_dir>/outbox/<id>.json` (not
yet delivered everywhere: `list` says which sinks are still pending). Read-only: safe while the
daemon writes (every file is replaced atomically). Exit 0: done; 1: no such report; 2: usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_MISSING, EXIT_USAGE = 0, 1, 2


def add_parser(sub: Any, default_config: str) -> None:
    """Register `reports list|show` on the main parser's subparsers."""
    p = sub.add_parser("reports", help="list or show the repair reports in the state dir",
                       description=(__doc__ or "").splitlines()[0])
    rsub = p.add_subparsers(dest="reports_command", metavar="ACTION", required=True)
    lst = rsub.add_parser("list", help="one line per report, newest last")
    show = rsub.add_parser("show", help="one report as Markdown (or JSON with --json)")
    show.add_argument("id", metavar="ID", help="the report id (a unique prefix is enough)")
    for q in (lst, show):
        q.add_argument("--config", metavar="PATH",
                       default=os.environ.get("EDGE_AGENT_CONFIG", default_config),
                       help="the daemon's config, for state_dir and reports.dir (default: "
                            "$EDGE_AGENT_CONFIG, else %(default)s)")
        q.add_argument("--state-dir", metavar="D", default=None,
                       help="read D (reports in D/reports) instead of the config's")
        q.add_argument("--json", action="store_true", help="print JSON")


def _dirs(a: argparse.Namespace) -> tuple[Path, Path] | str:
    if a.state_dir:
        sd = Path(a.state_dir)
        return sd / "reports", sd / "outbox"
    from edge_agent.config import load_config
    from edge_agent.errors import ConfigError

    try:
        cfg = load_config(a.config, sim=True)
    except (ConfigError, OSError) as exc:
        return f"error: {exc}"
    return Path(cfg.reports.dir), Path(cfg.state_dir) / "outbox"


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def collect(reports_dir: Path, outbox_dir: Path) -> dict[str, dict[str, Any]]:
    """id -> {"report", "markdown"?, "pending"} from both directories (oldest id first)."""
    from edge_agent.reports.record import is_report_id

    out: dict[str, dict[str, Any]] = {}
    for path in sorted(reports_dir.glob("*.json")) if reports_dir.is_dir() else []:
        rep = _read(path)
        if rep is not None and is_report_id(path.stem):
            md = path.with_suffix(".md")
            out[path.stem] = {"report": rep, "md_path": md if md.exists() else None,
                              "pending": []}
    for path in sorted(outbox_dir.glob("*.json")) if outbox_dir.is_dir() else []:
        entry = _read(path)
        if entry is None or not is_report_id(path.stem) or "report" not in entry:
            continue
        pending = sorted(k for k, v in dict(entry.get("sinks", {})).items()
                         if isinstance(v, dict) and v.get("state") != "done")
        item = out.setdefault(path.stem, {"report": entry["report"], "md_path": None})
        item["pending"] = pending
        item.setdefault("markdown", entry.get("markdown"))
    return dict(sorted(out.items()))


def run(a: argparse.Namespace) -> int:
    """Entry point for the `reports` subcommand."""
    dirs = _dirs(a)
    if isinstance(dirs, str):
        print(dirs, file=sys.stderr)
        return EXIT_USAGE
    items = collect(*dirs)
    if a.reports_command == "list":
        if a.json:
            print(json.dumps([{"id": i, "kind": v["report"].get("kind"),
                               "title": v["report"].get("title"), "ts": v["report"].get("wall"),
                               "pending": v["pending"]} for i, v in items.items()]))
            return EXIT_OK
        from edge_agent.reports.build import utc

        for i, v in items.items():
            r = v["report"]
            pend = f"  (pending: {', '.join(v['pending'])})" if v["pending"] else ""
            print(f"{i}  {utc(float(r.get('wall', 0.0)))}  {r.get('kind'):<15} "
                  f"{r.get('title')}{pend}")
        return EXIT_OK
    matches = [i for i in items if i.startswith(a.id.upper())]
    if len(matches) != 1:
        why = "no report" if not matches else f"{len(matches)} reports"
        print(f"error: {why} with id {a.id!r} in {dirs[0]} or {dirs[1]}", file=sys.stderr)
        return EXIT_MISSING
    v = items[matches[0]]
    if a.json:
        print(json.dumps(v["report"], indent=1))
        return EXIT_OK
    md = v["md_path"].read_text(encoding="utf-8") if v["md_path"] else v.get("markdown") or ""
    sys.stdout.write(md)
    return EXIT_OK
