"""The composition root: the minimal start-up path, the running daemon, and a clean shutdown.

exec → config → spawn the link guardian (cli: its own start-up runs beside our imports) →
logging → restore snapshot (latches!) → adopt the guardian, latch it if the snapshot was latched
→ control thread (holding) → MQTT connect started → the guardian's first link-up (bounded) →
READY. Heavy work (the policy model: onnxruntime, its sessions) runs after READY in the
background; `--eager` does it before READY for comparison. The `ready` event's `phases_ms`
says when each step ended (ms since exec).

Each part is built here with only what it uses (control.py, stops.py, handlers.py, comms_hub.py,
policy_loader.py, reporting.py, startup_work.py, health_sources.py, episodes.py) and registered
with the supervisor (`threads`) as it starts: `stop()` stops them in `STOP_ORDER`.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edge_agent.clock import Clock, MonotonicClock
from edge_agent.commands import CommandAPI, Freshness, JsonFileDedupStore
from edge_agent.config import Config
from edge_agent.daemon import persist
from edge_agent.daemon.comms_hub import CommsHub
from edge_agent.daemon.control import ControlPath, ControlSettings, executor_config
from edge_agent.daemon.episodes import Episodes
from edge_agent.daemon.handlers import CommandHandlers
from edge_agent.daemon.heap import HeapKeeper
from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.daemon.notify import SystemdNotifier
from edge_agent.daemon.observers import Observers, start_observers
from edge_agent.daemon.policy_loader import PolicyLoader
from edge_agent.daemon.procstart import mark, ms_since_start, phases, process_start_monotonic
from edge_agent.daemon.recording import DaemonRecording
from edge_agent.daemon.reporting import DaemonReports
from edge_agent.daemon.signals import route_signals
from edge_agent.daemon.simrig import SimRig, start_sim_rig
from edge_agent.daemon.startup_work import StartupWork
from edge_agent.daemon.state import daemon_state, daemon_status
from edge_agent.daemon.stops import StopPath
from edge_agent.daemon.supervisor import Supervisor
from edge_agent.errors import EdgeAgentError
from edge_agent.executor.collector import CollectionStats
from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import StopLatch
from edge_agent.link.guardian_client import GuardianClient
from edge_agent.link.guardian_spawn import Spawned, spec_from_config
from edge_agent.log import get_logger
from edge_agent.sensors.hub import SensorHub
from edge_agent.store.writer import StoreWriter
from edge_agent.vocab import EventType, StopCause

if TYPE_CHECKING:
    from edge_agent.contract.payloads import TelemetryFields
    from edge_agent.contract.status import StateFields, StatusResult
    from edge_agent.health.monitor import HealthMonitor

_log = get_logger(__name__)

# Shutdown, in this order: the observers (metrics, live view), the health monitor (a stop is no
# degradation), the command stream
# (the guardian holds on its own deadman rules), the model and journal, the guardian (HOLD first),
# the report outbox, the flight recorder (open files finished), the comms (events until here
# reach MQTT), the last snapshot, the
# simulated robot, then start-up work still running (bounded: it may be inside a native import).
# The signal router lives on.
STOP_ORDER = ("observe", "health", "control_loop", "inference", "guardian", "reports",
              "recorder", "comms", "mqtt-start", "store", "sim_rig", "startup-load", "calibration",
              "signals")


class Daemon:
    """Owns every moving part; `start()` follows the minimal path, `stop()` is idempotent."""

    def __init__(self, cfg: Config, *, sim: bool = False, eager: bool = False,
                 prespawned: Spawned | None = None,
                 clock: Clock | None = None) -> None:
        self.cfg = cfg
        # The time the executor, the latch and the link mirror see (a virtual one in
        # hil/daemon_lockstep.py); real waits on other threads keep time.monotonic().
        self.clock: Clock = clock or MonotonicClock()
        self._prespawned = prespawned  # a guardian the CLI started early (adopted in start())
        self.sim = sim
        self.eager = eager
        self.boot_id = uuid.uuid4().hex
        self.started_mono = process_start_monotonic()
        self.state_dir = Path(cfg.state_dir)
        self.threads = Supervisor(STOP_ORDER)
        self.latch = StopLatch()
        self.hub = SensorHub(cfg.robot, stale_periods=max(
            3.0, 3.0 * cfg.link.status_period_us / 1000.0))
        self.notifier = SystemdNotifier()
        self.comms = CommsHub(cfg, self.boot_id, on_estop=self.estop, state=self.state,
                              telemetry=self.telemetry, spawn=self.threads.spawn)
        self.mirror = LinkMirror(self.hub, self.latch, self.comms.event, clock=self.clock.now)
        self.snapshots = persist.snapshot_store(self.state_dir, cfg.store.reserve_bytes)
        # stop epochs: nothing sent before the latest stop or reset moves the robot after it
        self.freshness = Freshness(cfg.mqtt.clock_skew_s)
        persist.prepare_state_dir(self.state_dir)  # the dedup window is persisted there
        self.api = CommandAPI(self.mode, dedup_store=JsonFileDedupStore(
            self.state_dir / "dedup.json"), dedup_window_s=cfg.mqtt.dedup_window_s,
            reset_min_interval_s=cfg.executor.reset_min_interval_s,
            failure_injection=cfg.debug.failure_injection, clock=self.clock,
            freshness=self.freshness)
        # the decision journal (storage_low sheds it), each task's episode record, journal.label
        # (daemon/episodes.py)
        self.episodes = Episodes(cfg, self.comms, self.boot_id)
        self.decisions = self.episodes.decisions
        self.executor = Executor(cfg.robot, self.latch, config=executor_config(cfg),
                                 decision_sink=self._journal_decision)
        self.control = ControlPath(ControlSettings.from_config(cfg), self.executor,
                                   self.latch, self.hub, self.mirror, self.clock)
        self.stops = StopPath(self.latch, self.control, self.clock, self.freshness,
                              save_snapshot=self.save_snapshot, publish=self.comms.event,
                              state_changed=self.comms.state_changed)
        self.writer = StoreWriter(on_error=self.stops.on_store_error)
        self.policy = PolicyLoader(cfg, self.executor, self.control.executor_lock,
                                   self.decisions, self.control.events, self.comms.event,
                                   sim_gpu=sim and cfg.sim.gpu)
        self.episodes.attach(self.control, self.policy.status, self.api)
        # stop and L3 repair reports (daemon/reporting.py)
        self.reports = DaemonReports(cfg, boot_id=self.boot_id, control=self.control,
                                     decisions=self.decisions, model_status=self.policy.status,
                                     publish_event=self.comms.event,
                                     publish_report=self.comms.publish_report)
        self.recording = DaemonRecording(cfg, self.api)  # the flight recorder (docs/OBSERVE.md)
        self.observers: Observers | None = None  # metrics and live view, after READY
        self.reports.outbox.link = self.recording.link  # every report names its MCAP file
        self.policy.trial.attach(self.reports.file_report, self.comms.add_listener)
        self.policy.shadow.attach_reports(self.reports.outbox.submit, self.reports.origin)
        self.rig: SimRig | None = None
        self.startup_ms: float | None = None
        self.link_up_ms: float | None = None  # since exec: the guardian's first link-up state
        self._stopped = False
        self.gc_stats = CollectionStats()  # installed in start(): the real daemon's only
        self.heap = HeapKeeper(self.gc_stats)  # full collections at safe points only
        self.startup = StartupWork(self.policy, self.decisions, self.hub, cfg.robot,
                                   self.heap, self.mirror, send=self.control.send_or_raise,
                                   publish=self.comms.event, stopping=self.threads.stopping,
                                   on_policy=self._attach_inference_probes)
        self.health: HealthMonitor | None = None  # built after READY (health/wiring.py)

    def _journal_decision(self, decision: dict[str, Any]) -> None:
        if self.decisions is not None and not self.policy.router_journals:
            decision["backend"] = "rule"  # the executor's own rule-based expert decided
            self.decisions.record(decision)  # never blocks, never raises

    def mode(self) -> str:
        return self.executor.mode

    def estop(self, cause: StopCause) -> None:
        """Any e-stop source (daemon/stops.py)."""
        self.stops.estop(cause)

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
            self.threads.adopt("sim_rig", self.rig.stop)
            port = self.rig.ptys[0]
        if not port:
            raise EdgeAgentError("link.port is not set (give a tty path or run with --sim)")
        guardian = self._guardian_for(port)
        self.control.guardian = guardian
        self.threads.adopt("guardian", self.control.stop_guardian, lambda: guardian.alive)
        early, self._prespawned = self._prespawned, None
        guardian.start(prespawned=early)
        mark("guardian_spawn")
        self.control.latch_new_guardian()
        loop = self.control.start_loop()
        self.threads.adopt("control_loop", self._stop_control_loop, lambda: loop.alive)
        mark("control_loop")
        self.register_handlers()
        self.threads.adopt("comms", self.comms.stop)
        self.comms.start(self.api)
        mark("comms")
        self.threads.adopt("inference", self._stop_inference)
        if self.eager:
            self.startup.load()
        # Bounded: the guardian's first G_STATE with the link up says the tty opened and the
        # firmware answered HELLO (the CLI spawned the guardian beside our imports, so this
        # rarely waits). A missing device does not block READY for long: a protective stop
        # with a link_fault event, not a restart loop.
        self._wait_first_link(port)
        mark("link_up")
        self._ready(restored)
        self.threads.adopt("reports", self.reports.stop)
        self.reports.start()
        from edge_agent.daemon.health_sources import daemon_health  # after READY: ~5 ms

        self.health = daemon_health(cfg, comms=self.comms, reports=self.reports,
                                    mirror=self.mirror, control=self.control,
                                    gc_stats=self.gc_stats, decisions=self.decisions,
                                    background=self.startup.results, hub=self.hub,
                                    reserve=self.snapshots.reserve)
        if self.eager:
            self._attach_inference_probes()
        self.threads.adopt("health", self.health.stop)
        self.health.start()
        self.threads.adopt("recorder", self.recording.stop)
        self.recording.start()  # imports mcap: after READY
        self.observers = start_observers(self)  # daemon/observers.py
        self.threads.adopt("observe", self.observers.stop)
        if not self.eager:
            self.threads.spawn("startup-load", self.startup.load)
        self.threads.spawn("calibration", self.startup.calibrate)

    def _attach_inference_probes(self) -> None:
        """Once the policy stack exists (after READY, or before it with --eager)."""
        if self.health is not None and self.policy.stack is not None:
            from edge_agent.health.wiring import attach_inference_probes

            attach_inference_probes(self.health, self.policy.stack.router, self.cfg)

    def _guardian_for(self, port: str) -> GuardianClient:
        spec = spec_from_config(self.cfg, port)
        return GuardianClient(
            spec.port, spec.robot_path, deadman_s=spec.deadman_s,
            on_frame=self.mirror.on_frame, on_guardian_down=self.stops.on_guardian_down,
            on_guardian_up=self.stops.on_guardian_up, priority=spec.priority,
            extra_args=spec.extra_args, reader_priority=self.cfg.link.reader_priority)

    def register_handlers(self) -> None:
        """The command handlers on the command API (the rig, if any, exists by now)."""
        CommandHandlers(self.control, self.mirror, self.policy, status=self.status,
                        estop=self.estop, persist_latch=self._persist_latch,
                        state_changed=self.comms.state_changed, rig=self.rig,
                        model_wait_s=self.cfg.inference.model_wait_s).register(self.api)

    def restore_state(self) -> persist.Restored:
        """Snapshot → latch and executor (tripped on an unclean restart), the snapshot
        writer. The first step of start(); the lock-step host (hil/daemon_lockstep.py) runs it
        too, then wires its own guardian and clock."""
        restored = persist.restore(self.state_dir, self.snapshots)
        now = self.clock.now()
        self.stops.listen()
        self.latch.restore(restored.data.get("latch", {}), now)
        # after the stop path's listener (the stop frame goes first) and the restored causes
        # (reported in the boot that latched them): this boot's stops, an unclean restart too
        self.reports.subscribe()
        if restored.unclean:
            self.latch.trip(StopCause.UNCLEAN_RESTART, now)
        self.executor.restore(restored.data.get("executor", {}), now, clean=not restored.unclean)
        self.threads.adopt("store", self._stop_store)
        self.writer.start()
        return restored

    def _wait_first_link(self, port: str) -> None:
        waited = self.cfg.link.hello_timeout_s
        if self.mirror.wait_gstate(0.0, timeout=waited, pred=lambda g: g.link_up) is None:
            self.latch.set_condition(StopCause.LINK_FAULT, True, self.clock.now())
            self.comms.event({"type": EventType.LINK_FAULT, "cause": "no_device", "port": port,
                              "waited_s": waited})
        else:
            self.link_up_ms = round(ms_since_start(self.mirror.gstate_at), 1)

    def _ready(self, restored: persist.Restored) -> None:
        self.startup_ms = round(ms_since_start(), 1)
        self.notifier.ready(f"ready in {self.startup_ms} ms, mode {self.mode()}")
        _log.info("ready", startup_ms=self.startup_ms, boot_id=self.boot_id, mode=self.mode(),
                  eager=self.eager, sim=self.sim, link_up=self.mirror.link_up,
                  unclean_restart=restored.unclean, snapshot_generation=restored.generation,
                  corrupt_files=restored.corrupt_files, config_hash=self.cfg.hash,
                  phases_ms=phases())
        self.comms.event({"type": EventType.READY, "startup_ms": self.startup_ms,
                          "eager": self.eager, "unclean_restart": restored.unclean})
        if restored.corrupt_files:
            self.comms.event({"type": EventType.SNAPSHOT_CORRUPT,
                              "files": restored.corrupt_files,
                              "used_previous": restored.used_previous})
        self.heap.ready()  # start-up garbage frozen; automatic full collections off

    def save_snapshot(self) -> bool:
        data = {"latch": self.latch.to_dict(), "executor": self.control.snapshot(),
                "boot_id": self.boot_id, "saved_wall": time.time()}
        return self.writer.submit_snapshot(self.snapshots, data)

    def _persist_latch(self) -> bool:
        self.save_snapshot()
        return self.writer.flush(timeout=1.0)

    # -- what it tells (daemon/state.py builds both from the parts) -------------------------
    def state(self) -> StateFields:
        """The retained `state` (MQTT) and the first fields of `status`."""
        return daemon_state(self)

    def status(self) -> StatusResult:
        return daemon_status(self)

    def telemetry(self) -> TelemetryFields:
        return self.control.telemetry(self.mirror.last_status, self.mirror.frames)

    # -- running ---------------------------------------------------------------------------
    def run_forever(self) -> int:
        stop_requested = route_signals(lambda: self.estop(StopCause.ESTOP_SIGNAL),
                                       spawn=partial(self.threads.spawn, join=False))
        try:
            self.start()
        except EdgeAgentError as exc:
            _log.error("startup_failed", error=str(exc))
            self.stop()
            return 1
        wd = SystemdNotifier.watchdog_interval_s()
        period = min(0.05, wd / 2) if wd else 0.05
        while not stop_requested.wait(period):
            self.housekeeping(time.monotonic())
        self.stop()
        return 0

    def healthy(self, now: float) -> bool:
        """Watchdog condition: the control loop and the link reader are alive and on time."""
        loop = self.control.loop
        return loop is not None and loop.on_time(now) and self.mirror.reader_on_time(now)

    def housekeeping(self, now: float) -> None:
        """The main thread's period: watchdog, heap, executor events out, state, telemetry."""
        if self.healthy(now):
            self.notifier.watchdog()
        self.heap.tick(now, self.executor.mode)
        published = self.control.publish_events(self.comms.event)
        if published is not None:
            self.comms.state_changed()
            if published:
                self.save_snapshot()
        self.comms.tick(now)

    # -- stopping (in STOP_ORDER, by the supervisor) -------------------------------------------
    def _stop_control_loop(self) -> None:
        if self.control.loop is not None:
            self.control.loop.stop()
        self.gc_stats.uninstall()
        self.heap.stop()

    def _stop_inference(self) -> None:
        self.policy.stop()
        if self.decisions is not None:
            self.decisions.stop()

    def _stop_store(self) -> None:
        self.save_snapshot()
        self.writer.stop()

    def stop(self) -> None:
        """Controlled stop: hold, tell everyone, persist, exit. Idempotent, never raises."""
        if self._stopped:
            return
        self._stopped = True
        self.stops.closing = True
        self.notifier.stopping()
        if self._prespawned is not None:  # start-up failed before adopting it
            self._prespawned.abandon()
            self._prespawned = None
        _log.info("stopping")
        self.startup.loaded.set()  # a calibration still waiting for its turn gives up
        self.control.watch.close()  # the command stream stops now: not a deadman stop
        t0 = time.monotonic()
        # Start-up work may still be inside a native import or session creation (onnxruntime,
        # scipy): joined for at most 1 s in all (`run` then leaves without finalizing).
        took = self.threads.stop(join_s=1.0)
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
    lingering = d.threads.lingering()
    if lingering:
        # Everything is stopped and persisted; a start-up thread is still in native code (an
        # import or a session load) that no one can interrupt: finalizing the interpreter
        # under it aborts the process, so leave without finalizing.
        _log.warning("exit_with_background_work_running", threads=lingering)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    return rc
