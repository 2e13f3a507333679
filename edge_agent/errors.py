"""The one root exception and the error families the daemon raises at its boundaries."""

from __future__ import annotations


class EdgeAgentError(Exception):
    """Root of every error edge-agent raises on purpose."""


class ConfigError(EdgeAgentError):
    """A configuration or robot-description value is invalid; the message names key, value, why."""

    def __init__(self, key: str, value: object, why: str, source: str | None = None) -> None:
        self.key = key
        self.value = value
        self.why = why
        self.source = source
        where = f"{source}: " if source else ""
        super().__init__(f"{where}{key} = {value!r}: {why}")

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, object, str, str | None]]:
        # picklable (multiprocessing workers re-raise it in the parent)
        return (type(self), (self.key, self.value, self.why, self.source))


class LinkError(EdgeAgentError):
    """The serial link (or the guardian's socketpair) failed: port gone, write timeout, fault."""


class StoreError(EdgeAgentError):
    """A snapshot or journal operation failed; an fsync failure is fatal for that file."""
