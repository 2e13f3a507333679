"""Logging set-up, done once by the application: JSON lines or console output, secrets redacted.

    configure_logging(cfg.log.level, cfg.log.format, secrets=cfg.secret_values())

JSON lines on stdout when stdout is not a terminal (journald keeps them as-is; fields `ts`
ISO-8601 UTC, `level`, `logger`, `event`, then the key-values), readable colours on a terminal;
`fmt` "json" / "console" forces one. Records from stdlib `logging` (transitions, paho when
enabled, warnings) get the same format. A redacting processor runs last before rendering: values
of keys named like password/secret/token, `Secret` objects and any occurrence of a configured
secret become '***' — in the event text, key-values and formatted tracebacks alike.

Library code never calls this; it uses `structlog.get_logger(__name__)`. Loggers are not cached on
first use, so a later configure_logging() reaches loggers that modules already hold.
The module is named logsetup, not logging, so that it can never shadow the stdlib module.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, MutableMapping
from typing import Any, TextIO

import structlog

from edge_agent.config_schema import Secret

__all__ = ["REDACTED", "SecretRedactor", "configure_logging"]

REDACTED = "***"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}
_SECRET_KEY = re.compile(r"pass(w|$)|secret|token|credential|authorization|api_?key|cookie",
                         re.IGNORECASE)
_MIN_SUBSTRING = 4  # shorter secrets are redacted only where a whole value equals them
_PLAIN = (int, float, bool, type(None))
_handler: logging.Handler | None = None


class SecretRedactor:
    """structlog processor: replaces secrets (by key name, by type, by value) with '***'."""

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


class _NamedWriteLogger(structlog.WriteLogger):
    """A WriteLogger that knows the name it was created with (`get_logger(__name__)`)."""

    def __init__(self, file: TextIO, name: str) -> None:
        super().__init__(file)
        self.name = name


class _NamedWriteLoggerFactory:
    def __init__(self, file: TextIO) -> None:
        self._file = file

    def __call__(self, *args: Any) -> _NamedWriteLogger:
        name = args[0] if args and isinstance(args[0], str) else "edge_agent"
        return _NamedWriteLogger(self._file, name)


def _add_logger_name(logger: Any, method: str,
                     event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    record = event_dict.get("_record")
    name = record.name if record is not None else getattr(logger, "name", None)
    if name and "logger" not in event_dict:
        event_dict["logger"] = name
    return event_dict


def _field_order(logger: Any, method: str,
                 event_dict: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    head = {k: event_dict.pop(k) for k in ("ts", "level", "logger", "event") if k in event_dict}
    head.update(event_dict)
    return head


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def configure_logging(level: str = "info", fmt: str = "auto", secrets: Iterable[str] = (), *,
                      stream: TextIO | None = None) -> None:
    """Configure structlog and stdlib logging for the whole process (idempotent)."""
    global _handler
    out = stream if stream is not None else sys.stdout
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"log format must be auto, json or console, not {fmt!r}")
    level_no = LEVELS[level.lower()]
    use_json = fmt == "json" or (fmt == "auto" and not _isatty(out))
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        _add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="ts"),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,  # before redaction: tracebacks are scrubbed too
        SecretRedactor(secrets),
    ]
    renderer: Any
    if use_json:
        renderer = structlog.processors.JSONRenderer(default=str)
        shared.append(_field_order)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=_isatty(out), timestamp_key="ts")
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=_NamedWriteLoggerFactory(out),
        cache_logger_on_first_use=False,
    )
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = logging.StreamHandler(out)
    _handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=shared,
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
    ))
    root.addHandler(_handler)
    root.setLevel(level_no)
    # transitions logs every state change at INFO; the executor emits its own events.
    logging.getLogger("transitions").setLevel(max(level_no, logging.WARNING))
    logging.captureWarnings(True)
