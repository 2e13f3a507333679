"""The stop model and the admission matrix on the whole daemon core (hil/daemon_lockstep.py).

A Hypothesis state machine drives a real Daemon — command API, executor, latch, link mirror,
snapshot store, kill -9 restarts on the same state dir — against the simulated firmware with
its own e-stop hold switched OFF (`estop_hold=False`: only the host side keeps the robot still).
The assertions are on the frames the daemon hands the guardian, and separately on what reaches
the firmware, against DESIGN.md:

- no motion frame (a moving COMMAND or ENABLE(1)) while the daemon's latch is latched;
- after any latch change or reset, none until a new command permits motion (start, resume,
  manual.enter/jog), and none from a new boot before such a command;
- nothing clears the hardware e-stop while it is pressed (reset refused, latch and guardian
  stay latched, no motion reaches the firmware);
- a restart after kill -9 comes up stopped, and a task cannot be resumed after it;
- a sensor lost past its bound latches `sensor_bound`: no reset while it is lost, no motion when
  it returns;
- a daemon stalled past the deadman while it moved the robot (SIGSTOP, virtual time) wakes up
  in a latched protective stop `deadman`, in the guardian too, and no motion reaches the
  firmware from the trip until reset + a new command; stalled while holding, it only holds;
- every reply agrees with DESIGN.md's admission matrix (typed in again below, not imported).

More examples: EDGE_STOP_MODEL_EXAMPLES=500 pytest tests/test_stop_model_daemon.py
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from edge_agent.link.codec import Command, GAt, Stop
from hil.daemon_lockstep import DaemonLockstep, motion

# DESIGN.md "Commands and admission", the cells that refuse (and the code where it is fixed).
# Mode columns: idle running holding diagnostic manual protective_stop estop.
ALL = {"idle", "running", "holding", "diagnostic", "manual", "protective_stop", "estop"}
REFUSED: dict[str, dict[str, str | None]] = {
    "task.start": {"running": "busy", "diagnostic": None, "manual": None,
                   "protective_stop": None, "estop": "estop_active"},
    "task.cancel": {"manual": None},
    "resume": {m: None for m in ALL - {"holding"}} | {"running": "busy",
                                                      "estop": "estop_active"},
    "reset": {"manual": None},
    **{v: {"running": "busy", "protective_stop": None, "estop": "estop_active"}
       for v in ("manual.enter", "manual.jog", "manual.exit")},
}
ALWAYS_OK = {  # ✓ with no condition attached
    "task.cancel": ALL - {"manual"},
    "reset": {"idle", "running", "holding", "diagnostic"},
    "estop": ALL,
    "status": ALL,
}
PERMITS_MOTION = ("task.start", "resume", "manual.enter", "manual.jog")
GRACE_S = 0.004  # a press reaches the daemon with the next STATUS (1 ms) plus the link's latency
RESET_INTERVAL_S = 1.0  # executor.reset_min_interval_s (sim default): one reset a second
SETTLE_MS = 20  # after a release, before the reset: the release reaches the daemon (GRACE_S)
EXAMPLES = int(os.environ.get("EDGE_STOP_MODEL_EXAMPLES", "25"))
# Firmware time a channel may be missing before sensor_bound (configs/robot/edge-arm-4.toml: a
# `stop` channel three of its 1 kHz periods, a predicted one its predict_max_s).
LOSS_BOUND_S = {"joint_currents": 0.003, "gripper_position": 0.003, "joint_encoders": 0.01,
                "wrist_force": 0.5}


class DaemonStopModel(RuleBasedStateMachine):
    OVERRIDES: tuple[str, ...] = ()  # config overrides of the daemon under test

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="edge-stop-model-"))
        self.h = DaemonLockstep(self.tmp / "state", seed=5, estop_hold=False,
                                overrides=self.OVERRIDES)
        self.h.boot()
        self.h.run_for(0.05)
        self.checked = 0  # frames in h.handed already checked
        self.tty_checked = 0
        self.permit: tuple[int, int] | None = None  # (boot, latch generation) that permits motion
        self.pressed_at: float | None = None
        self.unclean_boot = False  # since the last kill -9 restart no task was started
        self.last_task: str | None = None
        self.last_reset_at: float | None = None  # this boot's latest reset, on the daemon's clock
        self.no_tty_motion_since: float | None = None  # a deadman trip: until a new command
        self.deadman_s = self.h.cfg.link.deadman_ms / 1000.0

    def teardown(self) -> None:
        self.h.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    # -- helpers -----------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self.h.runner.now

    def _press_known(self) -> bool:
        """Pressed long enough for the daemon to have seen it (a reset before that finds
        nothing latched yet: a no-op, which clears nothing)."""
        return self.pressed_at is not None and self.now >= self.pressed_at + GRACE_S

    def _command(self, name: str, args: dict[str, object] | None = None) -> bool:
        d = self.h.daemon
        mode = d.mode()
        if name == "reset":
            self.last_reset_at = self.h.clock.now()
        reply = self.h.command(name, args).to_dict()
        code = None if reply["ok"] else reply["error"]["code"]
        event(f"{name} in {mode}: {code or 'ok'}")  # --hypothesis-show-statistics
        if code == "refused" and name == "task.start":
            event(f"task.start refused: {reply['error']['message'][:60]}")
        refused = REFUSED.get(name, {})
        if mode in refused:
            assert not reply["ok"], (name, mode, reply)
            want = refused[mode]
            assert want is None or code == want, (name, mode, reply)
        if mode in ALWAYS_OK.get(name, ()):
            assert reply["ok"], (name, mode, reply)
        if self._press_known() and name == "reset":
            assert not reply["ok"], ("a reset cleared the e-stop while it was pressed", reply)
        if reply["ok"] and name in PERMITS_MOTION:
            self.no_tty_motion_since = None
            st_ = d.latch.state
            assert not st_.latched, (name, mode, st_)
            self.permit = (self.h.boots - 1, st_.generation)
        if reply["ok"] and name == "task.start":
            self.last_task = reply["result"]["task_id"]
            self.unclean_boot = False
        if name == "resume" and self.unclean_boot:
            assert not reply["ok"], ("resumed a task after an unclean restart", reply)
        if name == "estop":
            assert d.latch.latched and d.mode() == "estop", d.mode()
        if reply["ok"] and name == "task.cancel" and mode == "estop":
            assert d.executor.saved_task is None
        self._check_frames()
        return bool(reply["ok"])

    def _check_frames(self) -> None:
        handed = self.h.handed
        for f in handed[self.checked:]:
            if not motion(f.msg):
                continue
            assert not f.latched, f"motion handed to the guardian while latched: {f}"
            assert self.permit == (f.boot, f.generation), (
                f"motion without a command since the last latch change/reset/boot: {f}; "
                f"permit {self.permit}")
        self.checked = len(handed)
        g = self.h.host.guardian
        if g is not None:
            for t, m in g.to_tty[self.tty_checked:]:
                if motion(m) and self.pressed_at is not None:
                    assert t < self.pressed_at + GRACE_S, (
                        f"motion reached the firmware {t - self.pressed_at:.4f} s into a press")
                if motion(m) and self.no_tty_motion_since is not None:
                    assert t < self.no_tty_motion_since, (
                        f"motion reached the firmware after a deadman trip: {m}")
            self.tty_checked = len(g.to_tty)

    # -- rules -------------------------------------------------------------------------------
    @rule(ms=st.integers(1, 400))
    def run(self, ms: int) -> None:
        self.h.run_for(ms / 1000)
        self._check_frames()

    @rule()
    def task_start(self) -> None:
        self._command("task.start")

    @rule()
    def task_cancel(self) -> None:
        self._command("task.cancel")

    @rule(own=st.booleans())
    def resume(self, own: bool) -> None:
        self._command("resume", {"task_id": (self.last_task or "none") if own else "other"})

    @rule()
    def reset(self) -> None:
        self._command("reset")

    @rule()
    def manual_enter(self) -> None:
        self._command("manual.enter")

    @rule(v=st.floats(-0.3, 0.3), ttl=st.integers(20, 200), ms=st.integers(0, 100))
    def jog(self, v: float, ttl: int, ms: int) -> None:
        self._command("manual.jog", {"dq": [v, 0.0, 0.0, 0.0], "ttl_ms": ttl})
        self.run(max(1, ms))

    @rule()
    def manual_exit(self) -> None:
        self._command("manual.exit")

    @rule()
    def estop(self) -> None:
        self._command("estop")

    @rule()
    def status(self) -> None:
        self._command("status")

    @rule(ms=st.integers(0, 50))
    def press(self, ms: int) -> None:
        if not self.h.pressed:
            self.h.press()
            self.pressed_at = self.now
        self.run(max(1, ms))

    @rule(ms=st.integers(0, 50))
    def release(self, ms: int) -> None:
        if self.h.pressed:
            self.h.release()
            self.pressed_at = None
        self.run(max(1, ms))

    @rule(ms=st.integers(0, 3000))
    def recover(self, ms: int) -> None:
        """The operator's way back: release, wait out the reset rate limit, reset, resume (or
        start) — then let it run. Gets the deep states (holding, resume) often enough."""
        self.release(1)
        # what is left of the rate limit since this boot's last reset (0.1 s to spare), not a
        # whole second each time: a third of this test's run time went there (py-spy)
        left = (0.0 if self.last_reset_at is None else
                self.last_reset_at + RESET_INTERVAL_S + 0.1 - self.h.clock.now())
        self.run(max(SETTLE_MS, round(left * 1000)))
        self._command("reset")
        if not self._command("resume", {"task_id": self.last_task or "none"}):
            self._command("task.start")
        self.run(max(1, ms))

    @rule(ms=st.integers(0, 400))
    def stall(self, ms: int) -> None:
        """The daemon stops (SIGSTOP: a swap storm, a debugger) for `ms`, then continues."""
        cmds = [f.msg.cmd if isinstance(f.msg, GAt) else f.msg for f in self.h.handed
                if isinstance(f.msg, Command | GAt)]
        d = self.h.daemon
        moving = bool(cmds) and cmds[-1].moves and not d.latch.latched
        # a task or a jog may hold for a moment and move again; a controlled hold keeps the
        # gripper's force (a moving command): only an idle hold stream is sure to only hold
        idle = d.mode() not in ("running", "manual") and not (cmds and cmds[-1].moves)
        g = self.h.host.guardian
        was_deadman = "deadman" in self.h.daemon.latch.state.causes
        start = self.now
        self.h.stall(ms / 1000)
        past = ms / 1000 > self.deadman_s + 0.006  # its last frame may come a period late
        if moving and past:
            self.no_tty_motion_since = start + self.deadman_s + 0.006
        self.run(5)
        d = self.h.daemon
        event(f"stall {'past' if past else 'inside'} the deadman, "
              f"{'moving' if moving else 'holding'}")
        if moving and past:
            assert "deadman" in d.latch.state.causes, d.latch.state
            assert d.mode() == "protective_stop", d.mode()
            assert g is not None and g.rules.latched
        elif not past and not was_deadman and ms / 1000 < self.deadman_s - 0.006:
            assert "deadman" not in d.latch.state.causes, (ms, d.latch.state)
        if idle and not was_deadman:
            assert "deadman" not in d.latch.state.causes, ("a stall while idle", ms)

    @rule(ms=st.integers(20, 400))
    def unplug(self, ms: int) -> None:
        """A link fault (protective stop) for `ms`, then the link is back."""
        self.h.runner.inject("link", "unplug", duration_s=ms / 1000)
        self.run(ms + 50)

    @rule(channel=st.sampled_from(sorted(LOSS_BOUND_S)), ms=st.integers(1, 800))
    def sensor_dropout(self, channel: str, ms: int) -> None:
        """A sensor lost for `ms` (the rig's dropout, in virtual time). Past its bound: a latched
        protective stop `sensor_bound`, a reset refused while the channel is lost, and still
        latched after it is back (the task does not continue by itself)."""
        self.h.runner.inject(f"sensor:{channel}", "dropout", duration_s=ms / 1000)
        self.run(max(1, ms - 2))
        past = ms / 1000 > LOSS_BOUND_S[channel] + 0.01
        event(f"sensor dropout {channel}: {'past' if past else 'within'} its bound")
        if not past:
            self.run(5)
            return
        st_ = self.h.daemon.latch.state
        assert "sensor_bound" in [c.value for c in st_.causes], (channel, ms, st_)
        self._command("reset")
        assert self.h.daemon.latch.latched, "a reset cleared sensor_bound while the sensor was lost"
        self.run(10)
        assert self.h.daemon.latch.latched, "sensor_bound cleared itself when the sensor came back"

    @rule(down_ms=st.integers(0, 300))
    def kill9_and_restart(self, down_ms: int) -> None:
        self.h.kill9()
        self.h.run_for(down_ms / 1000 + 1e-3)
        d = self.h.boot()
        self.permit = None
        self.last_reset_at = None  # a new process: no reset yet to rate-limit the next one
        self.unclean_boot = True
        assert d.latch.latched, "a restart after kill -9 came up without a latch"
        assert d.mode() in ("protective_stop", "estop"), d.mode()
        self.run(20)
        assert d.latch.latched

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def a_pressed_estop_is_latched_everywhere(self) -> None:
        if not self._press_known():
            return
        d, g = self.h.daemon, self.h.host.guardian
        st_ = d.latch.state
        assert st_.latched and st_.kind is not None and st_.kind.value == "estop", st_
        assert d.mode() == "estop", d.mode()
        assert g is not None and g.rules.latched, "the guardian's latch is clear while pressed"

    @invariant()
    def the_mode_follows_the_latch(self) -> None:
        d = self.h.daemon
        kind = d.latch.state.kind
        if kind is not None:
            assert d.mode() == kind.value, (d.mode(), kind)


TestDaemonStopModel = DaemonStopModel.TestCase
TestDaemonStopModel.settings = settings(max_examples=EXAMPLES, stateful_step_count=30,
                                        deadline=None)


class DaemonStopModelAhead(DaemonStopModel):
    """The same rules with each command sent one tick after it was computed."""

    OVERRIDES = ("control.output_at_deadline=true",)


TestDaemonStopModelAhead = DaemonStopModelAhead.TestCase
TestDaemonStopModelAhead.settings = settings(max_examples=EXAMPLES, stateful_step_count=30,
                                             deadline=None)


@pytest.mark.parametrize("ahead", [False, True], ids=["immediate", "output_at_deadline"])
def test_the_lockstep_daemon_finishes_a_task_and_stops_on_a_press(tmp_path: Path,
                                                                   ahead: bool) -> None:
    """The harness itself: a task runs to success; a press mid-task freezes it, reset is refused
    until release, resume finishes it; kill -9 comes back latched with no resume. With
    `control.output_at_deadline` the same: the frames go out from the guardian's rules at
    their deadlines, and the one computed before the press is dropped, not sent after it."""
    h = DaemonLockstep(tmp_path / "state", seed=3, estop_hold=False,
                       overrides=("control.output_at_deadline=true",) if ahead else ())
    h.boot()
    h.run_for(0.2)
    upd = h.command("model.update", {"uri": str(tmp_path), "sha256": "0" * 64}).to_dict()
    assert upd["error"]["code"] == "refused" and "no model is configured" in \
        upd["error"]["message"], upd
    sh = h.command("model.shadow", {"uri": str(tmp_path), "sha256": "0" * 64}).to_dict()
    assert sh["error"]["code"] == "refused" and "model.shadow refused: no model is configured" \
        in sh["error"]["message"], sh
    start = h.command("task.start")
    assert start.ok
    task, place = start.result["task_id"], start.result["place"]
    h.run_for(1.0)
    assert h.daemon.mode() == "running"
    g = h.host.guardian
    assert g is not None
    released = g.rules.counters["timed_released"]
    assert g.rules.counters["timed_dropped"] == 0
    assert released > 0 if ahead else released == 0
    h.press()
    pressed_at = h.clock.now()
    h.run_for(0.01)
    assert h.daemon.mode() == "estop"
    # the frame the daemon computed before the press waited at the guardian: dropped, not sent
    assert g.rules.counters["timed_dropped"] == (1 if ahead else 0)
    stop_at = next(t for t, m in g.to_tty if t >= pressed_at and isinstance(m, Stop))
    assert not any(motion(m) for t, m in g.to_tty if t >= stop_at)
    n = len(h.handed)
    h.run_for(0.5)
    assert not any(motion(f.msg) for f in h.handed[n:])
    r = h.command("reset")
    assert not r.ok and r.to_dict()["error"]["code"] == "estop_active"
    h.release()
    h.run_for(1.1)  # resets are rate-limited to one a second
    assert h.command("reset").ok and h.daemon.mode() == "holding"
    n = len(h.handed)
    h.run_for(0.5)
    assert not any(motion(f.msg) for f in h.handed[n:]), "a reset moved the robot"
    assert h.daemon.executor.saved_task is not None
    assert h.command("resume", {"task_id": task}).ok
    # until the task ends (it used to run 20 s of virtual time whatever the task did)
    h.runner.run_until_true(lambda: h.outcome(task) is not None, 20.0, poll_s=0.1)
    assert h.outcome(task) == "success", [e for e in h.events if e.get("task_id") == task]
    obj = h.runner.state()["object"]
    assert abs(obj["xyz"][0] - place[0]) < 0.01 and abs(obj["xyz"][1] - place[1]) < 0.01, obj
    assert obj["drops"] == 0
    h.kill9()
    h.run_for(0.1)
    d = h.boot()
    assert d.latch.latched and d.mode() == "protective_stop"
    h.close()
