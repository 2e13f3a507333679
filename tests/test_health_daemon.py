"""Issue #18 on the real daemon (`--sim`, a private Mosquitto): the broker stopped → `broker_lost`
within 3 probe periods (status and `state.degraded` over the local socket while it is down), a
`degraded` event; the broker back → `recovered`; a repair report for each on disk; `status.health`
lists every probe with its level, figures, strikes and next run."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from conftest import MQTT_USERS
from daemon_proc import DaemonProc
from mosquitto import Mosquitto, Probe, wait_until
from test_asyncapi import validator

PERIOD_S = 0.2


def _status(d: DaemonProc) -> dict[str, Any]:
    r = d.socket_cmd("status")
    assert r["ok"], r
    return r["result"]  # type: ignore[no-any-return]


def _events(d: DaemonProc, kind: str) -> list[dict[str, Any]]:
    return [e for e in d.events("event") if e.get("type") == kind]


def _reports(state_dir: Path) -> list[dict[str, Any]]:
    out = []
    for f in sorted((state_dir / "reports").glob("*.json")):
        try:
            out.append(json.loads(f.read_text(encoding="utf-8")))
        except ValueError:
            continue  # being written (it is atomic: cannot happen, but never fail on it)
    return out


def test_broker_lost_is_entered_and_left_with_events_state_and_reports(
        tmp_path: Path, broker: Mosquitto) -> None:
    d = DaemonProc(tmp_path, broker, extra=(f"health.period_s={PERIOD_S}",)).start()
    try:
        d.wait_ready()
        wait_until(lambda: _status(d)["mqtt_connected"], 30, "MQTT connected")
        wait_until(lambda: (_status(d)["health"] or {}).get("probes", {}).get("broker", {})
                   .get("level") == "ok", 30, "the broker probe ok")
        st = _status(d)
        h = st["health"]
        assert st["degraded"] == [] and h["degraded"] == [] and h["running"]
        assert {"broker", "link", "loop", "store", "startup"} <= set(h["probes"])
        for name in ("broker", "link", "loop", "store"):
            p = h["probes"][name]
            assert p["period_s"] == PERIOD_S and p["strikes"] == 0, (name, p)
            assert p["next_run_in_s"] is not None and p["next_run_in_s"] <= PERIOD_S + 0.05
        assert h["probes"]["broker"]["mode"] == "broker_lost"
        assert h["probes"]["link"]["figures"]["guardian_alive"] is True

        broker.stop()
        t_down = time.monotonic()
        wait_until(lambda: "broker_lost" in _status(d)["degraded"], 30, "broker_lost entered")
        seen_after = time.monotonic() - t_down
        # in the daemon's own time: the disconnect event to the degraded event (log stamps)
        disc = _events(d, "mqtt_disconnected")[-1]
        deg = _events(d, "degraded")[-1]
        assert deg["mode"] == "broker_lost" and deg["probe"] == "broker" and deg["cause"]
        lag = _log_time(deg) - _log_time(disc)
        assert lag <= 3 * PERIOD_S + 0.1, (lag, seen_after)
        st = _status(d)  # over the local socket while MQTT is down: commands still work
        b = st["health"]["probes"]["broker"]
        assert b["level"] == "error" and b["strikes"] >= 3 and b["holding"], b
        assert b["figures"]["connected"] is False and st["health"]["active"] == [
            {"mode": "broker_lost", "subject": ""}]

        broker.start()
        # subscribed before the daemon is back (its reconnect backoff, then 3 good runs)
        watcher = Probe(broker, "operator", MQTT_USERS["operator"])
        watcher.connect()
        watcher.subscribe(f"edge/{d.device}/event")
        try:
            msg = watcher.expect(lambda m: json.loads(m.payload).get("type") == "recovered", 30)
        finally:
            watcher.close()
        ev = json.loads(msg.payload)
        validator("#/components/schemas/EventPayload").validate(ev)  # as documented
        assert ev["mode"] == "broker_lost" and ev["probe"] == "broker" and ev["subject"] == ""
        wait_until(lambda: _status(d)["degraded"] == [], 30, "broker_lost left")
        rec = _events(d, "recovered")[-1]
        assert rec["mode"] == "broker_lost" and rec["probe"] == "broker"
        assert _status(d)["health"]["probes"]["broker"]["strikes"] == 0

        def both() -> bool:
            kinds = {(r["kind"], r["details"].get("mode")) for r in _reports(d.state_dir)}
            return {("mode_entered", "broker_lost"), ("mode_left", "broker_lost")} <= kinds

        wait_until(both, 30, "a repair report for entering and one for leaving broker_lost")
        entered = next(r for r in _reports(d.state_dir) if r["kind"] == "mode_entered")
        assert "left after 3 good probes of broker" in entered["recovery"]
        assert "next probe at" in entered["recovery"] and "UTC" in entered["recovery"]
        assert any("local control socket" in m for m in entered["measures"])
        assert entered["title"].startswith("Degraded: broker_lost")
    finally:
        d.stop()


def _log_time(rec: dict[str, Any]) -> float:
    """A JSON log line's wall time (seconds)."""
    ts = rec.get("ts")
    if isinstance(ts, int | float):
        return float(ts)
    import datetime as dt

    return dt.datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
