"""Test helper: connect to a Unix stream socket whose listen backlog may be full."""

from __future__ import annotations

import socket
from pathlib import Path


def try_connect(s: socket.socket, path: Path) -> bool:
    """Connect `s` (non-blocking) to `path`; False when the backlog is full this instant."""
    try:
        s.connect(str(path))
    except BlockingIOError:  # the listen backlog is full this instant: try again
        return False
    return True
