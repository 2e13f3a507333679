"""Issue #15 item 7: a tap of the simulated robot's e-stop shorter than a firmware tick is a press.

The rig latches the button's press edge until its next tick samples it (as an interrupt or a
safety relay would), so each tap reaches the guardian as an ESTOP_EDGE, the guardian writes its
STOP, and the daemon latches — on the real daemon + guardian + rig over a pty, with the rig's
own e-stop hold switched off (only the host side stops the robot).

Without the latched edge this fails in most runs, not all: a rig running late catches up on the
ticks it owes after a tap arrived, and those see it. tests/test_rig_estop_taps.py puts the taps
between two ticks in virtual time, where a sampled-only button never sees them.
"""

from __future__ import annotations

from pathlib import Path

from daemon_proc import DaemonProc
from mosquitto import wait_until

TAP_S = 0.0001  # a tenth of a firmware tick (1 ms): pressed and released between two ticks


def _presses(d: DaemonProc) -> int:
    return sum(1 for e in d.events("event")
               if e.get("type") == "estop_input" and e.get("pressed") is True)


def _input_stops_since(d: DaemonProc, t: float) -> int:
    rec = d.rig({"cmd": "record", "type": "STOP", "since": t})
    assert rec["ok"], rec
    return sum(1 for f in rec["frames"] if "ESTOP_INPUT" in str(f))


def test_three_short_taps_are_three_presses_and_stops(tmp_path: Path) -> None:
    d = DaemonProc(tmp_path, None).start()
    try:
        d.wait_ready()
        wait_until(lambda: d.socket_cmd("status")["result"]["link_up"], 30, "link up")
        assert d.rig({"cmd": "set", "key": "firmware_estop_hold", "value": False})["ok"]
        t0 = float(d.rig({"cmd": "status"})["t"])
        edges0 = d.rig({"cmd": "status"})["state"]["counters"]["estop_edges"]
        for n in range(1, 4):
            stops = _input_stops_since(d, t0)
            tap = d.rig({"cmd": "inject", "target": "estop", "mode": "press",
                         "duration_s": TAP_S})
            assert tap["ok"], tap
            wait_until(lambda n=n: _presses(d) >= n, 30, f"tap {n} seen by the daemon")  # type: ignore[misc]
            wait_until(lambda s=stops: _input_stops_since(d, t0) > s, 30,  # type: ignore[misc]
                       f"a STOP for tap {n} at the robot")
            st = d.socket_cmd("status")["result"]
            assert st["mode"] == "estop" and "estop_input" in st["stop"]["causes"], st["stop"]
        # (the daemon may hear a press twice: a G_STATE sent before a release can arrive after
        # it; the robot's own edge count is exact)
        assert _presses(d) >= 3
        state = d.rig({"cmd": "status"})["state"]
        assert state["counters"]["estop_edges"] - edges0 == 6  # 3 presses, 3 releases
        assert state["estop_input"] is False  # every tap released again
    finally:
        d.stop()
