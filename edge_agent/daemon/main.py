"""`edge_agent.daemon.main.run` — the entry the CLI calls (kept tiny: imports stay lazy)."""

from __future__ import annotations

from edge_agent.daemon.app import run

__all__ = ["run"]
