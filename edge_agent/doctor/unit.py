"""Doctor check of the systemd unit: what it grants the service that `doctor` itself may lack.

`sudo -u edge-agent edge-agent doctor` runs without the unit's LimitRTPRIO= and
SupplementaryGroups=; this reads them from the installed unit and its drop-ins (or the file
given with --unit, e.g. systemd/edge-agent.service before installing it).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.doctor import Finding, error, ok, warn
from edge_agent.doctor.host import group_name

if TYPE_CHECKING:
    from edge_agent.config import Config


UNIT_PATHS = ("/etc/systemd/system/edge-agent.service",
              "/usr/lib/systemd/system/edge-agent.service",
              "/lib/systemd/system/edge-agent.service")


def check_unit(cfg: Config, unit: str | None) -> list[Finding]:
    """What the unit grants the service: LimitRTPRIO (or CAP_SYS_NICE) for the priorities the
    config asks for, and the tty group. `unit` None: the installed one, if any."""
    paths = [Path(unit)] if unit else [Path(p) for p in UNIT_PATHS if Path(p).exists()]
    if not paths:
        return [ok("unit", "no edge-agent.service installed: checked this process only")]
    path = paths[0]
    try:
        keys = _unit_keys(path)
    except OSError as exc:
        return [error("unit", f"{path}: {exc.strerror}", "check the path")]
    want = max(cfg.link.guardian_priority, cfg.control.priority, cfg.link.reader_priority)
    out: list[Finding] = []
    rtprio = keys.get("LimitRTPRIO", [""])[-1]
    caps = " ".join(keys.get("AmbientCapabilities", []))
    granted = rtprio == "infinity" or (rtprio.isdigit() and int(rtprio) >= want)
    if want == 0 or granted or "CAP_SYS_NICE" in caps:
        nice = ", CAP_SYS_NICE" if "CAP_SYS_NICE" in caps else ""
        out.append(ok("unit", f"{path.name}: SCHED_FIFO {want} granted (LimitRTPRIO="
                              f"{rtprio or 'unset'}{nice})"))
    else:
        out.append(warn("unit", f"{path}: LimitRTPRIO={rtprio or 'unset'} is below the SCHED_FIFO "
                                f"{want} the config asks for: the service runs SCHED_OTHER",
                        f"set LimitRTPRIO={want} in [Service] (as systemd/edge-agent.service "
                        "does), then `systemctl daemon-reload` and restart"))
    groups = " ".join(keys.get("SupplementaryGroups", [])).split()
    port = cfg.link.port
    if port and "://" not in port:
        with contextlib.suppress(OSError):
            group = group_name(os.stat(port).st_gid)
            if group not in groups and group != "root":
                out.append(warn("unit", f"{port} belongs to group {group}; the unit's "
                                        f"SupplementaryGroups= gives {' '.join(groups) or 'none'}",
                                f"add a drop-in: [Service] SupplementaryGroups={group}"))
    return out


def _unit_keys(path: Path) -> dict[str, list[str]]:
    """[Service] settings of the unit and its drop-ins (later files win; empty resets a list)."""
    files = [path, *sorted(Path(f"{path}.d").glob("*.conf"))]
    keys: dict[str, list[str]] = {}
    for f in files:
        section = ""
        for raw in f.read_text().splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line
            elif section == "[Service]" and "=" in line and not line.startswith(("#", ";")):
                k, v = (x.strip() for x in line.split("=", 1))
                keys[k] = [] if v == "" else [*keys.get(k, []), v]
    return keys
