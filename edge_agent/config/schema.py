"""The configuration schema: one frozen dataclass per section; each field carries its type, limits
(declared with config/spec.py's `opt`).

The loader (edge_agent.config.load) walks these dataclasses, so a key exists exactly when a field
declares it here, with its default and the checks that apply to it. configs/sim.toml documents
every key in a comment. Units are in the key's suffix (_s, _ms, _us, _hz, _m, _n, _bytes).
"""

# opt() returns a dataclasses.field (with the Spec in its metadata), not a shared default.
# ruff: noqa: RUF009
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edge_agent.config.spec import Secret, Spec, opt, secs

SCHEMA_VERSION = 1

ONNX_PROVIDERS = (
    "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider",
    "ROCMExecutionProvider", "MIGraphXExecutionProvider", "OpenVINOExecutionProvider",
    "DnnlExecutionProvider", "ACLExecutionProvider", "ArmNNExecutionProvider",
    "XnnpackExecutionProvider", "QNNExecutionProvider", "CoreMLExecutionProvider",
)


# --------------------------------------------------------------------------- sections


@dataclass(frozen=True, slots=True)
class DeviceSection:
    """[device]: who this robot is."""

    id: str = opt("str", "", required=True, pattern=r"[A-Za-z0-9_-]{1,64}",
                  hint="1-64 of A-Z a-z 0-9 _ - (it is also the MQTT client id and username)")


@dataclass(frozen=True, slots=True)
class MqttTlsSection:
    """[mqtt.tls]: TLS to the broker (CA, client certificate)."""

    enabled: bool = opt("bool", None, derived="true when ca_file or cert_file is set")
    ca_file: Path | None = opt("path", exists="file")
    cert_file: Path | None = opt("path", exists="file")
    key_file: Path | None = opt("path", exists="file")
    insecure: bool = opt("bool", False)


@dataclass(frozen=True, slots=True)
class MqttSection:
    """[mqtt]: the broker, credentials, topics, queues and reconnect backoff."""

    host: str = opt("str", "127.0.0.1", pattern=r"[A-Za-z0-9_.:\[\]-]+",
                    hint="a host name or an IP address, not a URL")
    port: int = opt("int", 1883, lo=1, hi=65535)
    username: str = opt("str", "", derived="device.id")
    password: Secret | None = opt("secret")  # the effective password, inline or from the file
    password_file: Path | None = opt("path", exists="file")
    tls: MqttTlsSection = opt("table", table=MqttTlsSection)
    topic_prefix: str = opt("str", "", derived="edge/<device.id>")
    legacy_topics: bool = opt("bool", True)  # also serve the deprecated cmd/task.start topics
    protocol: str = opt("str", "5", choices=("5", "3.1.1"))
    keepalive_s: int = opt("int", 10, lo=1, hi=65535)
    fleet_topic: str = opt("str", "edge/fleet/cmd/estop")
    max_queued: int = opt("int", 1000, lo=1, hi=1_000_000)
    reconnect_min_s: float = secs(0.5)
    reconnect_max_s: float = secs(30.0)
    dedup_window_s: float = opt("float", 3600.0, lo=0.0, lo_open=True, hi=30 * 86400.0)
    clock_skew_s: float = opt("float", 1.0, lo=0.0, hi=60.0,
                              hint="how far a publisher's clock may be from ours: a command's "
                                   "`ts` earlier than the latest stop + this is stale")
    telemetry_hz: float = opt("float", 10.0, lo=0.0, hi=100.0, hint="0 turns telemetry off")


@dataclass(frozen=True, slots=True)
class LinkSection:
    """[link]: the serial link to the drives and its guardian process."""

    port: str | None = opt("str", derived="required unless --sim (the rig's pty)")
    baudrate: int = opt("int", 1_000_000, lo=1200, hi=20_000_000)
    deadman_ms: int = opt("int", 50, lo=5, hi=1000)
    status_period_us: int = opt("int", 1000, lo=100, hi=100_000)
    fault_after: int = opt("int", 16, lo=1, hi=1000)
    reopen_min_s: float = opt("float", 0.05, lo=0.0, lo_open=True, hi=60.0)
    reopen_max_s: float = opt("float", 2.0, lo=0.0, lo_open=True, hi=600.0)
    guardian_priority: int = opt("int", 30, lo=0, hi=49,
                                 hint="SCHED_FIFO priority, 0 = off; keep it below the kernel's "
                                      "IRQ threads (50)")
    reader_priority: int = opt("int", 19, lo=0, hi=49,
                               hint="SCHED_FIFO priority of the daemon's link reader thread, "
                                    "0 = off; below link.guardian_priority")
    write_timeout_ms: float = opt("float", 5.0, lo=0.0, lo_open=True, hi=1000.0)
    hello_timeout_s: float = opt("float", 1.0, lo=0.0, lo_open=True, hi=60.0)


@dataclass(frozen=True, slots=True)
class RobotSection:
    """[robot]: which robot description to load."""

    description: Path = opt("path", Path(), required=True)


@dataclass(frozen=True, slots=True)
class ControlSection:
    """[control]: the fixed-rate control loop and the policy decision rate."""

    rate_hz: float = opt("float", 200.0, lo=10.0, hi=1000.0)
    decision_hz: float = opt("float", 20.0, lo=0.0, lo_open=True, hi=1000.0)
    spin_s: float = opt("float", 0.0002, lo=0.0, hi=0.005)
    no_spin: bool = opt("bool", False)
    output_at_deadline: bool = opt("bool", False)
    priority: int = opt("int", 20, lo=0, hi=49,
                        hint="SCHED_FIFO priority of the control thread, 0 = off; keep it below "
                             "link.guardian_priority (the e-stop path must win)")


@dataclass(frozen=True, slots=True)
class L1TimeoutsSection:
    """[executor.l1_timeouts_s]: L1 timeout (s) of one attempt, per state."""

    approach: float = secs(5.0)
    grasp: float = secs(2.0)
    lift: float = secs(3.0)
    transfer: float = secs(6.0)
    release: float = secs(2.0)
    retreat: float = secs(3.0)


@dataclass(frozen=True, slots=True)
class ExecutorSection:
    """[executor]: fault tolerance (L1/L2/L3), grasp, collision, reset, jog."""

    l1_timeouts_s: L1TimeoutsSection = opt("table", table=L1TimeoutsSection)
    max_attempts: int = opt("int", 3, lo=1, hi=10)
    l3_threshold: int = opt("int", 5, lo=1, hi=1000)
    tool_tolerance_m: float = opt("float", 0.002, lo=0.0, lo_open=True, hi=0.1)
    grip_force_n: float = opt("float", 10.0, lo=0.0, lo_open=True)
    grip_force_band_n: float = opt("float", 1.0, lo=0.0, lo_open=True)
    collision_current_factor: float = opt("float", 1.5, lo=1.0, lo_open=True, hi=10.0)
    reset_min_interval_s: float = opt("float", 1.0, lo=0.0, hi=60.0)
    jog_speed_scale: float = opt("float", 0.25, lo=0.0, lo_open=True, hi=1.0)
    diagnostic_capture_s: float = opt("float", 10.0, lo=0.0, lo_open=True, hi=600.0)
    regrasp_window_s: float = opt("float", 0.5, lo=0.0, hi=10.0,
                                  hint="hold after a lost part while the policy may propose a "
                                       "re-grasp; 0 = a lost part fails the task at once")
    max_regrasps: int = opt("int", 1, lo=0, hi=5)


@dataclass(frozen=True, slots=True)
class InferenceSection:
    """[inference]: policy backends (ONNX providers, Triton) and deadlines."""

    providers: tuple[str, ...] = opt("strlist", ("CPUExecutionProvider",), choices=ONNX_PROVIDERS)
    model: Path | None = opt("path", exists="file")
    cache_dir: Path = opt("path", Path(), derived="<state_dir>/models", exists="dir")
    triton_url: str | None = opt("str", pattern=r"[A-Za-z0-9_.\[\]:-]+:[0-9]{1,5}",
                                 hint="host:port of Triton's gRPC endpoint, no scheme")
    triton_model: str = opt("str", "policy")
    deadline_ms: float = opt("float", 20.0, lo=0.0, lo_open=True, hi=1000.0)
    intra_op_threads: int = opt("int", 1, lo=1, hi=64)
    model_wait_s: float = opt("float", 10.0, lo=0.0, hi=600.0)
    # model.update reads only regular files directly inside this directory (or the cache);
    # it must be owned by root and writable by no one else. Unset: only the cache.
    update_dir: Path | None = opt("path", exists="dir")
    max_model_bytes: int = opt("int", 256 << 20, lo=1 << 10, hi=4 << 30,
                               hint="model.update refuses a larger file before reading it")
    # Ed25519 public keys (`ed25519:<base64>`, from `edge-agent model keygen`): when set, only
    # models whose card a listed key signed are installed or loaded.
    trusted_keys: tuple[str, ...] = opt("strlist", ())
    # model.update installs only a model whose signed card holds a passing `edge-agent model
    # gate` record for its sha256 (docs/MODELS.md); needs trusted_keys.
    require_gate: bool = opt("bool", False)
    # The trial after model.update (docs/MODELS.md, daemon/model_trial.py): the new model is
    # on trial until `trial_tasks` judged tasks or `trial_s` seconds, whichever comes first;
    # a regression rolls it back at once and marks it bad.
    trial_tasks: int = opt("int", 20, lo=1, hi=10_000)
    trial_s: float = opt("float", 3600.0, lo=0.0, lo_open=True, hi=30 * 86400.0)
    trial_latency_ms: float = opt("float", 5.0, lo=0.0, lo_open=True, hi=1000.0,
                                  hint="the candidate's decision latency budget on trial")
    trial_alpha: float = opt("float", 0.05, lo=0.0, lo_open=True, hi=0.5)
    trial_margin: float = opt("float", 0.10, lo=0.0, hi=1.0,
                              hint="success-rate drop from the previous model's tolerated")
    # model.shadow: the shadow report is filed after this many compared decisions (and again
    # when the shadow is stopped); 0: only when stopped.
    shadow_report_after: int = opt("int", 2000, lo=0, hi=10_000_000)
    # SCHED_FIFO of the shadow's worker thread (0: SCHED_OTHER); below control.priority: a
    # worker preempted while it holds the GIL delays the control thread (inference/shadow.py)
    shadow_priority: int = opt("int", 1, lo=0, hi=98)


def _probe_period() -> Any:
    return opt("float", None, lo=0.1, hi=3600.0, derived="health.period_s")


@dataclass(frozen=True, slots=True)
class HealthPeriodsSection:
    """[health.periods]: one probe's period, by its name's part before `:` (unset: period_s)."""

    broker: float | None = _probe_period()
    link: float | None = _probe_period()
    loop: float | None = _probe_period()
    store: float | None = _probe_period()
    startup: float | None = _probe_period()
    gpu: float | None = _probe_period()
    triton: float | None = _probe_period()
    policy: float | None = _probe_period()
    sensor: float | None = _probe_period()


@dataclass(frozen=True, slots=True)
class HealthSection:
    """[health]: probe periods, the probe budget, N-strike degrade / M-success recover."""

    period_s: float = opt("float", 10.0, lo=0.1, hi=3600.0)
    probe_budget_s: float = opt("float", 0.5, lo=0.01, hi=60.0,
                                hint="a probe not answering within it is STALE for that run")
    fail_after: int = opt("int", 3, lo=1, hi=100)
    recover_after: int = opt("int", 3, lo=1, hi=100)
    periods: HealthPeriodsSection = opt("table", table=HealthPeriodsSection)


@dataclass(frozen=True, slots=True)
class ReportsSection:
    """[reports]: Markdown fault reports on disk and the webhook."""

    dir: Path = opt("path", Path(), derived="<state_dir>/reports", exists="dir")
    webhook_url: Secret | None = opt("secret", pattern=r"https?://\S+",
                                     hint="an http:// or https:// URL")
    webhook_url_file: Path | None = opt("path", exists="file")
    webhook_format: str = opt("str", "wecom", choices=("wecom", "json"))
    webhook_rate_per_min: float = opt("float", 20.0, lo=0.1, hi=600.0,
                                      hint="WeCom allows 20 messages a minute per robot")
    webhook_timeout_s: float = opt("float", 10.0, lo=0.1, hi=120.0)
    merge_window_s: float = opt("float", 60.0, lo=0.0, hi=3600.0)
    retry_min_s: float = opt("float", 1.0, lo=0.01, hi=3600.0)
    retry_max_s: float = opt("float", 300.0, lo=0.01, hi=86_400.0)
    max_files: int = opt("int", 200, lo=1, hi=100_000)
    outbox_max: int = opt("int", 200, lo=1, hi=100_000)
    plot: bool = opt("bool", True)
    table_rows: int = opt("int", 20, lo=2, hi=1000)


@dataclass(frozen=True, slots=True)
class JournalSection:
    """[journal]: the append-only decision journal, the tasks' episode records and labels."""

    enabled: bool = opt("bool", True)
    segment_bytes: int = opt("int", 4 << 20, lo=64 << 10, hi=1 << 30)
    max_segments: int = opt("int", 16, lo=2, hi=10_000)
    # the drift report (daemon/drift.py): filed every period through the report outbox, this
    # period's action distribution per executor state against the last one's (KL, nats)
    drift_period_s: float = opt("float", 604800.0, lo=1.0, hi=366 * 86400.0)
    drift_threshold: float = opt("float", 0.15, lo=0.0, lo_open=True, hi=100.0)


@dataclass(frozen=True, slots=True)
class ObserveSection:
    """[observe]: the flight recorder (MCAP files in <state_dir>/recordings), the Prometheus
    metrics and the live Foxglove view (each off unless its port is set); docs/OBSERVE.md."""

    record: bool = opt("bool", True)
    record_pre_s: float = opt("float", 10.0, lo=0.0, hi=600.0)
    record_post_s: float = opt("float", 5.0, lo=0.0, hi=600.0)
    record_ring_bytes: int = opt("int", 64 << 20, lo=1 << 20, hi=4 << 30)
    record_max_files: int = opt("int", 50, lo=1, hi=100_000)
    record_max_bytes: int = opt("int", 1 << 30, lo=1 << 20, hi=1 << 40)
    record_max_s: float = opt("float", 600.0, lo=1.0, hi=86_400.0)
    metrics_port: int | None = opt("int", lo=1, hi=65535)
    metrics_host: str = opt("str", "127.0.0.1", pattern=r"[A-Za-z0-9_.:\[\]-]+",
                            hint="an address to bind: 127.0.0.1 (this host only) or 0.0.0.0")
    foxglove_port: int | None = opt("int", lo=1, hi=65535)
    foxglove_host: str = opt("str", "127.0.0.1", pattern=r"[A-Za-z0-9_.:\[\]-]+",
                             hint="an address to bind: 127.0.0.1 (this host only) or 0.0.0.0")
    foxglove_rate_hz: float = opt("float", 50.0, lo=0.1, hi=1000.0, hint="messages/s per channel")


@dataclass(frozen=True, slots=True)
class StoreSection:
    """[store]: the state directory's free space: the storage_low mode and the snapshot reserve."""

    # under this much free space the store probe strikes toward storage_low (docs/HEALTH.md)
    min_free_bytes: int = opt("int", 64 << 20, lo=1 << 20, hi=1 << 40)
    # preallocated for the stop model's snapshots, in 256 KiB chunks (rounded down)
    reserve_bytes: int = opt("int", 1 << 20, lo=256 << 10, hi=1 << 30,
                             hint="at least one 256 KiB chunk")


@dataclass(frozen=True, slots=True)
class LogSection:
    """[log]: level and output format."""

    level: str = opt("str", "info", choices=("debug", "info", "warning", "error"))
    format: str = opt("str", "auto", choices=("auto", "json", "console"))


@dataclass(frozen=True, slots=True)
class DebugSection:
    """[debug]: switches never set on a production robot."""

    failure_injection: bool = opt("bool", False)


@dataclass(frozen=True, slots=True)
class SimSection:
    """[sim]: the simulated robot (read only with --sim)."""

    robot_seed: int = opt("int", 0, lo=0, hi=2**32 - 1)
    rig_config: Path | None = opt("path", exists="file")
    # SCHED_FIFO priority for the rig process (0 = normal). Real drive firmware is not starved
    # by the host's load; benchmarks give the rig a priority above the guardian's to match.
    rig_priority: int = opt("int", 0, lo=0, hi=99)
    # A simulated GPU at the ONNX session seam (inference/sim_gpu.py): with CUDAExecutionProvider
    # in inference.providers, `failure.inject gpu fail` and cpu_inference run without a GPU.
    gpu: bool = opt("bool", False)


SECTIONS: dict[str, type] = {
    "device": DeviceSection, "mqtt": MqttSection, "link": LinkSection, "robot": RobotSection,
    "control": ControlSection, "executor": ExecutorSection, "inference": InferenceSection,
    "health": HealthSection, "reports": ReportsSection, "journal": JournalSection,
    "observe": ObserveSection, "store": StoreSection, "log": LogSection, "debug": DebugSection,
    "sim": SimSection,
}
# Keys outside any [section]; they must come before the first [section] in the file.
TOP_LEVEL: dict[str, Spec] = {
    "schema_version": Spec("int", required=True),
    "state_dir": Spec("path", required=True, exists="dir"),
}
