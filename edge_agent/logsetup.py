"""Logging set-up, done once by the application: JSON lines or console output, secrets redacted.

    configure_logging(cfg.log.level, cfg.log.format, secrets=cfg.secret_values())

JSON lines on stdout when stdout is not a terminal (journald keeps them as-is; fields `ts`
ISO-8601 UTC, `level`, `logger`, `event`, then the key-values), readable colours on a terminal
(none when NO_COLOR is set); the link guardian writes the same format (--log-format);
`fmt` "json" / "console" forces one. Records from stdlib `logging` (transitions, paho when
enabled, warnings) get the same format. A redacting processor runs last before rendering: values
of keys named like password/secret/token, `Secret` objects and any occurrence of a configured
secret become '***' — in the event text, key-values and formatted tracebacks alike.

Library code never calls this; it uses `edge_agent.log.get_logger(__name__)`. A logger reads the
configuration on every call, so a later configure_logging() reaches loggers that modules hold.
The module is named logsetup, not logging, so that it can never shadow the stdlib module.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any, TextIO

from edge_agent import log
from edge_agent.config import Secret

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


def configure_logging(level: str = "info", fmt: str = "auto", secrets: Iterable[str] = (), *,
                      stream: TextIO | None = None) -> None:
    """Configure edge_agent.log and stdlib logging for the whole process (idempotent)."""
    global _handler
    out = stream if stream is not None else sys.stdout
    if fmt not in ("auto", "json", "console"):
        raise ValueError(f"log format must be auto, json or console, not {fmt!r}")
    level_no = LEVELS[level.lower()]
    use_json = fmt == "json" or (fmt == "auto" and not _isatty(out))
    redactor = SecretRedactor(secrets)

    def redact(ev: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        return redactor(None, "", ev)  # after the traceback is formatted: it is scrubbed too

    renderer: Callable[[MutableMapping[str, Any]], str]
    if use_json:
        renderer = log.render_json
    else:
        colors = _isatty(out) and os.environ.get("NO_COLOR") is None  # https://no-color.org

        def renderer(ev: MutableMapping[str, Any]) -> str:
            return log.render_console(ev, colors)

    log.configure(level=level_no, renderer=renderer, processors=(redact,), stream=out)
    root = logging.getLogger()
    if _handler is not None:
        root.removeHandler(_handler)
    _handler = _StdlibHandler()
    root.addHandler(_handler)
    root.setLevel(level_no)
    # transitions logs every state change at INFO; the executor emits its own events.
    logging.getLogger("transitions").setLevel(max(level_no, logging.WARNING))
    logging.captureWarnings(True)


class _StdlibHandler(logging.Handler):
    """Records from stdlib `logging` (transitions, paho, warnings) in the same format."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # a bad %-format in someone else's library
            msg = f"{record.msg!r} % {record.args!r}"
        kw: dict[str, Any] = {}
        if record.exc_info:
            kw["exc_info"] = record.exc_info
        log.emit(record.name, record.levelno, msg, kw, ts=record.created)
