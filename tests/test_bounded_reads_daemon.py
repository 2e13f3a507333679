"""No peer makes a real daemon allocate without bound (issue 27 item 1).

A webhook answering 200 with a 400 MB body, and a 150 MB publish on a command topic through a
broker without a size limit: the daemon's peak RSS (VmHWM) stays under 200 MB, it still answers
`status`, and what it owed is not lost (the report is on disk and on MQTT; an oversized command is
refused). The peers are real: an HTTP server thread streaming the body lazily, a private
Mosquitto with no `max_packet_size`/`message_size_limit`, a raw-socket MQTT publisher.
Measured (see the commit messages for the before/after figures): the daemon's VmHWM.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from daemon_proc import DaemonProc
from hostile_peers import FloodHTTP, FloodUnix, peak_rss_mb, publish_raw
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.comms.mqtt_common import Topics

T1 = Topics("edge/dev1")  # its command and reply topics

RSS_CAP_MB = 200.0
TOKEN = "wecomkey-bounded-0001"


def _pid(d: DaemonProc) -> int:
    assert d.proc is not None
    return d.proc.pid


def test_a_webhook_streaming_400_mb_fails_the_delivery_with_a_reason(
        tmp_path: Path, broker: Mosquitto) -> None:
    flood = FloodHTTP(400 * 1024 * 1024)
    operator = Probe(broker, "operator", "operator-pw")
    operator.connect()
    operator.subscribe("edge/dev1/report")
    d = DaemonProc(tmp_path, broker, extra=(
        f'reports.webhook_url="{flood.url(TOKEN)}"', "reports.retry_min_s=60",
        "reports.retry_max_s=60", "health.period_s=3600")).start()
    try:
        d.wait_ready()
        before = peak_rss_mb(_pid(d))
        assert d.socket_cmd("estop")["ok"]

        def failed() -> bool:
            st = d.socket_cmd("status")["result"]["reports"]
            return st["failed_attempts"].get("webhook", 0) >= 1

        wait_until(failed, 60, "the webhook delivery to fail")
        st = d.socket_cmd("status")["result"]
        peak = peak_rss_mb(_pid(d))
        print(f"webhook flood: daemon VmHWM {before:.0f} MB before, {peak:.0f} MB after; "
              f"server sent {[round(s / 2**20, 1) for s in flood.sent]} MiB")
        reason = st["reports"]["last_error"]["webhook"]
        assert "answer over 4096 bytes" in reason, reason
        assert TOKEN not in json.dumps(st)
        assert peak < RSS_CAP_MB
        # the connection was closed unread: the server got nowhere near the whole body out
        assert flood.sent and max(flood.sent) < 64 * 2**20, flood.sent
        # nothing lost: the report is on disk and on MQTT
        on_disk = [json.loads(p.read_text()) for p in (d.state_dir / "reports").glob("*.json")]
        assert [r["kind"] for r in on_disk] == ["estop"]
        msg = operator.expect("edge/dev1/report", timeout=30)
        assert json.loads(msg.payload)["id"] == on_disk[0]["id"]
    finally:
        d.stop()
        flood.stop()
        operator.close()


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_a_150_mb_command_publish_is_refused_and_status_still_answers(
        tmp_path: Path, broker: Mosquitto, protocol: str) -> None:
    operator = Probe(broker, "operator", "operator-pw")
    operator.connect()
    operator.subscribe(T1.reply_filter)
    # keepalive 30 s (DaemonProc's 2 s is for tests of a lost broker): a broker busy taking
    # in 150 MB on a loaded machine may answer a PINGREQ late, and the daemon would reconnect
    # meanwhile (clean session: the publish then never reaches it either way)
    d = DaemonProc(tmp_path, broker, extra=(f'mqtt.protocol="{protocol}"', "mqtt.keepalive_s=30",
                                            "health.period_s=3600")).start()
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["mqtt_connected"], 30,
                   "the daemon on MQTT")
        before = peak_rss_mb(_pid(d))
        head = b'{"v":1,"id":"huge-1","pad":"'
        publish_raw(broker.host, broker.port, "operator", "operator-pw", T1.cmd("status"),
                    head, 150 * 1024 * 1024)
        if protocol == "3.1.1":  # the broker cannot be told: the daemon drops the connection
            try:
                wait_until(lambda: bool(d.events("mqtt_packet_too_large")), 90, "the refusal")
            except AssertionError:
                print("BROKER LOG\n", broker.log()[-3000:])
                print("DAEMON\n", "\n".join(ln for ln in d.lines if "mqtt" in ln)[-3000:])
                raise
            wait_until(lambda: len(d.events("mqtt_connected")) >= 2
                       and d.socket_cmd("status")["result"]["mqtt_connected"], 90, "reconnected")
            assert d.events("mqtt_packet_too_large")[0]["bytes"] > 150 * 2**20
        # a command just over the daemon's payload limit still gets its `too_large` reply
        publish_raw(broker.host, broker.port, "operator", "operator-pw", T1.cmd("status"),
                    b'{"v":1,"id":"big-2","pad":"', 100 * 1024)
        wait_until(lambda: _reply(operator, "big-2") is not None, 60, "too_large for big-2")
        # and the daemon still answers over MQTT
        operator.publish(T1.cmd("status"), json.dumps({"v": 1, "id": "after-3"}), qos=1)
        wait_until(lambda: _reply(operator, "after-3") is not None, 60, "status after")
        peak = peak_rss_mb(_pid(d))
        print(f"150 MB command over MQTT {protocol}: daemon VmHWM {before:.0f} MB before, "
              f"{peak:.0f} MB after")
        assert peak < RSS_CAP_MB
        assert _REPLIES["big-2"]["error"]["code"] == "too_large"
        assert _REPLIES["after-3"]["ok"]
        assert "huge-1" not in _REPLIES  # refused by the broker (5) or by the daemon (3.1.1)
        if protocol == "5":  # the broker kept it: the daemon neither saw it nor reconnected
            assert not d.events("mqtt_packet_too_large")
            assert len(d.events("mqtt_connected")) == 1
        assert d.socket_cmd("status")["ok"]
    finally:
        d.stop()
        operator.close()
        _REPLIES.clear()


_REPLIES: dict[str, dict[str, object]] = {}


def _reply(probe: Probe, cid: str) -> dict[str, object] | None:
    while not probe.messages.empty():
        p = json.loads(probe.messages.get_nowait().payload)
        _REPLIES[str(p.get("id"))] = p
    return _REPLIES.get(cid)


def test_a_rig_socket_streaming_a_300_mb_line_is_an_error_reply(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, None, extra=("health.period_s=3600",)).start()
    flood = None
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 60, "link up")
        before = peak_rss_mb(_pid(d))
        # whatever is bound at the rig's path now answers (the rig keeps its pty and socket)
        (d.state_dir / "rig.sock").unlink()
        flood = FloodUnix(d.state_dir / "rig.sock", 300 * 1024 * 1024)
        reply = d.socket_cmd("failure.inject", {"target": "gripper", "mode": "weak_close"})
        peak = peak_rss_mb(_pid(d))
        print(f"rig socket flood: daemon VmHWM {before:.0f} MB before, {peak:.0f} MB after; "
              f"the peer sent {[round(s / 2**20, 1) for s in flood.sent]} MiB")
        assert not reply["ok"]
        assert "reply over 1048576 bytes" in reply["error"]["message"], reply
        assert peak < RSS_CAP_MB
        assert d.socket_cmd("status")["ok"]
    finally:
        d.stop()
        if flood is not None:
            flood.stop()


def test_a_300_mb_line_on_the_control_socket_is_too_large(tmp_path: Path) -> None:
    import socket

    d = DaemonProc(tmp_path, None, extra=("health.period_s=3600",)).start()
    try:
        d.wait_ready()
        before = peak_rss_mb(_pid(d))
        sent = 0
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(d.state_dir / "control.sock"))
            piece = b'{"cmd": "status", "v": 1, "pad": "' + b"x" * (1 << 20)
            try:
                while sent < 300 * 2**20:
                    s.sendall(piece)
                    sent += len(piece)
            except OSError:  # the daemon answered and closed: the rest is never read
                pass
            reply = json.loads(s.makefile("rb").readline(65536))
        peak = peak_rss_mb(_pid(d))
        print(f"control socket flood: daemon VmHWM {before:.0f} MB before, {peak:.0f} MB "
              f"after; {sent / 2**20:.0f} MiB sent")
        assert reply["error"]["code"] == "too_large", reply
        assert sent < 64 * 2**20 and peak < RSS_CAP_MB
        assert d.socket_cmd("status")["ok"]
    finally:
        d.stop()
