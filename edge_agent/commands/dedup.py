"""The duplicate-id window: replies remembered by command id, persisted so it survives restart.

QoS 1 may deliver a command twice (and a sender may retry after a lost reply): the second copy
gets the stored reply and does not run again. The window is bounded by age (wall clock, since it
must survive a restart) and by count. Persistence is a small `DedupStore` seam; `JsonFileDedupStore`
writes the whole window atomically (temp file, fsync, `os.replace`, fsync of the directory).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edge_agent.commands.codes import Reply
from edge_agent.errors import StoreError
from edge_agent.log import get_logger

_log = get_logger(__name__)


@dataclass(frozen=True)
class DedupEntry:
    id: str
    command: str
    ts: float  # wall-clock unix seconds when the reply was made
    reply: Reply

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "command": self.command, "ts": self.ts,
                "reply": self.reply.to_dict()}

    @classmethod
    def from_json(cls, data: Any) -> DedupEntry:
        if not isinstance(data, dict):
            raise ValueError("entry is not an object")
        cid, command, ts = data.get("id"), data.get("command"), data.get("ts")
        if not isinstance(cid, str) or not isinstance(command, str):
            raise ValueError("entry id/command is not a string")
        if isinstance(ts, bool) or not isinstance(ts, int | float):
            raise ValueError("entry ts is not a number")
        reply = data.get("reply")
        if not isinstance(reply, dict):
            raise ValueError("entry reply is not an object")
        return cls(cid, command, float(ts), Reply.from_dict(reply))


class DedupStore(Protocol):
    """Where the window lives between runs."""

    def load(self) -> list[DedupEntry]: ...

    def save(self, entries: Sequence[DedupEntry]) -> None: ...


class MemoryDedupStore:
    """No persistence (tests, or a daemon without a state dir)."""

    def __init__(self) -> None:
        self.entries: list[DedupEntry] = []

    def load(self) -> list[DedupEntry]:
        return list(self.entries)

    def save(self, entries: Sequence[DedupEntry]) -> None:
        self.entries = list(entries)


class JsonFileDedupStore:
    """The window as one JSON file, replaced atomically on every save."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def load(self) -> list[DedupEntry]:
        try:
            with open(os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as f:
                data = json.loads(f.read())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            _log.warning("dedup_store_unreadable", path=str(self.path), error=str(exc))
            return []
        raw = data.get("entries") if isinstance(data, dict) else None
        if not isinstance(raw, list):
            _log.warning("dedup_store_unreadable", path=str(self.path), error="no entries list")
            return []
        out: list[DedupEntry] = []
        for item in raw:
            try:
                out.append(DedupEntry.from_json(item))
            except ValueError as exc:
                _log.warning("dedup_entry_skipped", path=str(self.path), error=str(exc))
        return out

    def save(self, entries: Sequence[DedupEntry]) -> None:
        body = json.dumps({"v": 1, "entries": [e.to_json() for e in entries]},
                          separators=(",", ":")).encode("utf-8")
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                os.write(fd, body)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise StoreError(f"dedup window {self.path}: {exc}") from exc


class DedupWindow:
    """In-memory window (not thread-safe: the CommandAPI holds the lock)."""

    def __init__(self, *, window_s: float, max_entries: int) -> None:
        self.window_s = window_s
        self.max_entries = max_entries
        self._entries: OrderedDict[str, DedupEntry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def load(self, entries: Sequence[DedupEntry], now_wall: float) -> None:
        for e in sorted(entries, key=lambda e: e.ts):
            self._entries[e.id] = e
        self.prune(now_wall)

    def get(self, command_id: str, now_wall: float) -> DedupEntry | None:
        entry = self._entries.get(command_id)
        if entry is not None and now_wall - entry.ts > self.window_s:
            del self._entries[command_id]
            return None
        return entry

    def put(self, entry: DedupEntry, now_wall: float) -> None:
        self._entries.pop(entry.id, None)
        self._entries[entry.id] = entry
        self.prune(now_wall)

    def prune(self, now_wall: float) -> None:
        while self._entries:
            oldest = next(iter(self._entries.values()))
            if len(self._entries) > self.max_entries or now_wall - oldest.ts > self.window_s:
                self._entries.popitem(last=False)
            else:
                break

    def entries(self) -> list[DedupEntry]:
        return list(self._entries.values())
