"""Every cell of DESIGN.md's admission matrix against `admit()`.

The table below is DESIGN.md's "Commands and admission" table copied verbatim (the markdown
rows), parsed here independently of edge_agent.commands.admission, so a change on either side
shows up as a failing cell.
"""

from __future__ import annotations

import pytest

from edge_agent.commands import AdmissionContext, ErrorCode, Mode, Verdict, admit
from edge_agent.commands.admission import MATRIX

DESIGN_TABLE = """
| `task.start` | ✓ | busy | ✓ | refused | refused | refused | refused |
| `task.cancel` | no-op ✓ | ✓ → holding | no-op ✓ | ✓ | — | ✓ | ✓ (clears saved task) |
| `resume` | refused | refused | ✓ if saved | refused | refused | refused | refused |
| `reset` | no-op ✓ | no-op ✓ | no-op ✓ | ✓ → idle | — | ✓ if cause gone | ✓ if input released |
| `manual.enter / jog / exit` | ✓ | refused | ✓ | ✓ | ✓ | refused | refused |
| `estop` | ✓ | ✓ | ✓ | ✓ | ✓ | ✓ | ✓ (stop frame again) |
| `status`, `failure.inject`* | ✓ | ✓ | ✓ | ✓ | ✓ | ✓ | ✓ |
"""
COLUMNS = [Mode.IDLE, Mode.RUNNING, Mode.HOLDING, Mode.DIAGNOSTIC, Mode.MANUAL,
           Mode.PROTECTIVE_STOP, Mode.ESTOP]
ALIASES = {"manual.enter / jog / exit": ["manual.enter", "manual.jog", "manual.exit"],
           "status`, `failure.inject`*": ["status", "failure.inject"]}


def _expected(symbol: str) -> tuple[Verdict, set[ErrorCode] | None]:
    s = symbol.strip()
    if s.startswith("no-op"):
        return Verdict.NOOP, None
    if " if " in s:
        return Verdict.CONDITIONAL, None
    if s.startswith("✓"):
        return Verdict.ADMIT, None
    if s == "busy":
        return Verdict.REFUSE, {ErrorCode.BUSY}
    if s == "refused":
        return Verdict.REFUSE, {ErrorCode.NOT_ADMITTED, ErrorCode.ESTOP_ACTIVE, ErrorCode.BUSY}
    if s == "—":  # does not apply: refused, saying so
        return Verdict.REFUSE, {ErrorCode.NOT_ADMITTED}
    raise ValueError(f"unparsed cell {symbol!r}")


def _cells() -> list[tuple[str, Mode, str]]:
    out = []
    for row in DESIGN_TABLE.strip().splitlines():
        parts = [p.strip() for p in row.strip().strip("|").split("|")]
        head, cells = parts[0].strip("`"), parts[1:]
        assert len(cells) == len(COLUMNS), row
        for name in ALIASES.get(head, [head]):
            out.extend((name, mode, cell) for mode, cell in zip(COLUMNS, cells, strict=True))
    return out


CELLS = _cells()


def test_table_covers_every_design_command_and_mode() -> None:
    assert len(CELLS) == 10 * 7
    names = {c[0] for c in CELLS}
    assert names | {"model.update", "journal.label", "model.shadow", "record.start",
                    "record.stop"} == set(MATRIX)


@pytest.mark.parametrize("command", ["record.start", "record.stop"])
def test_the_flight_recorder_commands_are_admitted_in_every_mode(command: str) -> None:
    for mode in Mode:  # a file is written; the robot never moves
        assert MATRIX[command][mode].verdict is Verdict.ADMIT, mode


@pytest.mark.parametrize(("command", "mode", "symbol"), CELLS,
                         ids=[f"{c}-{m}" for c, m, _ in CELLS])
def test_cell(command: str, mode: Mode, symbol: str) -> None:
    verdict, codes = _expected(symbol)
    if command == "failure.inject":  # "*": only when debug.failure_injection = true
        off = admit(command, mode, AdmissionContext(failure_injection=False))
        assert off.verdict is Verdict.REFUSE and off.code is ErrorCode.DISABLED
        got = admit(command, mode, AdmissionContext(failure_injection=True))
    else:
        got = admit(command, mode, AdmissionContext())
    assert got.verdict is verdict, f"{command} in {mode}: {got}"
    assert got.admitted == (verdict is not Verdict.REFUSE)
    if codes is not None:
        assert got.code in codes
        assert command in got.message and str(mode) in got.message
    else:
        assert got.code is None


@pytest.mark.parametrize("mode", list(Mode))
def test_estop_is_admitted_in_every_mode_even_with_failure_injection_off(mode: Mode) -> None:
    assert admit("estop", mode, AdmissionContext()).verdict is Verdict.ADMIT


def test_refusals_in_estop_mode_say_estop_active() -> None:
    got = admit("task.start", Mode.ESTOP, AdmissionContext())
    assert got.code is ErrorCode.ESTOP_ACTIVE


def test_model_update_refused_only_while_running() -> None:
    for mode in Mode:
        got = admit("model.update", mode, AdmissionContext())
        assert got.admitted == (mode is not Mode.RUNNING), mode


def test_model_shadow_refused_only_while_running_with_busy() -> None:
    # (issue 29: starting one loads a model beside the control thread; between tasks only)
    for mode in Mode:
        got = admit("model.shadow", mode, AdmissionContext())
        assert got.admitted == (mode is not Mode.RUNNING), mode
        if mode is Mode.RUNNING:
            assert got.code is ErrorCode.BUSY and "between tasks" in got.message


@pytest.mark.parametrize("mode", list(Mode))
def test_journal_label_is_admitted_in_every_mode_like_status(mode: Mode) -> None:
    # (issue 28: a label only appends beside the journal; DESIGN.md's table predates it)
    assert admit("journal.label", mode, AdmissionContext()).verdict is Verdict.ADMIT


def test_unknown_mode_admits_only_safe_commands() -> None:
    assert admit("estop", "weird", AdmissionContext()).admitted
    assert admit("status", "weird", AdmissionContext()).admitted
    assert admit("journal.label", "weird", AdmissionContext()).admitted
    assert not admit("task.start", "weird", AdmissionContext()).admitted
    assert not admit("manual.jog", "weird", AdmissionContext()).admitted


def test_unknown_command() -> None:
    got = admit("teleport", Mode.IDLE, AdmissionContext())
    assert got.code is ErrorCode.UNKNOWN_COMMAND
