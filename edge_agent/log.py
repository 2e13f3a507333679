"""Structured logging with no dependencies: one event name and key-values per line.

    from edge_agent.log import get_logger
    log = get_logger(__name__)
    log.info("link_up", port="/dev/ttyACM0", rtt_ms=0.41)
    log.exception("journal_open_failed")          # inside `except`: the traceback goes along

Library code only calls `get_logger`; the application configures the output once
(`edge_agent.logsetup.configure_logging`: JSON lines or console, level, secret redaction). A
logger looks the configuration up on every call, so a module-level logger created at import
follows a later configuration. Until then records go to stderr in the console format at level
info — stdout stays free for a tool's own output.

Why not structlog: importing it costs ~120 ms here (it pulls asyncio, rich, pygments, attrs and
greenlet), about half of the daemon's start-up budget; the daemon only needs this much.

Each record is one `write` of one line under a lock (lines from threads never interleave) and
is flushed at once (journald, pipes). A failing stream never raises into the caller.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any, TextIO

__all__ = ["Logger", "capture_logs", "configure", "get_logger", "render_console", "render_json"]

DEBUG, INFO, WARNING, ERROR, CRITICAL = 10, 20, 30, 40, 50
LEVEL_NAMES = {DEBUG: "debug", INFO: "info", WARNING: "warning", ERROR: "error",
               CRITICAL: "critical"}

EventDict = MutableMapping[str, Any]
Processor = Callable[[EventDict], EventDict]
Renderer = Callable[[EventDict], str]


def iso_utc(t: float) -> str:
    """`2026-12-03T10:17:24.123456Z` — the `ts` of every record."""
    return _iso_utc(t)


def _iso_utc(t: float) -> str:
    secs = int(t)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{int((t - secs) * 1e6):06d}Z"


def _json_default(o: object) -> str:
    return str(o)


def render_json(ev: EventDict) -> str:
    """`ts`, `level`, `logger`, `event` first, then the key-values; unknown types as str()."""
    import json  # ~2 ms, and only once something is logged

    head = {k: ev.pop(k) for k in ("ts", "level", "logger", "event") if k in ev}
    head.update(ev)
    return json.dumps(head, default=_json_default)


_COLORS = {"debug": "\x1b[2m", "info": "\x1b[32m", "warning": "\x1b[33m", "error": "\x1b[31m",
           "critical": "\x1b[1;31m"}


def _console_value(v: object) -> str:
    if isinstance(v, str) and v and not any(c.isspace() or c in "='\"" for c in v):
        return v
    return repr(v)


def render_console(ev: EventDict, colors: bool = False) -> str:
    """`2026-12-03 10:17:24 [warning ] event_name    key=value ...`, then any traceback."""
    ts = str(ev.pop("ts", ""))[:19].replace("T", " ")
    level = str(ev.pop("level", ""))
    event = str(ev.pop("event", ""))
    exc = ev.pop("exception", None)
    stack = ev.pop("stack", None)
    ev.pop("logger", None)
    kv = " ".join(f"{k}={_console_value(v)}" for k, v in ev.items())
    lvl = f"[{level:<8}]"
    if colors:
        lvl = f"{_COLORS.get(level, '')}{lvl}\x1b[0m"
    line = f"{ts} {lvl} {event:<30} {kv}".rstrip()
    for extra in (stack, exc):
        if extra:
            line += "\n" + str(extra).rstrip("\n")
    return line


class _Config:
    __slots__ = ("capture", "level", "lock", "processors", "renderer", "stream")

    def __init__(self) -> None:
        self.level = INFO
        self.processors: tuple[Processor, ...] = ()
        self.renderer: Renderer = render_console
        self.stream: TextIO | None = None  # None: sys.stderr at the time of the call
        self.lock = threading.Lock()
        self.capture: list[dict[str, Any]] | None = None


_cfg = _Config()


def configure(*, level: int = INFO, renderer: Renderer = render_console,
              processors: tuple[Processor, ...] = (), stream: TextIO | None = None) -> None:
    """Set the process-wide output (the application does this once, via logsetup)."""
    with _cfg.lock:
        _cfg.level, _cfg.renderer, _cfg.processors, _cfg.stream = (
            level, renderer, processors, stream)


def reset() -> None:
    """Back to the unconfigured default (console on stderr, level info)."""
    configure()


def _format_exc(exc_info: Any) -> str | None:
    if exc_info is True:
        exc_info = sys.exc_info()
    elif isinstance(exc_info, BaseException):
        exc_info = (type(exc_info), exc_info, exc_info.__traceback__)
    if not isinstance(exc_info, tuple) or exc_info[0] is None:
        return None
    return "".join(traceback.format_exception(*exc_info)).rstrip("\n")


def emit(name: str, level: int, event: str, kw: dict[str, Any], *, ts: float | None = None
         ) -> None:
    """Process and write one record (also the entry for stdlib `logging` records)."""
    cap = _cfg.capture
    if cap is not None:
        cap.append({"event": event, **kw, "log_level": LEVEL_NAMES.get(level, str(level))})
        return
    if level < _cfg.level:
        return
    ev: EventDict = {"ts": _iso_utc(time.time() if ts is None else ts),
                          "level": LEVEL_NAMES.get(level, str(level)), "logger": name,
                          "event": event}
    exc_info = kw.pop("exc_info", None)
    stack_info = kw.pop("stack_info", False)
    ev.update(kw)
    if exc_info:
        text = _format_exc(exc_info)
        if text:
            ev["exception"] = text
    if stack_info:
        ev["stack"] = "".join(traceback.format_stack()[:-2]).rstrip("\n")
    try:
        for proc in _cfg.processors:
            ev = proc(ev)
        line = _cfg.renderer(ev) + "\n"
    except Exception as exc:  # a bad value must not take the caller down
        line = f"log_render_failed event={event!r} error={exc!r}\n"
    stream = _cfg.stream if _cfg.stream is not None else sys.stderr
    with _cfg.lock, contextlib.suppress(Exception):  # closed pipe, full disk: never raises
        stream.write(line)
        stream.flush()


class Logger:
    """`log.info("event_name", key=value, ...)`; `exception()` adds the current traceback."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def debug(self, event: str, **kw: Any) -> None:
        if _cfg.level <= DEBUG or _cfg.capture is not None:
            emit(self.name, DEBUG, event, kw)

    def info(self, event: str, **kw: Any) -> None:
        if _cfg.level <= INFO or _cfg.capture is not None:
            emit(self.name, INFO, event, kw)

    def warning(self, event: str, **kw: Any) -> None:
        emit(self.name, WARNING, event, kw)

    def error(self, event: str, **kw: Any) -> None:
        emit(self.name, ERROR, event, kw)

    def critical(self, event: str, **kw: Any) -> None:
        emit(self.name, CRITICAL, event, kw)

    def exception(self, event: str, **kw: Any) -> None:
        kw.setdefault("exc_info", True)
        emit(self.name, ERROR, event, kw)


def get_logger(name: str = "edge_agent") -> Logger:
    return Logger(name)


@contextlib.contextmanager
def capture_logs() -> Iterator[list[dict[str, Any]]]:
    """For tests: every record (any level) as `{"event", **key_values, "log_level"}`, unwritten."""
    prev, _cfg.capture = _cfg.capture, []
    try:
        yield _cfg.capture
    finally:
        _cfg.capture = prev
