"""The composition root: the minimal start-up path, the running daemon, and a clean shutdown.

exec → config → spawn the link guardian (cli: its own start-up runs beside our imports) →
logging → restore snapshot (latches!) → adopt the guardian, latch it if the snapshot was latched
→ control thread (holding) → MQTT connect started → the guardian's first link-up (bounded) →
READY. Heavy work (Kalman estimators: filterpy pulls scipy) runs after READY in the background;
`--eager` does it before READY for comparison. The `ready` event's `phases_ms` says when each
step ended (ms since exec).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edge_agent.clock import Clock, MonotonicClock
from edge_agent.commands import CommandAPI, Freshness, JsonFileDedupStore
from edge_agent.config import Config
from edge_agent.daemon import persist
from edge_agent.daemon.deadman import GuardianWatch
from edge_agent.daemon.handlers import register_handlers
from edge_agent.daemon.heap import HeapKeeper
from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.daemon.notify import SystemdNotifier
from edge_agent.daemon.output import CommandOutput
from edge_agent.daemon.policy import DaemonPolicy
from edge_agent.daemon.procstart import mark, ms_since_start, phases, process_start_monotonic
from edge_agent.daemon.publisher import Publisher
from edge_agent.daemon.reporting import DaemonReports
from edge_agent.daemon.signals import route_signals
from edge_agent.daemon.simrig import SimRig, start_sim_rig
from edge_agent.errors import EdgeAgentError, LinkError
from edge_agent.executor.collector import CollectionStats
from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import LatchState, StopLatch
from edge_agent.executor.loop import RateLoop
from edge_agent.executor.tasks import ExecutorConfig
from edge_agent.health.monitor import HealthMonitor
from edge_agent.health.wiring import HealthSources, attach_inference_probes, build_health
from edge_agent.link.codec import Command, Enable, Message, Mode, Stop, StopCategory, StopReason
from edge_agent.link.guardian_client import GuardianClient
from edge_agent.link.guardian_spawn import Spawned, spec_from_config
from edge_agent.log import get_logger
from edge_agent.sensors.hub import SensorHub
from edge_agent.store.decisions import DecisionJournal, journal_dir
from edge_agent.store.snapshot import SnapshotStore
from edge_agent.store.writer import StoreWriter
from edge_agent.vocab import ESTOP_CAUSES, EventType, StopCause

_log = get_logger(__name__)

_STOP_REASON = {
    StopCause.ESTOP_INPUT: StopReason.ESTOP_INPUT, StopCause.LINK_FAULT: StopReason.LINK_FAULT,
    StopCause.GUARDIAN_LOST: StopReason.LINK_FAULT, StopCause.DEADMAN: StopReason.DEADMAN,
    StopCause.COLLISION: StopReason.COLLISION,
}


_PERSISTED_EVENTS = frozenset({"task_done", "attempt_failed", "diagnostic", "task_started",
                               "task_frozen", "task_resumed", "mode_changed"})


def executor_config(cfg: Config) -> ExecutorConfig:
    """The executor's numbers from the config file (the rest keep their defaults)."""
    e = cfg.executor
    return ExecutorConfig(
        tool_tolerance_m=e.tool_tolerance_m, grip_force_n=e.grip_force_n,
        grip_force_band_n=e.grip_force_band_n, max_attempts=e.max_attempts,
        l3_threshold=e.l3_threshold, collision_current_factor=e.collision_current_factor,
        decision_hz=cfg.control.decision_hz, diagnostic_window_s=e.diagnostic_capture_s,
        manual_speed_fraction=e.jog_speed_scale,
        regrasp_window_s=e.regrasp_window_s, max_regrasps=e.max_regrasps,
        l1_timeouts_s={k: float(getattr(e.l1_timeouts_s, k)) for k in (
            "approach", "grasp", "lift", "transfer", "release", "retreat")})


class Daemon:
    """Owns every moving part; `start()` follows the minimal path, `stop()` is idempotent."""

    def __init__(self, config: Config, *, sim: bool = False, eager: bool = False,
                 prespawned: Spawned | None = None,
                 clock: Clock | None = None) -> None:
        self.cfg = config
        # The time the executor, the latch and the link mirror see (a virtual one in
        # hil/daemon_lockstep.py); real waits on other threads keep time.monotonic().
        self.clock: Clock = clock or MonotonicClock()
        self._prespawned = prespawned  # a guardian the CLI started early (adopted in start())
        self.sim = sim
        self.eager = eager
        self.boot_id = uuid.uuid4().hex
        self.started_mono = process_start_monotonic()
        self.state_dir = Path(config.state_dir)
        self.latch = StopLatch()
        self.hub = SensorHub(config.robot, stale_periods=max(
            3.0, 3.0 * config.link.status_period_us / 1000.0))
        self.notifier = SystemdNotifier()
        self.publisher = Publisher(self)
        self.mirror = LinkMirror(self.hub, self.latch, self.publisher.event, clock=self.clock.now)
        self.watch = GuardianWatch(self.mirror, self.latch, config.link.deadman_ms / 1000.0,
                                   lambda: self.guardian is not None and self.guardian.ready)
        self.writer = StoreWriter(on_error=self._on_store_error)
        self.snapshots = SnapshotStore(self.state_dir, persist.SNAPSHOT_NAME)
        # stop epochs: nothing sent before the latest stop or reset moves the robot after it
        self.freshness = Freshness(config.mqtt.clock_skew_s)
        self.api = CommandAPI(self.mode, dedup_window_s=config.mqtt.dedup_window_s,
                              freshness=self.freshness,
                              dedup_store=None,  # set in start(): the state dir must exist
                              reset_min_interval_s=config.executor.reset_min_interval_s,
                              failure_injection=config.debug.failure_injection)
        # Every policy decision (observation, action, backend, latency, outcome) is journaled:
        # own writer thread, bounded segments; a full disk turns the journal off with an event
        # (it never stops the robot — a failed *snapshot* write does).
        self.decisions = (DecisionJournal(
            journal_dir(self.state_dir), segment_bytes=config.journal.segment_bytes,
            max_segments=config.journal.max_segments, on_event=self.publisher.event)
            if config.journal.enabled else None)
        self.executor = Executor(config.robot, self.latch, config=executor_config(config),
                                 decision_sink=self._journal_decision)
        # tick and commands one at a time (~0.1 ms a tick); re-entrant: a latch change inside a
        # command or a tick calls back into save_snapshot on the same thread
        self.exec_lock = threading.RLock()
        self._exec_events: deque[dict[str, Any]] = deque(maxlen=10_000)
        self.policy = DaemonPolicy(config, self.executor, self.exec_lock, self.decisions,
                                   self._exec_events, self.publisher.event)
        self.reports = DaemonReports(self)  # stop and L3 repair reports (daemon/reporting.py)
        self.rig: SimRig | None = None
        self.guardian: GuardianClient | None = None
        self.loop: RateLoop | None = None
        self.startup_ms: float | None = None
        self.link_up_ms: float | None = None  # since exec: the guardian's first link-up state
        self.background: dict[str, Any] = {}
        self.health: HealthMonitor | None = None  # built in start() (health/wiring.py)
        self._hold = Command(Mode.HOLD, config.robot.home)  # q ignored in HOLD
        self._stop_event = threading.Event()
        self._stopped = False
        self._send_errors = 0
        self.output = CommandOutput(self._send, config.control.output_at_deadline)
        self._period = 1.0 / config.control.rate_hz
        self.gc_stats = CollectionStats()  # installed in start(): the real daemon's only
        self.heap = HeapKeeper(self.gc_stats)  # full collections at safe points only
        self._background_done = threading.Event()
        self._bg_threads: list[threading.Thread] = []  # start-up work after READY

    def _journal_decision(self, decision: dict[str, Any]) -> None:
        if self.decisions is not None and not self.policy.router_journals:
            self.decisions.record(decision)  # never blocks, never raises

    # -- modes -----------------------------------------------------------------------------
    def mode(self) -> str:
        return self.executor.mode

    @property
    def degraded(self) -> list[str]:
        """The degradation modes active now (`state.degraded`; the health monitor decides)."""
        return self.health.degraded() if self.health is not None else []

    # -- start-up --------------------------------------------------------------------------
    def start(self) -> None:
        mark("daemon_init")
        cfg = self.cfg
        # A thread that wants the GIL waits this long before it asks the holder to let go: the
        # control thread, woken at its deadline, waits at most about this much for the reader
        # or the MQTT thread (hil/bench_control_loop: wake-up lateness P99 0.54-0.61 ms at
        # 0.5 ms, 0.29-0.35 ms at 0.2 ms together with link.reader_priority).
        sys.setswitchinterval(0.0002)
        self.gc_stats.install()
        restored = self.restore_state()
        mark("restore")
        port = cfg.link.port
        if self.sim:
            self.rig = start_sim_rig(cfg.robot_file, self.state_dir, rig_config=cfg.sim.rig_config,
                                     seed=cfg.sim.robot_seed, priority=cfg.sim.rig_priority)
            port = self.rig.ptys[0]
        if not port:
            raise EdgeAgentError("link.port is not set (give a tty path or run with --sim)")
        spec = spec_from_config(cfg, port)
        self.guardian = GuardianClient(
            spec.port, spec.robot_path, deadman_s=spec.deadman_s,
            on_frame=self.mirror.on_frame, on_guardian_down=self._on_guardian_down,
            on_guardian_up=self._on_guardian_up, priority=spec.priority,
            extra_args=spec.extra_args, reader_priority=cfg.link.reader_priority)
        early, self._prespawned = self._prespawned, None
        self.guardian.start(prespawned=early)
        mark("guardian_spawn")
        self.latch_new_guardian()
        self.loop = RateLoop(self._tick, cfg.control.rate_hz,
                             spin_s=0.0 if cfg.control.no_spin else cfg.control.spin_s,
                             priority=cfg.control.priority)
        self.loop.start()
        mark("control_loop")
        register_handlers(self)
        self.publisher.start()
        mark("comms")
        if self.eager:
            self._background_work()
        # Bounded: the guardian's first G_STATE with the link up says the tty opened and the
        # firmware answered HELLO (the CLI spawned the guardian beside our imports, so this
        # rarely waits). A missing device does not block READY for long: a protective stop
        # with a link_fault event, not a restart loop.
        self._wait_first_link(port)
        mark("link_up")
        self._ready(restored)
        self.reports.start()
        # -- health monitor (health/wiring.py): its own thread, after READY
        pub, gc_after = self.publisher, self.gc_stats
        self.health = build_health(cfg, HealthSources(
            publish=pub.event, tap_events=pub.taps.append, state_changed=pub.state_changed,
            submit_report=self.reports.submit,
            mqtt_ready=lambda: pub.bridge is not None and pub.bridge.ready,
            mqtt_detail=pub.mqtt_status,
            outbox_pending=lambda: int(self.reports.status().get("pending", 0)),
            link_frames=lambda: self.mirror.frames, link_up=lambda: self.mirror.link_up,
            guardian_alive=lambda: self.guardian is not None and self.guardian.alive,
            loop_stats=lambda: self.loop.stats if self.loop is not None else None,
            gc_long_pauses=lambda: sum(gc_after.after_startup.over_5ms)
            if gc_after.after_startup is not None else 0,
            journal_stats=lambda: self.decisions.stats() if self.decisions else None,
            state_dir=self.state_dir, background=self.background, sensor_hub=self.hub))
        if self.eager and self.policy.stack is not None:
            attach_inference_probes(self.health, self.policy.stack.router, cfg)
        self.health.start()
        if not self.eager:
            self._bg_threads.append(threading.Thread(
                target=self._background_work, name="startup-bg", daemon=True))
            self._bg_threads[-1].start()
        # -- lifecycle helper: rest calibration (daemon/calibrator.py), after READY on both paths
        self._bg_threads.append(threading.Thread(target=self._calibrate, name="calibration",
                                                 daemon=True))
        self._bg_threads[-1].start()

    def restore_state(self) -> persist.Restored:
        """State dir, command API, snapshot → latch and executor (tripped on an unclean
        restart), the snapshot writer. The first step of start(); the lock-step host
        (hil/daemon_lockstep.py) runs it too, then wires its own guardian and clock."""
        cfg = self.cfg
        persist.prepare_state_dir(self.state_dir)
        self.api = CommandAPI(self.mode, dedup_store=JsonFileDedupStore(
            self.state_dir / "dedup.json"), dedup_window_s=cfg.mqtt.dedup_window_s,
            reset_min_interval_s=cfg.executor.reset_min_interval_s,
            failure_injection=cfg.debug.failure_injection, clock=self.clock,
            freshness=self.freshness)
        restored = persist.restore(self.state_dir, self.snapshots)
        now = self.clock.now()
        self.latch.add_listener(self.freshness.on_latch)
        self.latch.add_listener(self._on_latch)
        self.latch.restore(restored.data.get("latch", {}), now)
        # after _on_latch (the stop frame goes first) and the restored causes (reported in the
        # boot that latched them): this boot's stops, an unclean restart included
        self.reports.subscribe()
        if restored.unclean:
            self.latch.trip(StopCause.UNCLEAN_RESTART, now)
        self.executor.restore(restored.data.get("executor", {}), now, clean=not restored.unclean)
        self.writer.start()
        return restored

    def latch_new_guardian(self) -> None:
        """A latch restored from the snapshot (unclean restart, saved e-stop) was tripped before
        the guardian existed: latch the new guardian too, so the wire holds whatever the
        daemon's own command stream does — as an e-stop if one was saved."""
        saved_causes = self.latch.state.causes
        if saved_causes:
            self._send_stop(next((c for c in saved_causes if c in ESTOP_CAUSES), saved_causes[0]))

    def _wait_first_link(self, port: str) -> None:
        waited = self.cfg.link.hello_timeout_s
        if self.mirror.wait_gstate(0.0, timeout=waited, pred=lambda g: g.link_up) is None:
            self.latch.set_condition(StopCause.LINK_FAULT, True, self.clock.now())
            self.publisher.event({"type": EventType.LINK_FAULT, "cause": "no_device", "port": port,
                                  "waited_s": waited})
        else:
            self.link_up_ms = round(ms_since_start(self.mirror.gstate_at), 1)

    def _calibrate(self) -> None:
        from edge_agent.daemon.calibrator import calibrate_daemon

        # after the estimators: one heavy thing at a time; not at all once stopping (stop()
        # sets the event too)
        self._background_done.wait(60.0)
        if not self._stopped:
            calibrate_daemon(self)
            self.heap.startup_done()  # the last start-up work: its heap is frozen too
    # -- end lifecycle helper

    def _ready(self, restored: persist.Restored) -> None:
        self.startup_ms = round(ms_since_start(), 1)
        self.notifier.ready(f"ready in {self.startup_ms} ms, mode {self.mode()}")
        _log.info("ready", startup_ms=self.startup_ms, boot_id=self.boot_id, mode=self.mode(),
                  eager=self.eager, sim=self.sim, link_up=self.mirror.link_up,
                  unclean_restart=restored.unclean, snapshot_generation=restored.generation,
                  corrupt_files=restored.corrupt_files, config_hash=self.cfg.hash,
                  phases_ms=phases())
        self.publisher.event({"type": EventType.READY, "startup_ms": self.startup_ms,
                              "eager": self.eager, "unclean_restart": restored.unclean})
        if restored.corrupt_files:
            self.publisher.event({"type": EventType.SNAPSHOT_CORRUPT,
                                  "files": restored.corrupt_files,
                                  "used_previous": restored.used_previous})
        self.heap.ready()  # start-up garbage frozen; automatic full collections off

    def _background_work(self) -> None:
        """Heavy, non-essential start-up work; each completion is an event."""
        # first: a task that arrives early waits for the model
        self.background["inference"] = self.policy.start()
        if self.health is not None and self.policy.stack is not None:
            attach_inference_probes(self.health, self.policy.stack.router, self.cfg)
        if self._stopped:
            self._background_done.set()
            return
        if self.decisions is not None:
            try:
                report = self.decisions.open()  # scans (and repairs) the newest segment's tail
                self.background["journal"] = {"ok": report is not None}
            except Exception as exc:
                self.background["journal"] = {"ok": False, "error": str(exc)}
                _log.exception("journal_open_failed")
        # The hub built its Kalman estimators with itself (closed form, no filterpy): they
        # have predicted from the first frame; the event keeps its place in the start-up story.
        self.background["estimators"] = {"ok": True, "ms": 0.0, "since": "construction"}
        self.publisher.event({"type": EventType.ESTIMATORS_READY, "ms": 0.0})
        # What loaded after READY (onnxruntime, the sessions: ~10^5
        # objects) joins the frozen start-up heap: a full collection would otherwise scan it
        # all, holding the GIL for tens of ms — the control loop ran 50 ms late behind one.
        self.heap.startup_done()  # again after the calibration, the last start-up work
        self._background_done.set()

    # -- control thread --------------------------------------------------------------------
    def _tick(self, now: float, index: int) -> None:
        """One control period: sensors → executor → one COMMAND frame (daemon/output.py)."""
        if self.guardian is None:
            return
        self.watch.check(now)  # a stall latches before the first setpoint computed after it
        snap = self.hub.snapshot(now)
        with self.exec_lock:
            latch_state = self.latch.state
            cmd = self.executor.tick(now, snap)
            events = self.executor.drain_events()
        self.watch.commanded(cmd.moves, now)
        if events:
            self._exec_events.extend(events)  # published by the main thread, not here
        # the next deadline: on the loop's schedule (lock-step time has no lateness)
        deadline = self.loop.deadline if self.loop is not None else now
        self.output.emit(cmd, latch_state, deadline + self._period)

    def _send(self, msg: Message) -> None:
        """A frame to the guardian; a failed send is counted (the guardian's loss is handled
        by its client and the latch, not here)."""
        if self.guardian is None:
            return
        try:
            self.guardian.send(msg)
        except LinkError:
            self._send_errors += 1

    def enable_drives(self) -> None:
        """Before new motion: the guardian passes no motion after a reset until an ENABLE."""
        self._send(Enable(True))

    # -- callbacks -------------------------------------------------------------------------
    def _send_stop(self, cause: StopCause) -> None:
        cat = StopCategory.CAT0 if cause in ESTOP_CAUSES else StopCategory.CAT2
        reason = _STOP_REASON.get(cause, StopReason.ESTOP_REMOTE if cause in ESTOP_CAUSES
                                  else StopReason.PROTECTIVE)
        self._send(Stop(cat, reason))

    def _on_latch(self, state: LatchState, cause: StopCause | None) -> None:
        if cause is not None:
            self._send_stop(cause)
        self.save_snapshot()
        if cause is not None:
            self.publisher.event({"type": EventType.STOP,
                                  "kind": state.kind.value if state.kind else None,
                                  "cause": cause.value})
        else:
            cleared = EventType.STOP_CLEARED if not state.latched else EventType.STOP_UPDATE
            self.publisher.event({"type": cleared,
                                  "hardware_input": state.hardware_input})
        self.publisher.state_changed()

    def _on_guardian_down(self, reason: str) -> None:
        if self._stopped:
            return  # we stopped it (or a terminal's Ctrl-C reached it): not a fault
        _log.error("guardian_down", reason=reason)
        self.latch.set_condition(StopCause.GUARDIAN_LOST, True, self.clock.now())

    def _on_guardian_up(self) -> None:
        self.latch.set_condition(StopCause.GUARDIAN_LOST, False, self.clock.now())

    def _on_store_error(self, name: str, exc: BaseException) -> None:
        _log.error("snapshot_write_failed", store=name, error=str(exc))
        self.latch.trip(StopCause.SNAPSHOT_FAILED, self.clock.now())

    def save_snapshot(self, on_done: Callable[[BaseException | None], None] | None = None
                      ) -> bool:
        with self.exec_lock:
            ex = self.executor.to_snapshot()
        data = {"latch": self.latch.to_dict(), "executor": ex, "boot_id": self.boot_id,
                "saved_wall": time.time()}
        return self.writer.submit_snapshot(self.snapshots, data, on_done)

    def estop(self, cause: StopCause) -> None:
        """Any e-stop source: latch (the listener sends the stop frame) — and send it again."""
        now = self.clock.now()
        if not self.latch.trip(cause, now):
            self.freshness.note_trip()  # commanded again while latched: a stop all the same
            self._send(Stop(StopCategory.CAT0, StopReason.ESTOP_REMOTE))

    def status(self) -> dict[str, Any]:
        from edge_agent.daemon.handlers import status_payload

        return status_payload(self)

    def telemetry(self) -> dict[str, Any]:
        snap = self.mirror.last_status
        out: dict[str, Any] = {"loop": self.loop.stats.as_dict() if self.loop else None,
                               "link_frames": self.mirror.frames, "send_errors": self._send_errors}
        if snap is not None:
            out.update(q=[round(v, 5) for v in snap.q], gripper_pos=round(snap.gripper_pos, 5),
                       gripper_force=round(snap.gripper_force, 3), fw_time_us=snap.fw_time_us)
        return out

    # -- running ---------------------------------------------------------------------------
    def request_stop(self, *_: object) -> None:
        self._stop_event.set()

    def run_forever(self) -> int:
        route_signals(self._stop_event.set, lambda: self.estop(StopCause.ESTOP_SIGNAL))
        try:
            self.start()
        except EdgeAgentError as exc:
            _log.error("startup_failed", error=str(exc))
            self.stop()
            return 1
        wd = SystemdNotifier.watchdog_interval_s()
        period = min(0.05, wd / 2) if wd else 0.05
        while not self._stop_event.wait(period):
            self._housekeeping(time.monotonic())
        self.stop()
        return 0

    def background_busy(self) -> bool:
        return any(t.is_alive() for t in self._bg_threads)

    def healthy(self, now: float) -> bool:
        """Watchdog condition: the control loop and the link reader are alive and on time."""
        return (self.loop is not None and self.loop.on_time(now)
                and self.mirror.reader_on_time(now))

    def _housekeeping(self, now: float) -> None:
        if self.healthy(now):
            self.notifier.watchdog()
        self.heap.tick(now, self.executor.mode)
        if self._exec_events:
            persist_now = False
            while self._exec_events:
                ev = self._exec_events.popleft()
                if ev.get("type") in _PERSISTED_EVENTS:
                    persist_now = True
                self.publisher.event(ev)
            self.publisher.state_changed()
            if persist_now:
                self.save_snapshot()
        self.publisher.tick(now)

    def stop(self) -> None:
        """Controlled stop: hold, tell everyone, persist, exit. Idempotent, never raises."""
        if self._stopped:
            return
        self._stopped = True
        self.notifier.stopping()
        if self._prespawned is not None:  # start-up failed before adopting it
            self._prespawned.abandon()
            self._prespawned = None
        _log.info("stopping")
        self._background_done.set()  # a calibration still waiting for its turn gives up
        self.watch.close()  # the command stream stops now: not a deadman stop
        t0 = last = time.monotonic()
        took: dict[str, float] = {}

        def step(name: str) -> None:
            nonlocal last
            now = time.monotonic()
            took[name] = round((now - last) * 1e3, 1)
            last = now

        if self.health is not None:
            self.health.stop()
        if self.loop is not None:
            self.loop.stop()
        self.gc_stats.uninstall()
        self.heap.stop()
        step("control_loop")
        self.policy.stop()
        if self.decisions is not None:
            self.decisions.stop()
        step("inference_journal")
        if self.guardian is not None:
            with contextlib.suppress(LinkError):
                self.guardian.send(self._hold)
            self.guardian.stop()
        step("guardian")
        self.reports.stop()
        self.publisher.stop()
        step("reports_mqtt_socket")
        self.save_snapshot()
        self.writer.stop()
        step("snapshot")
        if self.rig is not None:
            self.rig.stop()
        step("sim_rig")
        # Start-up work may still be inside a native import or session creation (onnxruntime,
        # scipy): the interpreter must not be finalized under it (that aborts the process).
        for t in self._bg_threads:
            t.join(timeout=max(0.0, 1.0 - (time.monotonic() - t0)))
        step("background")
        persist.mark_clean_shutdown(self.state_dir)
        self.notifier.close()
        _log.info("stopped", stop_ms=round((time.monotonic() - t0) * 1e3, 1), steps_ms=took)


def run(config: Config, *, sim: bool = False, eager: bool = False,
        prespawned: Spawned | None = None) -> int:
    """`edge-agent run`: run the daemon in the foreground until SIGTERM/SIGINT."""
    for w in config.warnings:
        _log.warning("config_warning", warning=w)
    d = Daemon(config, sim=sim, eager=eager, prespawned=prespawned)
    rc = d.run_forever()
    if d.background_busy():
        # Everything is stopped and persisted; a start-up thread is still in native code (an
        # import or a session load): leave without finalizing the interpreter under it.
        _log.warning("exit_with_background_work_running",
                     threads=[t.name for t in d._bg_threads if t.is_alive()])
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc
