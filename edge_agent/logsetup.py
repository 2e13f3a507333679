"""Logging set-up, done once by the application: structlog's chain, JSON lines or console.

    configure_logging(cfg.log.level, cfg.log.format, secrets=cfg.secret_values())

One processor chain for edge_agent's structlog records and stdlib `logging` records alike
(transitions, paho when enabled, warnings: structlog.stdlib.ProcessorFormatter): the thread's
context (`task_id`, edge_agent.log.bind_task), level, logger name, `ts` (ISO-8601 UTC), the
traceback formatted, then a redactor, then the renderer. JSON lines on stdout when stdout is not
a terminal (journald keeps them as-is; fields `ts`, `level`, `logger`, `event`, then the
key-values), structlog's console renderer on a terminal (no colours when NO_COLOR is set); the
link guardian writes the same format (--log-format, edge_agent.logline). `fmt` "json" /
"console" forces one. The redactor runs last before rendering: values of keys named like
password/secret/token, `Secret` objects and any occurrence of a configured secret become '***'
— in the event text, key-values and formatted tracebacks alike.

Library code never calls this; it uses `edge_agent.log.get_logger(__name__)`. Loggers are not
cached, so a later configure_logging() reaches loggers that modules hold. The module is named
logsetup, not logging, so that it can never shadow the stdlib module.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

from edge_agent.config import Secret
from edge_agent.observe.channels import LOG as LOG_TOPIC
from edge_agent.observe.tap import TAP

__all__ = ["REDACTED", "SecretRedactor", "configure_logging"]

REDACTED = "***"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}
_SECRET_KEY = re.compile(r"pass(w|$)|secret|token|credential|authorization|api_?key|cookie",
                         re.IGNORECASE)
_MIN_SUBSTRING = 4  # shorter secrets are redacted only where a whole value equals them
_PLAIN = (int, float, bool, type(None))
_HEAD = ("ts", "level", "logger", "event")
_handler: logging.Handler | None = None


class SecretRedactor:
    """Log processor: replaces secrets (by key name, by type, by value) with '***'."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        uniq = {s for s in secrets if s}
        self._secrets = tuple(sorted(uniq, key=len, reverse=True))

    def __call__(self, logger: Any, method: str,
                 event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for k in list(event_dict):
            if k != "_record":
                event_dict[k] = self.clean(k, event_dict[k])
        return event_dict

    def clean(self, key: str | None, value: Any, depth: int = 0) -> Any:
        """`value` with every secret in it replaced (containers up to 4 levels deep)."""
        if key is not None and _SECRET_KEY.search(key) and value is not None:
            return REDACTED
        if isinstance(value, Secret):
            return REDACTED
        if isinstance(value, _PLAIN):
            return value
        if isinstance(value, str):
            return self.scrub(value)
        if depth < 4 and isinstance(value, dict):
            return {k: self.clean(str(k), v, depth + 1) for k, v in value.items()}
        if depth < 4 and isinstance(value, list | tuple | set | frozenset):
            return [self.clean(None, v, depth + 1) for v in value]
        text = repr(value)  # what the renderers would print for it
        scrubbed = self.scrub(text)
        return value if scrubbed == text else scrubbed

    def scrub(self, text: str) -> str:
        """`text` with every configured secret replaced."""
        for s in self._secrets:
            if text == s:
                return REDACTED
            if len(s) >= _MIN_SUBSTRING and s in text:
                text = text.replace(s, REDACTED)
        return text


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _head_first(logger: Any, method: str,
                event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    """`ts`, `level`, `logger`, `event` lead each JSON line; the key-values follow."""
    out = {k: event_dict.pop(k) for k in _HEAD if k in event_dict}
    out.update(event_dict)
    return out


def _tap_log(logger: Any, method: str, event_dict: MutableMapping[str, Any]
             ) -> MutableMapping[str, Any]:
    """Each record (redacted) to the observe tap as a foxglove.Log line (observe/tap.py)."""
    if TAP.active:
        TAP.publish(LOG_TOPIC, dict(event_dict))
    return event_dict


def configure_logging(level: str = "info", fmt: str = "auto", secrets: Iterable[str] = (), *,
                      stream: TextIO | None = None) -> None:
    """Configure structlog and stdlib logging for the whole process (idempotent)."""
    from edge_agent.log import import_structlog

    structlog = import_structlog()
    ProcessorFormatter = structlog.stdlib.ProcessorFormatter

    global _handler
    out = stream if stream is not None else sys.stdout
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"log format must be auto, json or console, not {fmt!r}")
    level_no = LEVELS[level.lower()]
    use_json = fmt == "json" or (fmt == "auto" and not _isatty(out))
    renderer: Any
    if use_json:
        renderer = structlog.processors.JSONRenderer(default=str)
    else:
        renderer = structlog.dev.ConsoleRenderer(
            colors=_isatty(out) and os.environ.get("NO_COLOR") is None,  # https://no-color.org
            timestamp_key="ts", sort_keys=False,
            exception_formatter=structlog.dev.plain_traceback)
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars, structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts")]
    structlog.configure(
        processors=[structlog.stdlib.filter_by_level, *shared,
                    ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False)
    formatter = ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[ProcessorFormatter.remove_processors_meta,
                    structlog.processors.format_exc_info,  # before the redactor: scrubbed too
                    SecretRedactor(secrets), _tap_log, _head_first, renderer])
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = logging.StreamHandler(out)
    _handler.setFormatter(formatter)
    root.addHandler(_handler)
    root.setLevel(level_no)
    # transitions logs every state change at INFO; the executor emits its own events.
    logging.getLogger("transitions").setLevel(max(level_no, logging.WARNING))
    logging.captureWarnings(True)
