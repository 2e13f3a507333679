"""Test helper: a tiny tmpfs mounted for one test, to make a real disk full (ENOSPC)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@contextlib.contextmanager
def tiny_fs(path: Path, size: str) -> Iterator[Path]:
    """Mount a tmpfs of `size` (e.g. "64k") at `path` for the block; skip where that is denied."""
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                         capture_output=True, check=False)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
