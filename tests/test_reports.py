"""Repair reports without a daemon: the record, Markdown (parsed), the plot (its pixels), limits,
and the durable outbox delivering to a real local HTTP receiver (429 + Retry-After, 45009,
merged repeats, bounded with drops counted, a restart)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt
from mosquitto import wait_until
from tiny_fs import tiny_fs

from edge_agent.executor.controllers import Measured
from edge_agent.executor.monitor import SensorRing
from edge_agent.reports.build import build_report
from edge_agent.reports.markdown import cut_markdown, render_markdown
from edge_agent.reports.outbox import DONE, PENDING, Entry, Outbox, Result
from edge_agent.reports.plot import render_plot
from edge_agent.reports.record import (
    DiagnosisRecord,
    ModeRecord,
    Origin,
    Report,
    StopRecord,
    is_report_id,
    new_report_id,
)
from edge_agent.reports.sinks import MQTT_MAX_BYTES, DiskSink, mqtt_payload
from edge_agent.reports.webhook import (
    WECOM_MARKDOWN_MAX,
    SendWindow,
    WebhookSink,
    parse_retry_after,
    wecom_messages,
)
from hil.webhook_receiver import Receiver

TOKEN = "tok-5e3f9a7c1d2b4e6f8a0b"
ORIGIN = Origin("robot-7", "b00t", "cfg123", "ab" * 32)


def _measured(i: int) -> Measured:
    s = i / 50.0
    return Measured((0.1 * s, 1.0 - 0.2 * s, -1.5, 0.3), (0.0,) * 4,
                    (0.5 + s, -0.4, 0.2 * s, 0.05), 0.08 - 0.01 * s, 5.0 * s, 0.3,
                    (0.3, 0.0, 0.2, 0.0))


def _window(n: int = 120) -> dict[str, Any]:
    ring = SensorRing(window_s=10.0, sample_hz=50.0)
    for i in range(n):
        ring.add(100.0 + i * 0.025, _measured(i))  # a bit slower than 50 Hz: all kept
    return ring.window()


def _stop_report(cause: str = "collision", wall: float | None = None) -> Report:
    rec = StopRecord("protective_stop", cause, (cause,), False, wall or time.time(), 102.4,
                     "running", "transfer", {"task_id": "job-9", "state": "transfer"}, _window())
    return build_report(rec, ORIGIN, [{"t_s": 101.0, "state": "transfer", "action": "continue",
                                       "backend": "onnx-cpu", "latency_ms": 0.4,
                                       "outcome": "ok", "accepted": None}])


def test_the_sensor_window_holds_the_raw_samples_not_a_summary() -> None:
    w = _window(120)
    assert w["samples"] == len(w["rows"]) == 120
    assert w["columns"][:2] == ["t_s", "q0_rad"]
    m = _measured(37)
    row = w["rows"][37]
    assert row[0] == pytest.approx(100.0 + 37 * 0.025)
    assert row[1:5] == pytest.approx(list(m.q), abs=1e-5)
    assert row[-1] == pytest.approx(m.gripper_force, abs=1e-3)


def test_report_ids_sort_by_time_and_the_record_round_trips() -> None:
    a, b = new_report_id(1_000.0), new_report_id(2_000.0)
    assert is_report_id(a) and a < b
    r = _stop_report()
    assert Report.from_dict(json.loads(json.dumps(r.as_dict()))) == r


def test_markdown_renders_with_tables_and_every_part_an_operator_needs() -> None:
    r = _stop_report()
    md = render_markdown(r, max_rows=12, plot_name=f"{r.id}.png")
    tokens = MarkdownIt("commonmark").enable("table").parse(md)
    types = [t.type for t in tokens]
    assert types.count("table_open") >= 4  # headline, scope, details, window, decisions
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert headings[0] == "Protective stop: collision detected (joint current over its bound)"
    for h in ("Affected", "Measures taken", "Expected recovery", "What to check",
              "Sensor window", "Last decisions"):
        assert h in headings
    html = MarkdownIt("commonmark").enable("table").render(md)
    assert f'<img src="{r.id}.png"' in html
    # the window table: 12 rows, evenly spaced, first and last sample kept
    window_rows = [ln for ln in md.split("## Sensor window")[1].split("## Last")[0].splitlines()
                   if ln.startswith("| 10")]
    assert len(window_rows) == 12
    assert window_rows[0].startswith("| 100.000 |")
    assert window_rows[-1].startswith("| 102.975 |")
    assert "job-9" in md and "cfg123" in md and "Needs an operator" in md


def test_secrets_never_reach_the_markdown() -> None:
    url = f"https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={TOKEN}"
    rec = DiagnosisRecord(time.time(), 5.0, {"l3_count": 5, "state": "grasp",
                                             "note": f"posted to {url}", "other": f"key={TOKEN}"})
    md = render_markdown(build_report(rec, ORIGIN), secrets=[url])
    assert TOKEN not in md and "posted to ***" in md


def test_a_mode_record_becomes_a_report_with_its_recovery_rule() -> None:
    rec = ModeRecord("gpu_lost", True, "3 failed GPU probes", 1_800_000_000.0, 9.0,
                     ("inference.gpu",), "onnx-cpu", "back on the GPU after 3 good probes",
                     next_probe_wall=1_800_000_010.0)
    r = build_report(rec, ORIGIN)
    assert r.kind.value == "mode_entered" and "onnx-cpu" in r.measures[0]
    assert "next probe at 2027-01-15 08:00:10 UTC" in r.recovery


def test_wecom_markdown_is_cut_at_a_line_within_4096_bytes_with_a_pointer() -> None:
    text = "\n".join(f"| 行 {i} | 温度 {i} °C | ok |" for i in range(800))
    out = cut_markdown(text, WECOM_MARKDOWN_MAX, "*(cut: see report X)*")
    assert len(out.encode()) <= WECOM_MARKDOWN_MAX
    body, pointer = out.rstrip("\n").rsplit("\n", 1)
    assert pointer == "*(cut: see report X)*"
    assert body.strip("\n").splitlines() == text.splitlines()[:len(body.strip().splitlines())]
    r = _stop_report()
    entry = Entry(r, text, {})
    msgs = wecom_messages(entry, [], None, "robot-7")
    content = msgs[0][1]["markdown"]["content"]
    assert len(content.encode()) <= WECOM_MARKDOWN_MAX and r.id in content.splitlines()[-1]


def test_the_mqtt_payload_stays_under_64_kib() -> None:
    r = _stop_report()
    entry = Entry(r, "x" * 50 + "\n" + "\n".join("y" * 200 for _ in range(600)), {})
    p = mqtt_payload(entry, "robot-7", None)
    assert len(json.dumps(p, separators=(",", ":")).encode()) <= MQTT_MAX_BYTES
    assert p["cut"] is True and f"reports show {r.id}" in p["markdown"]


def test_send_window_never_lets_more_than_the_rate_through_in_any_minute_and_retry_after(
        ) -> None:
    w = SendWindow(20)
    assert all(w.take(0.0) for _ in range(20))
    assert not w.take(0.0) and w.wait_s(0.0) == pytest.approx(60.0)
    assert not w.take(59.9) and w.take(60.0)  # the first send has left the window
    # a steady offer of one a second for ten minutes: never more than 20 in any 60 s
    w, sent = SendWindow(20), []
    for t in range(600):
        if w.take(float(t)):
            sent.append(t)
    assert max(sum(1 for x in sent if t <= x < t + 60) for t in range(600)) == 20
    assert parse_retry_after("7", 0.0) == 7.0
    assert parse_retry_after("Thu, 01 Jan 1970 00:00:30 GMT", 10.0) == pytest.approx(20.0)
    assert parse_retry_after("soon", 0.0) is None


def test_the_plot_is_a_real_png_drawn_in_a_subprocess(tmp_path: Path) -> None:
    from PIL import Image

    r = _stop_report()
    src = tmp_path / "r.json"
    src.write_text(json.dumps(r.as_dict()))
    out = tmp_path / "r.png"
    assert render_plot(src, out, timeout_s=120) is None
    img = Image.open(out).convert("RGB")
    assert img.size[0] >= 600 and img.size[1] >= 400
    colours = img.getcolors(maxcolors=1 << 20)
    assert colours is not None
    white = max(colours)[0] / (img.size[0] * img.size[1])
    assert white < 0.97  # not blank
    distinct = {c for n, c in colours if n > 50}
    assert len(distinct) >= 6  # several line colours, axes, text


class _Failing:
    name = "failing"

    def wait_s(self, now: float) -> float:
        return 0.0

    def group(self, entry: Entry, pending: Any) -> list[Entry]:
        return []

    def deliver(self, entry: Entry, merged: Any, plot: Path | None,
                state: dict[str, Any]) -> Result:
        return Result(False, "down")


def test_outbox_is_bounded_counts_what_it_drops_and_survives_a_restart(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    ob = Outbox(tmp_path / "outbox", [_Failing()], max_entries=3, plot=False,
                retry_min_s=30, on_event=events.append)
    ob.start()
    reports = [_stop_report(wall=1_000.0 + i) for i in range(5)]
    try:
        for r in reports:
            ob.submit(lambda r=r: r)
        wait_until(lambda: ob.status()["built"] == 5, 30, "5 reports built")
    finally:
        ob.stop()
    kept = sorted(p.stem for p in (tmp_path / "outbox").glob("0*.json"))
    assert kept == sorted(r.id for r in reports)[2:]  # the two oldest were dropped
    assert ob.status()["dropped"] == 2 and [e["type"] for e in events] == ["report_dropped"] * 2
    again = Outbox(tmp_path / "outbox", [_Failing()], max_entries=3, plot=False)
    again.start()
    try:
        assert again.pending_ids() == kept and again.status()["dropped"] == 2
    finally:
        again.stop()


def _webhook_outbox(tmp_path: Path, recv: Receiver, **kw: Any) -> Outbox:
    sink = WebhookSink(recv.url(TOKEN), device="robot-7", **kw)
    return Outbox(tmp_path / "outbox", [sink, DiskSink(tmp_path / "reports", 50)],
                  plot=False, retry_min_s=0.05, retry_max_s=0.5, secrets=[recv.url(TOKEN)])


def test_429_with_retry_after_and_errcode_45009_is_honoured(tmp_path: Path) -> None:
    recv = Receiver().start()
    recv.plan = [(429, 45009, {"Retry-After": "2"}), (200, 45009, {"Retry-After": "1"})]
    ob = _webhook_outbox(tmp_path, recv)
    ob.start()
    try:
        r = _stop_report()
        ob.submit(lambda: r)
        wait_until(lambda: ob.status()["delivered"]["webhook"] == 1, 60, "delivered")
    finally:
        ob.stop()
        recv.stop()
    reqs = [q for q in recv.snapshot() if q["body"]["msgtype"] == "markdown"]
    assert len(reqs) == 3
    assert reqs[1]["at"] - reqs[0]["at"] >= 2.0  # waited what Retry-After said, not less
    assert reqs[2]["at"] - reqs[1]["at"] >= 1.0  # HTTP 200 with errcode 45009 is a failure
    assert {q["headers"]["Idempotency-Key"] for q in reqs} == {r.id}
    assert ob.status()["failed_attempts"]["webhook"] == 2
    assert TOKEN not in json.dumps(ob.status())


def test_repeats_of_one_fault_go_as_one_message_with_a_count(tmp_path: Path) -> None:
    recv = Receiver()  # not started: the reports pile up in the outbox
    ob = _webhook_outbox(tmp_path, recv, merge_window_s=60.0)
    ob.start()
    t0 = time.time()
    reps = [_stop_report(wall=t0 + i) for i in range(4)] + [_stop_report("deadman", t0 + 5)]
    try:
        for r in reps:
            ob.submit(lambda r=r: r)
        wait_until(lambda: ob.status()["built"] == 5, 30, "built")
        wait_until(lambda: ob.status()["failed_attempts"]["webhook"] >= 1, 30, "a failed try")
        recv.start()
        wait_until(lambda: ob.status()["pending"] == 0, 60, "all delivered")
    finally:
        ob.stop()
        recv.stop()
    uniq = recv.unique()
    md = [u["body"]["markdown"]["content"] for u in uniq.values()]
    assert len(uniq) == 2  # four collisions merged into one message, the deadman on its own
    merged = next(c for c in md if "4× this fault" in c)
    assert all(r.id in merged for r in reps[:4])
    assert sorted(uniq) == sorted([reps[0].id, reps[4].id])


def test_the_daemon_never_imports_matplotlib_or_urllib3_without_a_webhook() -> None:
    import subprocess
    import sys

    code = ("import sys, edge_agent.daemon.app, edge_agent.daemon.reporting;"
            "print([m for m in ('matplotlib', 'urllib3', 'PIL') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_webhook_config_keys_are_validated(tmp_path: Path) -> None:
    from edge_agent.config import load_config
    from edge_agent.errors import ConfigError

    sim = Path(__file__).resolve().parents[1] / "configs" / "sim.toml"
    url_file = tmp_path / "hook"
    url_file.write_text(f"https://qyapi.weixin.qq.com/cgi-bin/webhook/send?key={TOKEN}\n")
    url_file.chmod(0o600)
    base = [f"state_dir={tmp_path}"]
    cfg = load_config(sim, [*base, f'reports.webhook_url_file="{url_file}"'], sim=True)
    assert cfg.reports.webhook_url is not None and TOKEN in cfg.reports.webhook_url.reveal()
    assert TOKEN not in repr(cfg.reports)
    with pytest.raises(ConfigError, match="not both"):
        load_config(sim, [*base, f'reports.webhook_url_file="{url_file}"',
                          'reports.webhook_url="https://x.example/h"'], sim=True)
    with pytest.raises(ConfigError, match="webhook_format"):
        load_config(sim, [*base, 'reports.webhook_format="slack"'], sim=True)
    url_file.write_text("not a url\n")
    with pytest.raises(ConfigError, match="one http"):
        load_config(sim, [*base, f'reports.webhook_url_file="{url_file}"'], sim=True)
    with pytest.raises(ConfigError, match="retry_min_s"):
        load_config(sim, [*base, "reports.retry_min_s=10", "reports.retry_max_s=5"], sim=True)


def test_a_storm_of_one_fault_draws_one_plot(tmp_path: Path) -> None:
    ob = Outbox(tmp_path / "outbox", [_Failing()], retry_min_s=30, plot_repeat_s=60.0)
    ob.start()
    t0 = time.time()
    reps = [_stop_report(wall=t0 + i) for i in range(3)] + [_stop_report("deadman", t0 + 3)]
    try:
        for r in reps:
            ob.submit(lambda r=r: r)
        wait_until(lambda: len(list((tmp_path / "outbox").glob("0*.png"))) == 2, 120, "plots")
        wait_until(lambda: ob.status()["built"] == 4, 30, "built")
    finally:
        ob.stop()
    pngs = sorted(p.stem for p in (tmp_path / "outbox").glob("0*.png"))
    assert pngs == sorted([reps[0].id, reps[3].id])
    plots = {r.id: json.loads((tmp_path / "outbox" / f"{r.id}.json").read_text())["plot"]
             for r in reps}
    assert plots[reps[1].id].startswith("none: a repeat") and plots[reps[0].id] == "ok"


class _Memory:
    name = "memory"

    def __init__(self) -> None:
        self.got: list[tuple[str, Path | None]] = []

    def wait_s(self, now: float) -> float:
        return 0.0

    def group(self, entry: Entry, pending: Any) -> list[Entry]:
        return []

    def deliver(self, entry: Entry, merged: Any, plot: Path | None,
                state: dict[str, Any]) -> Result:
        self.got.append((entry.id, plot))
        return Result(True)


def test_on_a_full_disk_a_report_is_delivered_from_memory_and_storage_low_draws_no_plot(
        tmp_path: Path) -> None:
    with tiny_fs(tmp_path / "fs", "256k") as fs:
        sink = _Memory()
        ob = Outbox(fs / "outbox", [sink], retry_min_s=0.05)
        ob.start()
        try:
            dd = subprocess.run(["dd", "if=/dev/zero", f"of={fs / 'fill'}", "bs=4k"],
                                capture_output=True, check=False)  # another process fills it
            assert b"No space left" in dd.stderr, dd.stderr
            ob.shed_plots = True  # what storage_low sets (health_sources.py)
            r = _stop_report()
            assert r.window is not None  # a report that would get a plot
            ob.submit(lambda: r)
            wait_until(lambda: bool(sink.got), 30, "delivered")
        finally:
            ob.stop()
        assert sink.got == [(r.id, None)]
        st = ob.status()
        assert st["unpersisted"] >= 1 and st["shed_plots"] is True, st
        assert not list((fs / "outbox").glob("0*"))  # nothing written, nothing drawn


def test_watch_prints_the_report_title() -> None:
    from edge_agent.comms.watch import Received, format_message

    r = _stop_report()
    entry = Entry(r, "# title\n", {})
    msg = Received("edge/robot-7/report", json.dumps(mqtt_payload(entry, "robot-7", None))
                   .encode(), False, time.time())
    line = format_message(msg).splitlines()[0]
    assert "robot-7 report" in line and r.title in line and r.id in line


def test_an_outbox_entry_encodes_its_report_once_and_its_state_each_time(
        tmp_path: Path) -> None:
    """The entry file is what as_dict() says; the report (with its sensor window) is encoded
    once, each delivery step re-encodes only the small state; the disk sink's JSON is the
    report as encoded plus where its plot is."""
    rep = _stop_report()
    e = Entry(rep, "# md", {"disk": {"state": PENDING, "attempts": 0}})
    assert json.loads(e.to_json()) == e.as_dict()
    first = e.report_json()
    e.sinks["disk"].update(state=DONE, attempts=2)
    e.plot = "ok"
    assert json.loads(e.to_json()) == e.as_dict() and e.report_json() is first
    assert Entry.from_dict(json.loads(e.to_json())).as_dict() == e.as_dict()
    sink = DiskSink(tmp_path / "reports", 10)
    assert sink.deliver(e, [], None, {}).ok
    assert json.loads((tmp_path / "reports" / f"{e.id}.json").read_text()) == {
        **rep.as_dict(), "plot": None}
