"""The duplicate-id window: replies remembered by command id, persisted so it survives restart.

QoS 1 may deliver a command twice (and a sender may retry after a lost reply): the second copy
gets the stored reply and does not run again. The window is bounded by age (wall clock, since it
must survive a restart) and by count. Persistence is a small `DedupStore` seam; `JsonFileDedupStore`
appends each new reply to a JSON-lines log (fsync'd) and rewrites the window atomically when the
log has grown to twice its size.
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
from edge_agent.store.atomic import read_capped

_log = get_logger(__name__)
# The log holds at most 2 x the window + 64 lines, one command's reply each (`status` and jogs
# are not kept); a file past this is unreadable (a warning, an empty window), not held.
DEDUP_MAX_BYTES = 64 << 20


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
    """The window as a JSON-lines log: each new reply appended (and fsync'd) as one line, the
    whole window rewritten atomically (temp file, fsync, `os.replace`, fsync of the directory)
    only when the log has grown to twice the window.

    It used to rewrite the whole window on every command: with a busy sender (a storm of resets
    and injections, ~700 entries after a minute) each command re-encoded up to `max_entries`
    replies in one `json.dumps` — milliseconds with the GIL held, longer as the window grew —
    and the control loop missed periods. Reads the old one-object file (`{"v": 1, "entries":
    [...]}`) too; a torn or garbled line is skipped (with a warning) and the next save compacts.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._lines = 0  # lines in the file now
        self._last: tuple[str, float] | None = None  # (id, ts) of the last entry written
        self._compact_next = True  # a file of unknown shape: the first save rewrites it

    def load(self) -> list[DedupEntry]:
        try:
            text = read_capped(self.path, DEDUP_MAX_BYTES, nofollow=True).decode("utf-8")
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            _log.warning("dedup_store_unreadable", path=str(self.path), error=str(exc))
            return []
        items, clean = self._items(text)
        out: list[DedupEntry] = []
        for item in items:
            try:
                out.append(DedupEntry.from_json(item))
            except ValueError as exc:
                clean = False
                _log.warning("dedup_entry_skipped", path=str(self.path), error=str(exc))
        self._lines = len(items)
        self._last = (out[-1].id, out[-1].ts) if out else None
        self._compact_next = not clean
        return out

    def _items(self, text: str) -> tuple[list[Any], bool]:
        """The entries' JSON values, and whether the file was a clean log (False: rewrite it)."""
        with contextlib.suppress(ValueError):
            data = json.loads(text)
            if isinstance(data, dict):  # the one-object format of earlier versions
                raw = data.get("entries")
                if isinstance(raw, list):
                    return raw, False
        items: list[Any] = []
        clean = text.endswith("\n") or not text
        for line in text.splitlines():
            try:
                items.append(json.loads(line))
            except ValueError:
                clean = False
                _log.warning("dedup_line_skipped", path=str(self.path), bytes=len(line))
        return items, clean

    def save(self, entries: Sequence[DedupEntry]) -> None:
        """Persist the window `entries` (oldest first): append what is new since the last save,
        or rewrite the file when it has grown to twice the window (or is not a clean log)."""
        new = self._new(entries)
        try:
            if new is None or self._compact_next or self._lines + len(new) > 2 * len(entries) + 64:
                self._rewrite(entries)
            elif new:
                self._append(new)
        except OSError as exc:
            self._compact_next = True  # a line may be half written: the next save rewrites
            raise StoreError(f"dedup window {self.path}: {exc}") from exc
        if entries:
            self._last = (entries[-1].id, entries[-1].ts)

    def _new(self, entries: Sequence[DedupEntry]) -> list[DedupEntry] | None:
        """The entries after the last one written (None: it is not in the window any more)."""
        if self._last is None:
            return None
        for i in range(len(entries) - 1, -1, -1):  # usually the one before the newest
            if (entries[i].id, entries[i].ts) == self._last:
                return list(entries[i + 1:])
        return None

    @staticmethod
    def _lines_of(entries: Sequence[DedupEntry]) -> bytes:
        # one short json.dumps per entry: no single long C call (see the class doc)
        return "".join(json.dumps(e.to_json(), separators=(",", ":")) + "\n"
                       for e in entries).encode("utf-8")

    def _append(self, entries: Sequence[DedupEntry]) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            view = memoryview(self._lines_of(entries))
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        self._lines += len(entries)

    def _rewrite(self, entries: Sequence[DedupEntry]) -> None:
        body = self._lines_of(entries)
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(body)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dfd = os.open(self.path.parent, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise
        self._lines = len(entries)
        self._compact_next = False


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
