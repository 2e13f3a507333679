"""hil.soak's disk caps: what each state dir subfolder may hold, from configs/sim.toml and the
journals' own bounds (edge_agent/store/*.py). A journal may run one segment past its count
while the oldest is being deleted, so each journal's cap counts one segment more."""

from __future__ import annotations

import tomllib
from typing import Any

from edge_agent.store.decisions import SHADOW_MAX_SEGMENTS, SHADOW_SEGMENT_BYTES
from edge_agent.store.episodes import EPISODE_MAX_SEGMENTS, EPISODE_SEGMENT_BYTES
from edge_agent.store.labels import MAX_SEGMENTS as LABEL_MAX_SEGMENTS
from edge_agent.store.labels import SEGMENT_BYTES as LABEL_SEGMENT_BYTES
from hil.daemon_proc import SIM_CONFIG

REPORT_FILES = 3  # <id>.md, .png, .json (edge_agent/reports/sinks.py DiskSink)


def caps_from_config() -> dict[str, dict[str, Any]]:
    cfg = tomllib.loads(SIM_CONFIG.read_text())
    r, j, o = cfg["reports"], cfg["journal"], cfg["observe"]
    journal = (j["segment_bytes"] * (j["max_segments"] + 1)
               + EPISODE_SEGMENT_BYTES * (EPISODE_MAX_SEGMENTS + 1)
               + LABEL_SEGMENT_BYTES * (LABEL_MAX_SEGMENTS + 1)
               + SHADOW_SEGMENT_BYTES * (SHADOW_MAX_SEGMENTS + 1))
    return {
        "outbox": {"files": r["outbox_max"] * REPORT_FILES, "bytes": None},
        "reports": {"files": r["max_files"] * REPORT_FILES, "bytes": None},
        "journal": {"bytes": journal, "files": None},
        # finished recordings are capped; one being written (record_post_s) may be on top
        "recordings": {"bytes": o["record_max_bytes"], "files": o["record_max_files"] + 2},
    }
