"""`edge-agent fleet rollout MODEL`: the per-robot model trial (docs/MODELS.md) driven across a
fleet in waves, with the Greengrass `IoTJobAbortCriteria` pattern.

    plan      the online robots (sorted by id, `--robots` to pick), a canary wave of `--canary`
              robots, then waves of `--wave` % of the robots left after the canary (at least one)
    a wave    `model.update {uri, sha256}` to each robot at once; then its trial is followed in
              its `status.model.trial` (the robots' `status`, every `poll_s`) until `committed`
              or `rolled_back` for this sha256, or `--trial-timeout-s`. With `--drive-task T`
              the rollout starts task T on a robot whose trial waits for tasks while it is idle
              (a test bench, or robots with no other work; else their own work drives them).
    failed    the update refused (the reply's reason: a bad signature, require_gate without a
              passing record, a model marked bad, a task running), the trial rolled back, or no
              end by the timeout
    abort     a wave whose failed fraction reaches `--abort-at` % stops the rollout: no further
              wave starts, and the wave's robots go back to the model they ran before it (with
              `--rollback-scope all`, every updated robot): a robot its own trial rolled back is
              there already; one that committed gets `model.update` of `--previous FILE` (the
              model the fleet ran; a file in every robot's `inference.update_dir`, as MODEL;
              retried while the robot answers `busy`: it swaps models only at idle), which the
              robot verifies and puts on trial like any install — signatures and
              `require_gate` hold for it too, nothing is bypassed. A robot still on trial at
              the abort is left to its trial (one trial at a time: `model.update` is refused).

No daemon command was added: `model.update` of the previous file is the way back.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.fleet.bus import FleetBus, Robot
from edge_agent.fleet.view import model_fields

TERMINAL = ("committed", "rolled_back")


@dataclass(frozen=True)
class ModelFile:
    uri: str
    sha256: str

    @classmethod
    def from_path(cls, path: str, sha256: str | None = None) -> ModelFile:
        """A model file readable here at the same path as on the robots (their update_dir);
        `sha256` when it is not readable here."""
        if sha256 is None:
            digest = hashlib.sha256()
            with open(path, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    digest.update(chunk)
            sha256 = digest.hexdigest()
        return cls(str(Path(path).absolute()), sha256)


@dataclass(frozen=True)
class RolloutPlan:
    model: ModelFile
    canary: int = 1
    wave_pct: float = 25.0
    abort_at_pct: float = 50.0
    trial_timeout_s: float = 3600.0
    previous: ModelFile | None = None
    drive_task: str | None = None
    rollback_scope: str = "wave"  # or "all"
    poll_s: float = 1.0


def plan_waves(devices: list[str], canary: int, wave_pct: float) -> list[list[str]]:
    """The canary wave, then waves of ceil(wave_pct % of the rest), at least one robot each."""
    head, rest = devices[:canary], devices[canary:]
    size = max(1, math.ceil(len(rest) * wave_pct / 100.0)) if rest else 1
    return ([head] if head else []) + [rest[i:i + size] for i in range(0, len(rest), size)]


@dataclass
class RobotRun:
    device: str
    before: dict[str, Any] | None = None  # the model it ran (status.model.current)
    outcome: str = "waiting"  # updating, on_trial, committed, rolled_back, refused, timeout,
    #                           already, no_reply
    reason: str | None = None
    updated_at: float | None = None
    ended_at: float | None = None
    tasks_started: int = 0
    rollback: str | None = None  # after an abort: restored, already_back, left_on_trial, ...

    @property
    def failed(self) -> bool:
        return self.outcome in ("refused", "rolled_back", "timeout", "no_reply")


@dataclass
class Wave:
    index: int
    name: str
    robots: list[RobotRun]
    started: float | None = None
    ended: float | None = None
    failed_pct: float = 0.0
    aborted: bool = False


@dataclass
class Rollout:
    plan: RolloutPlan
    waves: list[Wave] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    aborted_at_wave: int | None = None
    skipped: list[str] = field(default_factory=list)  # robots offline at the start

    @property
    def result(self) -> str:
        return "aborted" if self.aborted_at_wave is not None else "completed"


class Runner:
    """Runs a plan on `bus`; `say(line)` prints the progress view (one line per change)."""

    def __init__(self, bus: FleetBus, plan: RolloutPlan, say: Callable[[str], None]) -> None:
        self.bus, self.plan, self.say = bus, plan, say
        self.robots: dict[str, Robot] = {}

    def run(self, robots: list[Robot]) -> Rollout:
        p = self.plan
        ro = Rollout(p, started=time.time())
        online = [r for r in robots if r.online]
        ro.skipped = sorted(r.device for r in robots if not r.online)
        self.robots = {r.device: r for r in online}
        groups = plan_waves(sorted(self.robots), p.canary, p.wave_pct)
        ro.waves = [Wave(i, "canary" if i == 0 and p.canary else f"wave {i}",
                         [RobotRun(d) for d in g]) for i, g in enumerate(groups)]
        self.say(f"rollout {p.model.uri} (sha256 {p.model.sha256[:12]}) to {len(online)} "
                 f"robots in {len(ro.waves)} waves: " + " | ".join(
                     f"{w.name}: {','.join(r.device for r in w.robots)}" for w in ro.waves)
                 + (f"; offline, skipped: {','.join(ro.skipped)}" if ro.skipped else ""))
        for wave in ro.waves:
            self._run_wave(wave)
            if wave.failed_pct >= p.abort_at_pct:
                wave.aborted = True
                ro.aborted_at_wave = wave.index
                self.say(f"{wave.name}: {wave.failed_pct:.0f} % failed >= --abort-at "
                         f"{p.abort_at_pct:g} %: ABORT, rolling back")
                scope = ([r for w in ro.waves[:wave.index + 1] for r in w.robots]
                         if p.rollback_scope == "all" else wave.robots)
                self._roll_back(scope)
                break
        ro.ended = time.time()
        return ro

    # -- one wave --------------------------------------------------------------------------
    def _run_wave(self, wave: Wave) -> None:
        p = self.plan
        wave.started = time.time()
        self.say(f"{wave.name}: {len(wave.robots)} robots")
        bots = [self.robots[r.device] for r in wave.robots]
        self.bus.query_all(bots, timeout=5.0)
        sent = []
        for run, bot in zip(wave.robots, bots, strict=True):
            cur = model_fields(bot.details)["current"]
            run.before = cur
            if cur and cur.get("sha256") == p.model.sha256:
                self._set(run, "already", "runs this model already")
                continue
            sent.append((run, self.bus.command(bot, "model.update", {
                "uri": p.model.uri, "sha256": p.model.sha256})))
            run.updated_at = time.time()
            self._set(run, "updating")
        for run, pending in sent:
            pending.done.wait(30.0)  # verification, a smoke run and two loads
            reply = pending.reply
            if reply is None:
                self._set(run, "no_reply", "no reply to model.update within 30 s")
            elif not reply.get("ok"):
                err = reply.get("error") or {}
                self._set(run, "refused", f"{err.get('code')}: {err.get('message')}")
            else:
                self._set(run, "on_trial")
        deadline = time.monotonic() + p.trial_timeout_s
        while any(r.outcome == "on_trial" for r in wave.robots):
            if time.monotonic() > deadline:
                for r in wave.robots:
                    if r.outcome == "on_trial":
                        self._set(r, "timeout", f"no commit or rollback within "
                                  f"{p.trial_timeout_s:g} s")
                break
            time.sleep(p.poll_s)
            self._follow([r for r in wave.robots if r.outcome == "on_trial"])
        wave.ended = time.time()
        failed = sum(r.failed for r in wave.robots)
        wave.failed_pct = 100.0 * failed / len(wave.robots) if wave.robots else 0.0
        self.say(f"{wave.name}: done in {wave.ended - wave.started:.1f} s, "
                 f"{sum(r.outcome in ('committed', 'already') for r in wave.robots)} committed, "
                 f"{failed} failed ({wave.failed_pct:.0f} %)")

    def _follow(self, runs: list[RobotRun]) -> None:
        bots = [self.robots[r.device] for r in runs]
        self.bus.query_all(bots, timeout=5.0)
        for run, bot in zip(runs, bots, strict=True):
            trial = model_fields(bot.details)["trial"] or {}
            if trial.get("sha256") != self.plan.model.sha256:
                continue
            state = trial.get("state")
            if state in TERMINAL:
                self._set(run, str(state), "; ".join(map(str, trial.get("reasons") or [])) or None)
            elif state == "on_trial" and self.plan.drive_task and self._idle(bot):
                reply = self.bus.request(bot, "task.start", {"task": self.plan.drive_task})
                if reply is not None and reply.get("ok"):
                    run.tasks_started += 1
                    self.say(f"  {run.device:<16} task {run.tasks_started} started "
                             f"({trial.get('tasks_done')}/{trial.get('tasks_required')} done)")

    @staticmethod
    def _idle(bot: Robot) -> bool:
        st = bot.state or {}
        return st.get("mode") == "idle" and not st.get("stop") and not st.get("task")

    def _set(self, run: RobotRun, outcome: str, reason: str | None = None) -> None:
        run.outcome, run.reason = outcome, reason
        if outcome in (*TERMINAL, "refused", "timeout", "no_reply", "already"):
            run.ended_at = time.time()
        took = (f" after {run.ended_at - run.updated_at:.1f} s"
                if run.ended_at and run.updated_at else "")
        self.say(f"  {run.device:<16} {outcome}{took}" + (f": {reason}" if reason else ""))

    # -- the abort -------------------------------------------------------------------------
    def _roll_back(self, runs: list[RobotRun]) -> None:
        prev = self.plan.previous
        for run in runs:
            bot = self.robots[run.device]
            before = (run.before or {}).get("sha256")
            if run.outcome in ("refused", "no_reply", "already"):
                run.rollback = "untouched"  # no update happened (or its fate is unknown)
            elif run.outcome == "rolled_back":
                run.rollback = "already_back"  # its own trial restored the previous model
            elif run.outcome == "timeout":
                run.rollback = "left_on_trial"  # model.update is refused while a trial runs
            elif before is None:
                run.rollback = "no_previous_model"
            elif prev is None or prev.sha256 != before:
                run.rollback = (f"not_restored: it ran sha256 {before[:12]}; give that file "
                                "as --previous")
            else:
                reply = self._update_when_idle(bot, prev)
                if reply is not None and reply.get("ok"):
                    run.rollback = "restored"
                else:
                    err = (reply or {}).get("error") or {}
                    run.rollback = (f"failed: {err.get('code')}: {err.get('message')}"
                                    if reply else "failed: no reply")
            self.say(f"  {run.device:<16} rollback: {run.rollback}")

    def _update_when_idle(self, bot: Robot, model: ModelFile) -> dict[str, Any] | None:
        """`model.update`, retried every `poll_s` while the robot answers `busy` (a task runs:
        the daemon swaps models only at idle), for at most `trial_timeout_s`."""
        end = time.monotonic() + self.plan.trial_timeout_s
        while True:
            reply = self.bus.request(bot, "model.update", {
                "uri": model.uri, "sha256": model.sha256}, timeout=30.0)
            busy = reply is not None and (reply.get("error") or {}).get("code") == "busy"
            if not busy or time.monotonic() > end:
                return reply
            time.sleep(self.plan.poll_s)
