"""The degradation-mode rules (edge_agent/health/modes.py) on a fake clock: N failures enter a
mode, M successes leave it, STALE counts as neither, modes combine and subjects are separate."""

from __future__ import annotations

import pytest

from edge_agent.health.modes import ModeRules
from edge_agent.health.probe import Level, ProbeResult
from edge_agent.vocab import DegradationMode as DM

ERR = ProbeResult.error("down", rtt_ms=None)
OK = ProbeResult.ok("up")
WARN = ProbeResult.warn("slow")
STALE = ProbeResult(Level.STALE, "no answer")


def test_three_failures_enter_and_three_successes_leave() -> None:
    r = ModeRules(fail_after=3, recover_after=3)
    t = 0.0
    assert r.observe("broker", DM.BROKER_LOST, "", ERR, t) is None
    assert r.observe("broker", DM.BROKER_LOST, "", ERR, t + 1) is None
    assert r.modes() == []
    entered = r.observe("broker", DM.BROKER_LOST, "", ERR, t + 2)
    assert entered is not None and entered.entered and entered.mode is DM.BROKER_LOST
    assert (entered.probe, entered.cause, entered.at) == ("broker", "down", 2.0)
    assert r.modes() == ["broker_lost"]
    assert r.counts("broker").failures == 3
    # more failures while held: no second transition
    assert r.observe("broker", DM.BROKER_LOST, "", ERR, t + 3) is None
    assert r.observe("broker", DM.BROKER_LOST, "", OK, t + 4) is None
    assert r.observe("broker", DM.BROKER_LOST, "", WARN, t + 5) is None  # WARN counts as good
    left = r.observe("broker", DM.BROKER_LOST, "", OK, t + 6)
    assert left is not None and not left.entered and left.mode is DM.BROKER_LOST
    assert r.modes() == [] and r.active() == []


def test_a_good_run_resets_the_strikes_and_a_failure_resets_the_good_runs() -> None:
    r = ModeRules(fail_after=3, recover_after=2)
    for now, res in enumerate((ERR, ERR, OK, ERR, ERR)):
        assert r.observe("gpu", DM.CPU_INFERENCE, "", res, float(now)) is None
    assert r.counts("gpu").failures == 2
    assert r.observe("gpu", DM.CPU_INFERENCE, "", ERR, 5.0) is not None  # the 3rd in a row
    assert r.observe("gpu", DM.CPU_INFERENCE, "", OK, 6.0) is None
    assert r.observe("gpu", DM.CPU_INFERENCE, "", ERR, 7.0) is None  # back to 0 good runs
    assert r.observe("gpu", DM.CPU_INFERENCE, "", OK, 8.0) is None
    assert r.observe("gpu", DM.CPU_INFERENCE, "", OK, 9.0) is not None


def test_stale_counts_as_neither() -> None:
    r = ModeRules(fail_after=2, recover_after=2)
    assert r.observe("t", DM.REMOTE_POLICY_LOST, "", ERR, 0.0) is None
    assert r.observe("t", DM.REMOTE_POLICY_LOST, "", STALE, 1.0) is None
    assert r.counts("t").failures == 1
    assert r.observe("t", DM.REMOTE_POLICY_LOST, "", ERR, 2.0) is not None
    assert r.observe("t", DM.REMOTE_POLICY_LOST, "", OK, 3.0) is None
    assert r.observe("t", DM.REMOTE_POLICY_LOST, "", STALE, 4.0) is None
    assert r.counts("t").goods == 1
    assert r.observe("t", DM.REMOTE_POLICY_LOST, "", OK, 5.0) is not None


def test_modes_combine_and_sensor_subjects_are_separate() -> None:
    r = ModeRules(fail_after=1, recover_after=1)
    assert r.observe("broker", DM.BROKER_LOST, "", ERR, 0.0) is not None
    cam = r.observe("sensor:camera", DM.SENSOR_PREDICTED, "camera", ERR, 0.0)
    assert cam is not None and cam.subject == "camera"
    wrist = r.observe("sensor:wrist", DM.SENSOR_PREDICTED, "wrist", ERR, 0.0)
    assert wrist is not None and wrist.subject == "wrist"
    assert r.modes() == ["broker_lost", "sensor_predicted"]
    assert r.active() == [(DM.BROKER_LOST, ""), (DM.SENSOR_PREDICTED, "camera"),
                          (DM.SENSOR_PREDICTED, "wrist")]
    left = r.observe("sensor:camera", DM.SENSOR_PREDICTED, "camera", OK, 1.0)
    assert left is not None and left.subject == "camera"
    assert r.modes() == ["broker_lost", "sensor_predicted"]  # the wrist still predicted
    assert r.observe("sensor:wrist", DM.SENSOR_PREDICTED, "wrist", OK, 2.0) is not None
    assert r.modes() == ["broker_lost"]


def test_one_mode_held_by_two_probes_is_left_when_the_last_lets_go() -> None:
    r = ModeRules(fail_after=1, recover_after=1)
    assert r.observe("gpu", DM.CPU_INFERENCE, "", ERR, 0.0) is not None
    assert r.observe("gpu:nvml", DM.CPU_INFERENCE, "", ERR, 0.0) is None  # already entered
    assert r.observe("gpu", DM.CPU_INFERENCE, "", OK, 1.0) is None
    assert r.modes() == ["cpu_inference"]
    assert r.observe("gpu:nvml", DM.CPU_INFERENCE, "", OK, 2.0) is not None
    assert r.modes() == []


def test_a_probe_without_a_mode_counts_but_never_transitions() -> None:
    r = ModeRules(fail_after=1, recover_after=1)
    assert r.observe("link", None, "", ERR, 0.0) is None
    assert r.counts("link").failures == 1 and not r.counts("link").holding
    assert r.modes() == []


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError):
        ModeRules(fail_after=0)


def test_a_probe_with_its_own_fail_after_enters_at_its_first_failure() -> None:
    """A lost predicted channel enters sensor_predicted at once (the probe's fail_after = 1);
    leaving still takes recover_after good runs; other probes keep the rule's 3."""
    from edge_agent.health.probe import fail_after_of
    from edge_agent.health.sensor_probes import SensorFreshnessProbe

    assert SensorFreshnessProbe.fail_after == 1
    r = ModeRules(fail_after=3, recover_after=2)
    entered = r.observe("sensor:object_pose", DM.SENSOR_PREDICTED, "object_pose", ERR, 0.0, 1)
    assert entered is not None and entered.entered and entered.subject == "object_pose"
    assert r.observe("broker", DM.BROKER_LOST, "", ERR, 0.0, None) is None
    assert r.observe("sensor:object_pose", DM.SENSOR_PREDICTED, "object_pose", OK, 1.0, 1) is None
    left = r.observe("sensor:object_pose", DM.SENSOR_PREDICTED, "object_pose", OK, 2.0, 1)
    assert left is not None and not left.entered

    class Plain:
        pass

    assert fail_after_of(Plain()) is None  # type: ignore[arg-type]
