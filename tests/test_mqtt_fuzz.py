"""Fuzz the MQTT command interface of a real daemon: valid, almost valid and garbage payloads.

A seeded generator (tests/mqtt_payloads.py) sends payloads into every command topic (and a few
unknown ones) of a running daemon, as the operator account, through a private broker. The daemon
must stay up, answer every message that carries a usable id (a reply or an error — counted),
never answer with `internal`, and keep its memory, threads and file descriptors flat.
`estop` payloads latch the daemon on the way: it must still answer everything.

Default: EDGE_FUZZ_N=2000 messages (about 20-40 s here); the issue's full run is
`EDGE_FUZZ_N=10000 python3 -m pytest tests/test_mqtt_fuzz.py -q -s` (prints the figures).
"""

from __future__ import annotations

import collections
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from daemon_proc import DaemonProc
from mosquitto import Mosquitto, Probe, wait_until
from mqtt_payloads import FuzzMessage, fuzz_stream

from edge_agent.comms.mqtt_common import Topics
from edge_agent.vocab import ErrorCode

T1 = Topics("edge/dev1")  # its command and reply topics

N = int(os.environ.get("EDGE_FUZZ_N", "2000"))
SEED = int(os.environ.get("EDGE_FUZZ_SEED", "20240607"))
WINDOW = 100  # expected replies outstanding at most (the daemon's inbox holds 256)
RSS_GROWTH_LIMIT_KB = 64 * 1024  # generous: the dedup window alone may hold 4096 replies


def proc_figures(pid: int) -> dict[str, int]:
    """VmRSS (kB), threads and open file descriptors of a process, from /proc."""
    out = {"fds": len(os.listdir(f"/proc/{pid}/fd"))}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "Threads"):
            out[key] = int(value.split()[0])
    return out


class Replies:
    """Counts replies by id (paho's thread) and lets the sender wait for a window to drain."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.by_id: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        self.pending: set[str] = set()
        self.unparsable = 0

    def on_message(self, client: Any, userdata: Any, msg: Any) -> None:
        try:
            reply = json.loads(msg.payload)
            rid = reply.get("id")
        except (ValueError, AttributeError):
            with self.cond:
                self.unparsable += 1
            return
        with self.cond:
            self.by_id[str(rid)].append({"topic": msg.topic, **reply})
            self.pending.discard(str(rid))
            self.cond.notify_all()

    def expect(self, cid: str) -> None:
        with self.cond:
            self.pending.add(cid)

    def wait_below(self, n: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: len(self.pending) < n, timeout)


def _send(op: Probe, replies: Replies, msgs: list[FuzzMessage], device: str) -> None:
    for m in msgs:
        if m.expects_reply:
            assert replies.wait_below(WINDOW, 60), f"no progress: {len(replies.pending)} pending"
            replies.expect(m.id)
        op.client.publish(Topics(f"edge/{device}").cmd(m.topic_name), m.payload, qos=1)


@pytest.mark.timeout(120 + N // 20)  # past ~4,000 stored commands each costs a full dedup rewrite
def test_fuzzed_commands_are_all_answered_and_the_daemon_stays_flat(
        tmp_path: Path, broker: Mosquitto) -> None:
    msgs = fuzz_stream(N, SEED)
    warm, rest = msgs[: max(1, N // 10)], msgs[max(1, N // 10):]
    replies = Replies()
    op = Probe(broker, "operator", "operator-pw")
    op.client.on_message = replies.on_message
    op.client.max_inflight_messages_set(100)
    assert op.connect() == 0
    op.subscribe(T1.reply_filter)
    d = DaemonProc(tmp_path, broker, extra=("mqtt.telemetry_hz=1",)).start()
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        # the background start-up work (the model load, calibration) grows RSS by itself
        wait_until(lambda: {"estimators", "calibration"} <= set(
            d.socket_cmd("status")["result"]["background"]), 60, "background start-up done")
        # MQTT starts on its own thread after READY: nothing is sent before it subscribed
        wait_until(lambda: d.socket_cmd("status")["result"]["mqtt_connected"], 30, "mqtt up")
        pid = d.proc.pid  # type: ignore[union-attr]
        t0 = time.monotonic()
        _send(op, replies, warm, "dev1")
        assert replies.wait_below(1, 60), sorted(replies.pending)[:10]
        before = proc_figures(pid)
        marks = []
        for part in range(4):
            quarter = rest[part * len(rest) // 4:(part + 1) * len(rest) // 4]
            _send(op, replies, quarter, "dev1")
            marks.append(proc_figures(pid))
        assert replies.wait_below(1, 120), (
            f"{len(replies.pending)} messages never answered, e.g. "
            f"{[m for m in msgs if m.id in replies.pending][:5]}")
        elapsed = time.monotonic() - t0
        after = proc_figures(pid)
        assert not d.exited(), "\n".join(d.lines[-40:])
        final = d.socket_cmd("status")
        assert final["ok"], final
    finally:
        op.close()
        d.stop()

    expected = {m.id for m in msgs if m.expects_reply}
    answered = set(replies.by_id) & expected
    unexpected = {k: v for k, v in replies.by_id.items() if k not in expected}
    codes = collections.Counter(
        r["error"]["code"] if not r["ok"] else "ok" for rs in replies.by_id.values() for r in rs)
    print(f"\nfuzz: {N} messages (seed {SEED}) in {elapsed:.1f} s ({N / elapsed:.0f}/s); "
          f"{len(expected)} promised a reply, {len(answered)} answered, {len(unexpected)} "
          f"answered beyond the promise; replies by code: "
          f"{dict(codes.most_common())}")
    print(f"fuzz: daemon before {before} after quarters {marks} end {after}; RSS growth "
          f"{after['VmRSS'] - before['VmRSS']} kB")
    assert answered == expected
    assert all(len(rs) == 1 for k, rs in replies.by_id.items() if k in expected), \
        [(k, rs) for k, rs in replies.by_id.items() if len(rs) > 1][:3]
    # Beyond the promise: an unknown command name is answered whenever an id can be fished out
    # of the raw text (even from a JSON array). Allowed, but only as an error, once.
    sent = {m.id: m for m in msgs}
    for rid, rs in unexpected.items():
        assert rid in sent and len(rs) == 1 and rs[0]["ok"] is False, (rid, rs)
        assert rid.encode() in sent[rid].payload
    assert replies.unparsable == 0
    assert set(codes) - {"ok"} <= {c.value for c in ErrorCode}
    assert codes["internal"] == 0, [rs for rs in replies.by_id.values()
                                    if not rs[0]["ok"] and rs[0]["error"]["code"] == "internal"]
    assert codes["ok"] > 0 and codes["bad_args"] > 0 and codes["bad_json"] > 0
    assert after["VmRSS"] - before["VmRSS"] < RSS_GROWTH_LIMIT_KB
    assert after["Threads"] <= before["Threads"] + 4
    assert after["fds"] <= before["fds"] + 8
