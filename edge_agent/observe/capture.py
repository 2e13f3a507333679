"""The flight recorder's pieces (recorder.py holds the thread): its settings, one capture in
progress, the high-rate topics packed as bytes while they wait in the ring, and the finished
files' caps.
"""

from __future__ import annotations

import contextlib
import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from edge_agent.link.bodies import pack_body, parse_body
from edge_agent.observe import channels as ch
from edge_agent.observe.tap import Item

# link frames, kept as their (f32) wire body: received ones were decoded from it, sent ones are
# encoded to it on their way to the guardian (/link/tx records what the wire carried)
LINK = frozenset({ch.LINK_STATUS, ch.LINK_RX, ch.LINK_TX})
# every control tick's (index, late, duration): two tuples a tick in the ring otherwise
_LOOP = struct.Struct("<qdd")
PACKED = LINK | {ch.LOOP}
# the 100 Hz sensor picture, kept as the JSON the capture writes: as objects each snapshot was
# ~40 of them, most of the ring's, and young until a collection scanned them (a young
# generation of ~50,000 objects: 30-50 ms collections, the GIL held)
ENCODED = frozenset({ch.SENSORS})


def pack(item: Item) -> Item:
    """A PACKED topic's message as bytes (a link frame: its type, then its wire body; a loop
    tick: three numbers); anything else as it is."""
    topic, t, msg = item
    try:
        if topic == ch.LOOP:
            return (topic, t, _LOOP.pack(*msg))
        return (topic, t, bytes((msg.TYPE,)) + pack_body(msg))
    except Exception:  # not what the topic carries after all: kept as published
        return item


def unpack(topic: str, payload: Any) -> Any:
    if type(payload) is bytes:
        if topic == ch.LOOP:
            return _LOOP.unpack(payload)
        if topic in LINK:
            return parse_body(payload[0], payload[1:])
    return payload


def encoded(item: Item) -> Item:
    """An ENCODED topic's message as the JSON bytes a capture writes (encoded once, here); as
    published when it cannot be encoded (the capture counts the error when it tries)."""
    try:
        return (item[0], item[1], ch.encode(item[0], item[2], item[1]))
    except Exception:
        return item


@dataclass(frozen=True, slots=True)
class RecorderSettings:
    pre_s: float = 10.0
    post_s: float = 5.0
    ring_bytes: int = 64 << 20
    max_files: int = 50
    max_bytes: int = 1 << 30
    max_capture_s: float = 600.0
    chunk_bytes: int = 256 << 10
    period_s: float = 0.05


@dataclass
class Capture:
    path: Path
    start_ns: int
    end_ns: int | None  # None: on demand, until stopped (or max_capture_s)
    limit_ns: int
    mark: dict[str, Any]
    trigger_ns: int
    file: IO[bytes] | None = None
    writer: Any = None
    ids: dict[str, int] = field(default_factory=dict)
    messages: int = 0
    pending: deque[Item] = field(default_factory=deque)  # to encode and write, in order
    shed: bool = False  # it lost unwritten items to MAX_PENDING (logged once)


def rotate(directory: Path, open_paths: set[Path], max_files: int, max_bytes: int) -> int:
    """Remove the oldest finished `*.mcap` files until at most `max_files` files and
    `max_bytes` bytes remain; open captures are never touched. How many went."""
    files = []
    for p in directory.glob("*.mcap"):
        if p in open_paths:
            continue
        with contextlib.suppress(OSError):
            st = p.stat()
            files.append((st.st_mtime, p.name, p, st.st_size))
    files.sort()
    total = sum(f[3] for f in files)
    removed = 0
    while files and (len(files) > max_files or total > max_bytes):
        _, _, p, size = files.pop(0)
        with contextlib.suppress(OSError):
            p.unlink()
            total -= size
            removed += 1
    return removed
