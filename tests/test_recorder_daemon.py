"""The flight recorder end to end: a real daemon on the simulated robot, a real broker.

An e-stop (a report trigger) produces an MCAP file named by the report (on disk, in the MQTT
`report` payload, in the chat text), which reads back with the `mcap` reader, every message
valid against its channel's JSON schema, the seconds before the trigger present;
`record.start` / `record.stop` write an on-demand file; a kill -9 in the middle of an
on-demand capture leaves a file whose complete chunks `StreamReader` reads up to the tear.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from daemon_proc import DaemonProc
from mcap_check import read_checked
from mosquitto import Mosquitto, Probe, wait_until

REPO = Path(__file__).resolve().parents[1]
PRE_S, POST_S = 3.0, 1.0
_SETS = ("health.period_s=3600", f"observe.record_pre_s={PRE_S}",
         f"observe.record_post_s={POST_S}")


def _finished(path: Path) -> bool:
    """The footer's magic is at the end: the writer finished it."""
    try:
        with path.open("rb") as f:
            f.seek(-8, os.SEEK_END)
            return f.read(8) == b"\x89MCAP0\r\n"
    except OSError:
        return False


def test_an_estop_report_links_an_mcap_file_with_the_seconds_before_it(
        tmp_path: Path, broker: Mosquitto) -> None:
    operator = Probe(broker, "operator", "operator-pw")
    operator.connect()
    operator.subscribe("edge/dev1/report")
    d = DaemonProc(tmp_path, broker, extra=_SETS).start()
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        time.sleep(PRE_S + 1.0)  # the ring holds more than pre_s by now
        t_trigger = time.time()
        assert d.socket_cmd("estop")["ok"]
        msg = operator.expect("edge/dev1/report", timeout=60)
        report = json.loads(msg.payload)
        path = Path(report["recording"])
        assert path.parent == d.state_dir / "recordings", path
        assert f"`{path}`" in report["markdown"]  # the Markdown's row names it too
        wait_until(lambda: _finished(path), 30, "the capture finished")
        got = read_checked(path)
        assert got["compression"] == {"lz4"}
        c = got["counts"]
        for topic in ("/link/status", "/link/tx", "/sensors", "/events", "/commands", "/log"):
            assert c[topic] > 0, (topic, dict(c))
        # the STATUS stream from pre_s before the report's time (the recorder's own mark)
        [mark] = got["marks"]
        assert mark["reason"] == "estop" and mark["report_id"] == report["id"]
        trig_ns = mark["trigger"]["sec"] * 10**9 + mark["trigger"]["nsec"]
        assert abs(trig_ns / 1e9 - t_trigger) < 5.0
        lead_s = (trig_ns - got["first"]["/link/status"]) / 1e9
        assert PRE_S - 0.5 <= lead_s <= PRE_S + 0.1, lead_s
        assert c["/link/status"] > 300 * (PRE_S + POST_S), dict(c)  # ~1 kHz, not thinned
        # the chat line (reports/chat.py) names it as well
        from edge_agent.reports.chat import chat_summary
        from edge_agent.reports.record import Report
        stored = json.loads(next((d.state_dir / "reports").glob("*.json")).read_text())
        text = chat_summary(Report.from_dict(stored), report_topic="edge/dev1/report")
        assert f"**Recording:** `{path}`" in text
    finally:
        d.stop()


def _cli(*args: str) -> tuple[int, Any]:
    p = subprocess.run([sys.executable, "-m", "edge_agent.cli", "record", *args, "--json"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    return p.returncode, json.loads(p.stdout)


def test_record_start_stop_and_a_kill_9_mid_file(tmp_path: Path) -> None:
    device = f"rec-{os.getpid()}"  # `--device` finds this daemon, not another test's
    d = DaemonProc(tmp_path, None, device=device,
                   extra=(*_SETS, "observe.record_max_files=3")).start()
    target = ("--device", device, "--timeout", "30")
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        rc, r = _cli("start", "--name", "bench-1", *target)  # edge-agent record start
        assert rc == 0 and r["ok"], r
        path = Path(r["result"]["path"])
        assert "bench-1" in path.name
        busy = d.socket_cmd("record.start")
        assert not busy["ok"] and busy["error"]["code"] == "busy"
        time.sleep(1.5)
        rc, r = _cli("stop", *target)
        assert rc == 0 and Path(r["result"]["path"]) == path
        assert r["result"]["recorder"]["cpu_s"] > 0
        assert d.socket_cmd("record.stop")["error"]["code"] == "refused"
        wait_until(lambda: _finished(path), 30, "finished")
        assert read_checked(path)["counts"]["/link/status"] > 500
        rc, listed = _cli("list", "--state-dir", str(d.state_dir))
        assert rc == 0 and [(x["path"], x["finished"]) for x in listed] == [(str(path), True)]
        bad = d.socket_cmd("record.start", {"name": "Bad Name"})
        assert not bad["ok"] and bad["error"]["code"] == "bad_args"
        # a capture in the middle of being written, then kill -9
        r = d.socket_cmd("record.start", {"name": "torn"})
        torn = Path(r["result"]["path"])
        wait_until(lambda: torn.exists() and torn.stat().st_size > 600_000, 60, "chunks out")
        assert d.proc is not None
        os.kill(d.proc.pid, signal.SIGKILL)
        d.proc.wait(20)
    finally:
        d.stop()
    assert not _finished(torn)
    from mcap.records import Message
    from mcap.stream_reader import StreamReader
    n = 0
    try:
        for rec in StreamReader(str(torn), validate_crcs=True).records:
            n += isinstance(rec, Message)
        torn_at = None
    except Exception as exc:  # the tear: the last record is cut short
        torn_at = type(exc).__name__
    print(f"kill -9 mid-file: {n} messages read up to the tear ({torn_at})")
    assert n > 500, (n, torn_at)
