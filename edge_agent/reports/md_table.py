"""Markdown tables for reports: one line per cell, `|` escaped (the report and drift bodies)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """A GitHub-flavoured Markdown table, one line per row."""
    out = ["| " + " | ".join(cell(h) for h in header) + " |",
           "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return out


def cell(v: Any) -> str:
    """`v` as one table cell: whitespace collapsed onto one line, `|` escaped."""
    return one_line(str(v)).replace("|", "\\|")


def one_line(text: str) -> str:
    return " ".join(text.split())
