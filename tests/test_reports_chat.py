"""The chat message of every report kind holds to WeCom's classic `markdown` (issue #27 item 4).

Classic `markdown` renders headings, bold, links, inline code, quotes and `<font color>` only: a
table or a list arrives as raw `|` and `-`. Each summary is parsed (markdown-it, GFM tables on)
and read line by line: no table, no list (in a quote neither), no rule, image or code block, only
WeCom's three colours, at most 4,096 bytes UTF-8 — and every field an operator needs is there.
Built from records of every kind: every stop cause, a diagnosis from the executor's own
`fault_record`, every degradation mode entered and left, a drift report with and without drift;
and from the reports the real daemon wrote for docs/REPORTS.md, whose chat texts must be what the
sink sends today.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from test_reports import ORIGIN, TOKEN, _window

from edge_agent.executor.faults import FaultPolicy, fault_record
from edge_agent.executor.tasks import FailureKind, State
from edge_agent.reports.build import build_report, utc
from edge_agent.reports.drift import build_drift_report, period_summary
from edge_agent.reports.outbox import Entry
from edge_agent.reports.record import (
    DiagnosisRecord,
    ModeRecord,
    Report,
    ReportKind,
    StopRecord,
)
from edge_agent.reports.webhook import WECOM_MARKDOWN_MAX, wecom_messages
from edge_agent.vocab import ESTOP_CAUSES, DegradationMode, StopCause
from hil.webhook_receiver import wecom_problem

DOCS = Path(__file__).resolve().parents[1] / "docs"
TOPIC = "edge/robot-7/report"
_FORBIDDEN_TOKENS = {"table_open", "bullet_list_open", "ordered_list_open", "hr", "image",
                     "fence", "code_block", "html_block", "lheading_open"}
_FONT = re.compile(r'<font color="(info|comment|warning)">|</font>')
_LIST = re.compile(r"([-*+]|\d{1,9}[.)])(\s|$)")
_TABLE = re.compile(r"\||:?-{3,}:?\s*(\||$)")


def classic_problems(text: str) -> list[str]:
    """Why `text` would not render as meant in WeCom's classic markdown (empty: it would)."""
    problems = []
    if len(text.encode()) > WECOM_MARKDOWN_MAX:
        problems.append(f"{len(text.encode())} bytes > {WECOM_MARKDOWN_MAX}")
    md = MarkdownIt("commonmark").enable("table")
    for tok in md.parse(text):
        if tok.type in _FORBIDDEN_TOKENS:
            problems.append(f"{tok.type} at line {(tok.map or [0])[0] + 1}")
        for child in tok.children or ():
            if child.type == "image":
                problems.append("an image")
            if child.type == "html_inline" and not _FONT.fullmatch(child.content):
                problems.append(f"html {child.content!r}")
    for n, line in enumerate(text.splitlines(), 1):
        bare = line.lstrip(" >")  # a list or a table inside a quote is still one
        if _LIST.match(bare):
            problems.append(f"line {n} is a list item: {line!r}")
        if _TABLE.match(bare) or bare.rstrip().endswith("|"):
            problems.append(f"line {n} is a table row: {line!r}")
        if re.fullmatch(r"\s*(\*\s*){3,}|\s*(_\s*){3,}|\s*(-\s*){3,}|\s*={3,}\s*", bare):
            problems.append(f"line {n} is a rule: {line!r}")
    return problems


def _one(text: str) -> str:
    return " ".join(text.split())


def missing_fields(text: str, r: Report, topic: str) -> list[str]:
    """The fields the summary must carry that `text` lacks."""
    flat = _one(text)
    cause = {ReportKind.ESTOP: str(r.details.get("cause")),
             ReportKind.PROTECTIVE_STOP: str(r.details.get("cause")),
             ReportKind.DIAGNOSIS: r.fault.partition(":")[2],
             ReportKind.MODE_ENTERED: str(r.details.get("mode")),
             ReportKind.MODE_LEFT: str(r.details.get("mode")),
             ReportKind.DRIFT: str(r.details.get("verdict")),
             ReportKind.MODEL_ROLLBACK: str((r.details.get("reasons") or ["?"])[0]),
             ReportKind.SHADOW: "agreement"}[r.kind]
    want = {"title": f"## {_one(r.title)}\n", "cause": "**Cause:** <font color=",
            "cause value": cause, "device": f"**Device:** {r.origin.device}",
            "time": f"**Time:** {utc(r.wall)}", "done": "**Done:**",
            "check": "**Check:**", "recover": f"**Recover:** {_one(r.recovery)}",
            "report id": f"`{r.id}`", "show": f"`edge-agent reports show {r.id}`",
            "mqtt": f"MQTT `{topic}`"}
    out = [k for k, v in want.items() if v not in (text if "\n" in v else flat)]
    out += [f"measure {m!r}" for m in r.measures if _one(m) not in flat]
    out += [f"check {c!r}" for c in r.checks if _one(c) not in flat]
    return out


def _sent(r: Report, merged: list[Report] | None = None, plot: Path | None = None,
          secrets: tuple[str, ...] = ()) -> str:
    msgs = wecom_messages(Entry(r, "# the full report\n\n| a | b |\n|---|---|\n", {}),
                          [Entry(m, "", {}) for m in merged or []], plot, r.origin.device,
                          report_topic=TOPIC, secrets=secrets)
    body = msgs[0][1]
    assert body["msgtype"] == "markdown" and wecom_problem(body) is None
    assert [p for p, _ in msgs] == ["markdown", *(["image"] if plot else [])]
    return str(body["markdown"]["content"])


# -- records of every kind ----------------------------------------------------------------
def _stop(cause: StopCause, wall: float | None = None) -> Report:
    kind = "estop" if cause in ESTOP_CAUSES else "protective_stop"
    rec = StopRecord(kind, cause.value, (cause.value, StopCause.DEADMAN.value), cause is
                     StopCause.ESTOP_INPUT, wall or time.time(), 102.4, "running", "transfer",
                     {"task_id": "job-9", "state": "transfer", "task": "pick_place"}, _window())
    return build_report(rec, ORIGIN)


def _diagnosis() -> Report:
    """The executor's own L3 record: three weak grips in a row (policy.attempt_failed)."""
    policy = FaultPolicy(l3_threshold=3)
    policy.begin_task()
    for i in range(3):
        policy.begin_subgoal()
        policy.attempt_failed(10.0 + i, State.GRASP, FailureKind.GRIP_WEAK, (), "force 0.2 N")
    rec = fault_record(13.0, State.GRASP, "job-9", 3, policy, dict(_window()))
    return build_report(DiagnosisRecord(time.time(), 13.0, dict(rec)), ORIGIN)


def _mode(mode: str, entered: bool) -> Report:
    rec = ModeRecord(mode, entered, "3 failed probes of broker: connection refused", time.time(),
                     9.0, ("commands over MQTT",), "the local socket" if entered else None,
                     "left after 3 good probes of broker", time.time() + 5,
                     {"probe": "broker", "subject": "", "strikes": 3})
    return build_report(rec, ORIGIN)


def _drift(shift: bool) -> Report:
    """The periodic drift report: grasp decisions shifted to retry_alternative, or the same."""
    t0 = time.time() - 1000
    last = period_summary({"actions": {"grasp": {"continue": 80, "advance": 40}},
                           "episodes": 10, "outcomes": {"success": 9, "failed": 1}, "l3": 1},
                          t0, t0 + 500, {"correct": 1, "wrong": 0, "needs_work": 0})
    grasp = {"retry_alternative": 90, "advance": 30} if shift else {"continue": 79, "advance": 41}
    this = period_summary({"actions": {"grasp": grasp}, "episodes": 9,
                           "outcomes": {"success": 5, "failed": 4}, "l3": 3},
                          t0 + 500, t0 + 1000, None)
    return build_drift_report(this, last, 0.15, 500.0, ORIGIN, mono=1.0)


def _rollback() -> Report:
    """A model trial's rollback (reports/model_trial.py) after a latency regression."""
    from edge_agent.reports.model_trial import build_rollback_report

    ref = {"name": "pick-place-policy", "version": "1.0.0", "sha256": "b6" * 32}
    trial = {"sha256": "7e" * 32, "name": "pick-place-policy", "version": "1.0.1-rc1",
             "previous": ref, "restored": ref, "started_wall": time.time() - 60,
             "ended_wall": time.time(), "rules": {"tasks": 20, "latency_ms": 5.0},
             "evidence": {"tasks": 0, "attempts": 5, "slow": 5, "worst_ms": 14.0},
             "verdict": {"state": "regression", "reasons": [
                 "decision latency: 5 of 5 attempts over the 5 ms budget (worst 14.0 ms; "
                 "limit: 5 and 5%)"]}}
    return build_rollback_report(trial, ORIGIN, [], wall=time.time(), mono=1.0)


def _shadow() -> Report:
    """A shadow candidate's summary: grasp decisions that differ, with their task and step."""
    from edge_agent.inference.shadow_tally import ShadowTally
    from edge_agent.reports.shadow import build_shadow_report

    t = ShadowTally()
    for i in range(300):
        state = ("approach", "grasp", "lift")[i % 3]
        shadow = "retry_alternative" if state == "grasp" and i % 2 else "continue"
        t.count(state, "continue", shadow, 0.3, 0.2, "job-1", i, "local")
    summary = {"candidate": {"name": "policy", "version": "c-7", "sha256": "ab" * 32},
               "since": time.time() - 60, **t.summary(), "dropped": 0, "skipped": 0,
               "errors": 0, "report_after": 300}
    return build_shadow_report(summary, "after", ORIGIN, wall=time.time(), mono=1.0)


def _all_kinds() -> list[Report]:
    reports = [_stop(c) for c in StopCause] + [_diagnosis(), _drift(True), _drift(False),
                                               _rollback(), _shadow()]
    for m in DegradationMode:
        for entered in (True, False):
            reports.append(_mode(m.value, entered))
    reports.append(_mode("sensor_predicted:wrist_force", True))
    return reports


REPORTS = _all_kinds()


def test_every_report_kind_is_covered() -> None:
    assert {r.kind for r in REPORTS} == set(ReportKind)


@pytest.mark.parametrize("r", REPORTS, ids=[r.fault + ":" + r.kind.value for r in REPORTS])
def test_the_chat_summary_is_classic_markdown_with_every_field(r: Report, tmp_path: Path) -> None:
    plot = tmp_path / "p.png"
    plot.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    text = _sent(r, plot=plot if r.has_plot else None)
    assert classic_problems(text) == [], text
    assert missing_fields(text, r, TOPIC) == [], text
    assert ("follows as an image" in text) == r.has_plot
    assert len(text.encode()) < 2000  # a phone screen or two, not the 4 kB limit


def test_a_hundred_merged_repeats_still_fit_with_every_field() -> None:
    t0 = time.time()
    lead, rest = _stop(StopCause.COLLISION, t0), [_stop(StopCause.COLLISION, t0 + i)
                                                  for i in range(1, 100)]
    text = _sent(lead, rest)
    assert classic_problems(text) == [] and missing_fields(text, lead, TOPIC) == [], text
    assert "**100× this fault**" in text and "and 95 more" in text
    assert rest[3].id in text and rest[-1].id not in text  # the first five ids, then a count
    body = wecom_messages(Entry(lead, "", {}), [Entry(m, "", {}) for m in rest], None,
                          "robot-7")[0][1]
    assert body["report_ids"] == [lead.id, *(m.id for m in rest)]  # all of them, for a receiver


def test_huge_values_are_cut_to_fit_and_keep_the_pointer_to_the_full_report() -> None:
    rec = ModeRecord("broker_lost", True, "- " + "x " * 3000 + "\n| a | b |", time.time(), 1.0,
                     tuple(f"capability {i}" for i in range(400)), None, "y " * 3000, None,
                     {f"k{i}": "v" * 50 for i in range(200)})
    r = build_report(rec, ORIGIN)
    text = _sent(r)
    assert classic_problems(text) == [], text
    assert f"`edge-agent reports show {r.id}`" in text.splitlines()[-1]


def test_secrets_never_reach_the_chat() -> None:
    url = f"https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={TOKEN}"
    rec = ModeRecord("broker_lost", True, f"posted to {url}", time.time(), 1.0, (), None,
                     f"key={TOKEN}", None, {"token": TOKEN})
    text = _sent(build_report(rec, ORIGIN), secrets=(url,))
    assert TOKEN not in text and "posted to ***" in text


def test_the_rules_catch_what_classic_markdown_does_not_render() -> None:
    """The checker is not vacuous: what the old message sent (the full report) fails it."""
    full = (DOCS / "reports" / "protective-stop-collision.md").read_text(encoding="utf-8")
    found = "\n".join(classic_problems(full))
    assert "table_open" in found and "list item" in found and "table row" in found
    assert classic_problems("> 1. one\n> 2. two\n") != []
    assert classic_problems("---\n") != [] and classic_problems("![x](y.png)\n") != []
    assert classic_problems('<font color="red">x</font>\n') != []


# -- the generated docs: the texts the daemon sent, still what the sink sends ---------------
def _doc_chats() -> list[tuple[str, str]]:
    doc = (DOCS / "REPORTS.md").read_text(encoding="utf-8")
    return re.findall(r"<!-- chat: (\S+) -->\n.*?```markdown\n(.*?)```\n", doc, flags=re.S)


def test_docs_reports_md_shows_the_chat_text_of_every_report_kind() -> None:
    chats = _doc_chats()
    kinds = {json.loads((DOCS / "reports" / f"{n}.json").read_text())["kind"] for n, _ in chats}
    assert kinds == {k.value for k in ReportKind}


@pytest.mark.parametrize(("name", "text"), _doc_chats())
def test_each_documented_chat_text_is_what_the_sink_sends_for_that_real_report(
        name: str, text: str) -> None:
    data: dict[str, Any] = json.loads((DOCS / "reports" / f"{name}.json").read_text())
    r = Report.from_dict(data)
    png = DOCS / "reports" / f"{name}.png"
    topic = f"edge/{r.origin.device}/report"
    sent = wecom_messages(Entry(r, "", {}), [], png if png.exists() else None,
                          r.origin.device, report_topic=topic)[0][1]["markdown"]["content"]
    assert sent == text, "docs/REPORTS.md is stale: python -m hil.make_reports_doc"
    assert classic_problems(text) == [] and missing_fields(text, r, topic) == []


def test_the_strict_receiver_refuses_what_wecom_refuses() -> None:
    """hil/webhook_receiver.py answers errcode 40058 where WeCom would refuse the message."""
    assert wecom_problem({"msgtype": "markdown", "markdown": {"content": "é" * 2049}})
    assert wecom_problem({"msgtype": "markdown", "markdown": {"content": "é" * 2048}}) is None
    assert wecom_problem({"msgtype": "image", "image": {"base64": "AAAA", "md5": "0" * 32}})
    assert wecom_problem({"msgtype": "news"})
    assert wecom_problem({"v": 1, "markdown": "x" * 10_000}) is None  # the JSON format
