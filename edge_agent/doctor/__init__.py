"""`edge-agent doctor`: checks what the daemon needs on this machine and says how to fix each miss.

Each check returns findings: a level, what was found, and — for a miss — the fix. The exit code is
the worst level: 0 all ok, 1 a warning (the daemon runs, worse than it should: no real-time
priority, clock not synchronised, a GPU asked for and not given), 2 an error (it will not work:
the tty cannot be opened, the broker refuses the device, the model fails verification, the state
directory is not writable, the config is invalid).

Checks (modules beside this one): the config; `host` — the tty, real-time scheduling and memory
locking, the state directory and its filesystem, the clock; `broker` — login with the configured
credentials and TLS, and what the ACL lets the device do; `model` — the model against its card,
and the execution providers onnxruntime really gives a session.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Level(enum.IntEnum):
    """A finding's severity; the exit code is the worst one."""

    OK = 0
    WARN = 1
    ERROR = 2


@dataclass(frozen=True)
class Finding:
    """One result: which check, how bad, what was found and how to fix it."""

    check: str
    level: Level
    message: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {"check": self.check, "level": self.level.name.lower(), "message": self.message,
                "fix": self.fix}


def ok(check: str, message: str) -> Finding:
    return Finding(check, Level.OK, message)


def warn(check: str, message: str, fix: str) -> Finding:
    return Finding(check, Level.WARN, message, fix)


def error(check: str, message: str, fix: str) -> Finding:
    return Finding(check, Level.ERROR, message, fix)


def worst(findings: list[Finding]) -> Level:
    return max((f.level for f in findings), default=Level.OK)
