"""The unit file passes systemd's own gates: `verify` and the offline security score."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNIT = Path(__file__).resolve().parent.parent / "systemd" / "edge-agent.service"
pytestmark = pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                                reason="systemd-analyze missing (scripts/setup.sh installs it)")


def _unit_with_real_binary(tmp_path: Path) -> Path:
    # verify checks that ExecStart exists: point it at this interpreter, change nothing else.
    text = UNIT.read_text()
    text = re.sub(r"^ExecStart=\S+", f"ExecStart={sys.executable} -m edge_agent.cli", text,
                  flags=re.M)
    out = tmp_path / "edge-agent.service"
    out.write_text(text)
    return out


def test_unit_has_the_required_settings() -> None:
    text = UNIT.read_text()
    for line in ("Type=notify", "NotifyAccess=main", "Restart=on-failure", "NoNewPrivileges=yes",
                 "ProtectSystem=strict", "PrivateTmp=yes", "ProtectHome=yes", "UMask=0077",
                 "CapabilityBoundingSet=\n", "SupplementaryGroups=dialout",
                 "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6",
                 "SystemCallFilter=@system-service", "DeviceAllow=char-ttyUSB rw",
                 "DeviceAllow=char-ttyACM rw", "StateDirectory=edge-agent"):
        assert line in text, line
    assert not re.search(r"^PrivateDevices=yes", text, re.M)  # it would hide the serial ports
    assert re.search(r"^WatchdogSec=\S+", text, re.M)
    assert re.search(r"^RestartSec=([1-9]\d*)", text, re.M)
    unit_section = text.split("[Service]")[0]
    assert "StartLimitIntervalSec=" in unit_section and "StartLimitBurst=" in unit_section


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    unit = _unit_with_real_binary(tmp_path)
    res = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True,
                         text=True, timeout=60)
    problems = [ln for ln in (res.stdout + res.stderr).splitlines()
                if "edge-agent.service" in ln]
    assert res.returncode == 0 and not problems, res.stdout + res.stderr


def test_security_exposure_is_ok(tmp_path: Path) -> None:
    unit = _unit_with_real_binary(tmp_path)
    res = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--threshold=20",
                          str(unit)], capture_output=True, text=True, timeout=60)
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", res.stdout)
    assert m, res.stdout + res.stderr
    assert float(m.group(1)) <= 2.0, res.stdout  # issue 16: stays at or below 2.0
