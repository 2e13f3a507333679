"""Command replies: the stable error codes, the `Reply` value and the refusal a handler raises."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edge_agent.errors import EdgeAgentError
from edge_agent.vocab import ErrorCode

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class ErrorInfo:
    code: ErrorCode
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code.value, "message": self.message}


@dataclass(frozen=True)
class Reply:
    """The answer to one command; `id` is None only when no id could be recovered."""

    id: str | None
    ok: bool
    result: Mapping[str, Any] | None = None
    error: ErrorInfo | None = None

    @classmethod
    def success(cls, command_id: str | None, result: Mapping[str, Any] | None = None) -> Reply:
        return cls(command_id, True, dict(result) if result is not None else {}, None)

    @classmethod
    def failure(cls, command_id: str | None, code: ErrorCode, message: str) -> Reply:
        return cls(command_id, False, None, ErrorInfo(code, message))

    @property
    def code(self) -> ErrorCode | None:
        return self.error.code if self.error is not None else None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": self.id, "ok": self.ok}
        if self.result is not None:
            out["result"] = dict(self.result)
        if self.error is not None:
            out["error"] = self.error.to_dict()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Reply:
        """Rebuild a reply from `to_dict()` output (stored dedup entries)."""
        err = data.get("error")
        error = None
        if isinstance(err, Mapping):
            try:
                code = ErrorCode(str(err.get("code")))
            except ValueError:
                code = ErrorCode.INTERNAL
            error = ErrorInfo(code, str(err.get("message", "")))
        result = data.get("result")
        raw_id = data.get("id")
        return cls(
            raw_id if isinstance(raw_id, str) else None,
            bool(data.get("ok")),
            dict(result) if isinstance(result, Mapping) else None,
            error,
        )


class CommandRefused(EdgeAgentError):
    """Raised by a handler to refuse a command with a stable code and a human message."""

    def __init__(self, code: ErrorCode | str, message: str) -> None:
        try:
            self.code = ErrorCode(code)
        except ValueError:
            self.code = ErrorCode.REFUSED
            message = f"{code}: {message}"
        self.message = message
        super().__init__(f"{self.code.value}: {message}")
