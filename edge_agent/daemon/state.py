"""The daemon's retained `state` (mode, task, stop, link): kept on MQTT, the start of `status`."""

from __future__ import annotations

from typing import Any

from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.executor.executor import Executor
from edge_agent.executor.latch import StopLatch


def state_fields(executor: Executor, latch: StopLatch, mirror: LinkMirror,
                 policy_in_use: str, degraded: list[str]) -> dict[str, Any]:
    """`state` now (docs/asyncapi.yaml StateFields); `degraded`: the health monitor's modes."""
    st = latch.state
    out: dict[str, Any] = {"mode": executor.mode, "state": executor.state.value,
                           "degraded": degraded, "homed": bool(mirror.last_status is not None),
                           "link_up": mirror.link_up, "policy": policy_in_use}
    task = executor.task
    if task is not None:
        out["task"] = task
    if st.kind is not None:
        out["stop"] = {"kind": st.kind.value,
                       "cause": st.first_cause.value if st.first_cause else None,
                       "causes": [c.value for c in st.causes],
                       "hardware_input": st.hardware_input}
    return out
