"""The admission matrix of DESIGN.md as data, and `admit()`: may this command run in this mode?

Cells: ADMIT (the handler runs), NOOP (accepted, nothing to do: the handler is not called),
CONDITIONAL (the handler runs and checks the named condition, refusing if it does not hold),
REFUSE (with a code). DESIGN.md's "—" (does not apply, e.g. `reset` in manual) is a refusal with
`not_admitted` and a message saying what to do instead. `model.update` is not in DESIGN.md's
table: it is admitted everywhere except while a task runs (a policy swap mid-task is refused).
`journal.label` (a person's verdict on a decision or an episode) is admitted everywhere, like
`status`: it only appends to the label file beside the journal. `model.shadow` (start or stop a
candidate run beside the policy, never acting) is admitted everywhere except while a task runs:
starting one reads, hashes and loads a model on the command worker (~0.1-1 s of CPU and GIL
beside the control thread), and a shadow is meant to watch whole tasks — start it between
them, like `model.update`; in a latched stop it is harmless (nothing moves either way).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from edge_agent.vocab import ErrorCode, Mode


class Verdict(StrEnum):
    ADMIT = "admit"
    NOOP = "noop"
    CONDITIONAL = "conditional"
    REFUSE = "refuse"


@dataclass(frozen=True)
class Cell:
    verdict: Verdict
    code: ErrorCode | None = None  # REFUSE only
    note: str = ""  # the condition (CONDITIONAL), the transition, or why refused


@dataclass(frozen=True)
class AdmissionContext:
    failure_injection: bool = False  # debug.failure_injection


@dataclass(frozen=True)
class Admission:
    command: str
    mode: Mode
    verdict: Verdict
    code: ErrorCode | None = None
    message: str = ""

    @property
    def admitted(self) -> bool:
        """True when the command is accepted (ADMIT, NOOP or CONDITIONAL)."""
        return self.verdict is not Verdict.REFUSE


def _ok(note: str = "") -> Cell:
    return Cell(Verdict.ADMIT, None, note)


def _noop(note: str = "") -> Cell:
    return Cell(Verdict.NOOP, None, note)


def _if(condition: str) -> Cell:
    return Cell(Verdict.CONDITIONAL, None, condition)


def _no(code: ErrorCode = ErrorCode.NOT_ADMITTED, note: str = "") -> Cell:
    return Cell(Verdict.REFUSE, code, note)


_ESTOP = _no(ErrorCode.ESTOP_ACTIVE, "e-stop latched; reset first")
_PSTOP = _no(ErrorCode.NOT_ADMITTED, "protective stop latched; reset first")
_MANUAL_VERBS = {
    Mode.IDLE: _ok(), Mode.RUNNING: _no(ErrorCode.BUSY, "a task is running; cancel it first"),
    Mode.HOLDING: _ok(), Mode.DIAGNOSTIC: _ok(), Mode.MANUAL: _ok(),
    Mode.PROTECTIVE_STOP: _PSTOP, Mode.ESTOP: _ESTOP,
}
_EVERYWHERE = {m: _ok() for m in Mode}

MATRIX: Mapping[str, Mapping[Mode, Cell]] = {
    "task.start": {
        Mode.IDLE: _ok(), Mode.RUNNING: _no(ErrorCode.BUSY, "a task is running"),
        Mode.HOLDING: _ok(), Mode.DIAGNOSTIC: _no(note="diagnostic; reset first"),
        Mode.MANUAL: _no(note="manual mode; manual.exit first"),
        Mode.PROTECTIVE_STOP: _PSTOP, Mode.ESTOP: _ESTOP,
    },
    "task.cancel": {
        Mode.IDLE: _noop("no task"), Mode.RUNNING: _ok("-> holding"),
        Mode.HOLDING: _noop("already holding"), Mode.DIAGNOSTIC: _ok(),
        Mode.MANUAL: _no(note="does not apply in manual mode; use manual.exit"),
        Mode.PROTECTIVE_STOP: _ok(), Mode.ESTOP: _ok("clears the saved task"),
    },
    "resume": {
        **{m: _no(note="nothing to resume in this mode") for m in Mode},
        Mode.HOLDING: _if("a task is saved"),
        Mode.RUNNING: _no(ErrorCode.BUSY, "a task is running"),
        Mode.ESTOP: _ESTOP, Mode.PROTECTIVE_STOP: _PSTOP,
    },
    "reset": {
        Mode.IDLE: _noop("nothing latched"), Mode.RUNNING: _noop("nothing latched"),
        Mode.HOLDING: _noop("nothing latched"), Mode.DIAGNOSTIC: _ok("-> idle"),
        Mode.MANUAL: _no(note="does not apply in manual mode; use manual.exit"),
        Mode.PROTECTIVE_STOP: _if("the cause is gone"),
        Mode.ESTOP: _if("the hardware input is released"),
    },
    "manual.enter": _MANUAL_VERBS,
    "manual.jog": _MANUAL_VERBS,
    "manual.exit": _MANUAL_VERBS,
    "estop": {**_EVERYWHERE, Mode.ESTOP: _ok("stop frame again")},
    "status": _EVERYWHERE,
    "journal.label": _EVERYWHERE,  # writes beside the journal only: never moves the robot
    "record.start": _EVERYWHERE,  # the flight recorder: writes a file, never moves the robot
    "record.stop": _EVERYWHERE,
    "failure.inject": {m: _if("debug.failure_injection") for m in Mode},
    "model.update": {**_EVERYWHERE,
                     Mode.RUNNING: _no(ErrorCode.BUSY, "a task is running; model swap refused")},
    "model.shadow": {**_EVERYWHERE, Mode.RUNNING: _no(
        ErrorCode.BUSY, "a task is running; start or stop a shadow between tasks")},
}


def admit(command: str, mode: Mode | str, ctx: AdmissionContext) -> Admission:
    """Pure: the matrix cell for (command, mode), with the context's switches applied."""
    try:
        m = Mode(mode)
    except ValueError:
        # An unknown mode is treated like a protective stop: only the always-safe commands pass.
        m = Mode.PROTECTIVE_STOP
        if command not in ("estop", "status", "task.cancel", "journal.label"):
            return Admission(command, m, Verdict.REFUSE, ErrorCode.NOT_ADMITTED,
                             f"{command} refused: unknown mode {mode!r}")
    row = MATRIX.get(command)
    if row is None:
        return Admission(command, m, Verdict.REFUSE, ErrorCode.UNKNOWN_COMMAND,
                         f"unknown command {command!r}")
    cell = row[m]
    if command == "failure.inject":
        if not ctx.failure_injection:
            return Admission(command, m, Verdict.REFUSE, ErrorCode.DISABLED,
                             "failure.inject refused: debug.failure_injection is false")
        return Admission(command, m, Verdict.ADMIT, None, "")
    if cell.verdict is Verdict.REFUSE:
        why = f": {cell.note}" if cell.note else ""
        return Admission(command, m, Verdict.REFUSE, cell.code, f"{command} refused in {m}{why}")
    return Admission(command, m, cell.verdict, None, cell.note)
