"""Structured logging through structlog: one event name and key-values per record.

    from edge_agent.log import get_logger
    log = get_logger(__name__)
    log.info("link_up", port="/dev/ttyACM0", rtt_ms=0.41)
    log.exception("journal_open_failed")          # inside `except`: the traceback goes along

Library code only calls `get_logger`; the application configures the output once
(`edge_agent.logsetup.configure_logging`: JSON lines or console, level, secret redaction).
`structlog` itself is imported on the first record, not when a module takes its logger
(~60-110 ms: it would otherwise sit on every command's start-up path). A logger looks the
configuration up on every call, so a module-level logger follows a later configuration. Until
the application configures, records go to stderr in structlog's console format at level info —
stdout stays free for a tool's own output.

`bind_task(task_id)` binds the task id to the calling thread's context (structlog.contextvars):
every record that thread emits carries `task_id` until `bind_task(None)`.

Tests: `capture_logs()` is structlog.testing.capture_logs — every record, any level, as
`{"event", **key_values, "log_level"}`.
"""

from __future__ import annotations

import sys
import threading
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

__all__ = ["Logger", "bind_task", "capture_logs", "get_logger", "import_structlog"]

_default_lock = threading.Lock()


class _AsyncioOnUse(types.ModuleType):
    """Stands in for `asyncio` while structlog is imported; the real module on first use.

    structlog.stdlib imports asyncio (and through it ssl: ~10 ms of CPU here) for its async
    logger methods, which edge-agent never calls; the daemon itself does not use asyncio."""

    def __getattr__(self, name: str) -> Any:
        import importlib

        if sys.modules.get("asyncio") is self:
            del sys.modules["asyncio"]
        return getattr(importlib.import_module("asyncio"), name)


def import_structlog() -> Any:
    """`import structlog`, without the parts of it edge-agent never uses.

    structlog.dev imports rich (and through it pygments) only to pretty-print tracebacks, which
    edge-agent never uses (plain tracebacks, scrubbed of secrets): ~60 ms more start-up here.
    structlog.threadlocal (deprecated, unused here) imports greenlet when installed, and
    structlog.stdlib imports asyncio (see _AsyncioOnUse). While structlog is first imported,
    `rich` and `greenlet` read as absent and `asyncio` is a stand-in that imports the real one
    when an attribute is first read; afterwards each imports as usual."""
    if "structlog" in sys.modules:
        return sys.modules["structlog"]
    hidden = [m for m in ("rich", "greenlet") if m not in sys.modules]
    stand_in = None if "asyncio" in sys.modules else _AsyncioOnUse("asyncio")
    for m in hidden:
        sys.modules[m] = None  # type: ignore[assignment]  # import -> ImportError
    if stand_in is not None:
        sys.modules["asyncio"] = stand_in
    try:
        import structlog
    finally:
        for m in hidden:
            if sys.modules.get(m, 0) is None:
                del sys.modules[m]
        if stand_in is not None and sys.modules.get("asyncio") is stand_in:
            del sys.modules["asyncio"]
    return structlog


def _structlog() -> Any:
    """structlog, with the unconfigured default (console on stderr, info) set on first use."""
    structlog = import_structlog()
    if not structlog.is_configured():
        with _default_lock:
            if not structlog.is_configured():
                structlog.configure(
                    processors=[structlog.contextvars.merge_contextvars,
                                structlog.processors.add_log_level,
                                structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S",
                                                                 utc=True),
                                structlog.processors.format_exc_info,
                                structlog.dev.ConsoleRenderer(
                                    colors=False,
                                    exception_formatter=structlog.dev.plain_traceback)],
                    wrapper_class=structlog.make_filtering_bound_logger(20),
                    logger_factory=_stderr_logger,
                    cache_logger_on_first_use=False)
    return structlog


def _stderr_logger(*_args: Any) -> Any:
    return import_structlog().WriteLogger(sys.stderr)  # stderr as it is now (tests swap it)


class Logger:
    """`log.info("event_name", key=value, ...)`; `exception()` adds the current traceback.

    A thin handle on `structlog.get_logger(name)`, resolved at the first record."""

    __slots__ = ("_proxy", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._proxy: Any = None

    def _get(self) -> Any:
        proxy = self._proxy
        if proxy is None:
            # structlog's lazy proxy: with cache_logger_on_first_use off it binds the current
            # configuration on every call (a later configure_logging reaches it).
            proxy = self._proxy = _structlog().get_logger(self.name)
        return proxy

    def debug(self, event: str, **kw: Any) -> None:
        self._get().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        self._get().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._get().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._get().error(event, **kw)

    def critical(self, event: str, **kw: Any) -> None:
        self._get().critical(event, **kw)

    def exception(self, event: str, **kw: Any) -> None:
        kw.setdefault("exc_info", True)
        self._get().error(event, **kw)


def get_logger(name: str = "edge_agent") -> Logger:
    return Logger(name)


def bind_task(task_id: str | None) -> None:
    """Tag this thread's records with `task_id` (None: stop tagging)."""
    cv = _structlog().contextvars
    if task_id is None:
        cv.unbind_contextvars("task_id")
    else:
        cv.bind_contextvars(task_id=task_id)


def capture_logs() -> AbstractContextManager[list[dict[str, Any]]]:
    """For tests: structlog.testing.capture_logs (every record, unwritten)."""
    return _structlog().testing.capture_logs()  # type: ignore[no-any-return]
