"""Helpers for the config tests: write a small config file from {section: {key: TOML literal}}."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edge_agent.config import Config, load_config

REPO = Path(__file__).resolve().parents[1]
ROBOT = REPO / "configs" / "robot" / "edge-arm-4.toml"
PASSWORD = "Zq8-hunter2-Xk41"

BASE: dict[str, dict[str, str]] = {
    "": {"schema_version": "1", "state_dir": '"state"'},
    "device": {"id": '"dev-1"'},
    "link": {"port": '"/dev/ttyUSB0"'},
    "robot": {"description": json.dumps(str(ROBOT))},
}


def render(sections: dict[str, dict[str, str]]) -> str:
    """TOML text from {section: {key: TOML literal}}; "" is the top level; None drops a key."""
    lines = [f"{k} = {v}" for k, v in sections.get("", {}).items() if v is not None]
    for name, body in sections.items():
        if name:
            lines.append(f"[{name}]")
            lines += [f"{k} = {v}" for k, v in body.items() if v is not None]
    return "\n".join(lines) + "\n"


def write(tmp_path: Path, changes: dict[str, dict[str, Any]] | None = None,
          text: str | None = None, mode: int = 0o600) -> Path:
    """The config file (0600 unless `mode` says otherwise: inline secrets need a private file)."""
    merged = {k: dict(v) for k, v in BASE.items()}
    for sec, body in (changes or {}).items():
        merged.setdefault(sec, {}).update(body)
    p = tmp_path / "edge-agent.toml"
    p.write_text(text if text is not None else render(merged), encoding="utf-8")
    p.chmod(mode)
    return p


def load(tmp_path: Path, changes: dict[str, dict[str, Any]] | None = None,
         overrides: list[str] | None = None, **kw: Any) -> Config:
    return load_config(write(tmp_path, changes), overrides or [], **kw)


def secret_file(path: Path, content: str = PASSWORD + "\n", mode: int = 0o600) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    path.chmod(mode)
    return path
