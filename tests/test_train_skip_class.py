"""models/train_policy.py --skip-class: a weaker parent on purpose (docs/FLYWHEEL.md).

Left-out classes get no demonstration; every other class keeps the seeds and severities it has
without the option (so a weaker parent differs from the shipped recipe only where it says);
an unknown class label is a usage error naming the classes.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "models"))

import train_policy as tp  # noqa: E402


def test_skipped_classes_get_no_episodes_and_the_others_keep_their_seeds() -> None:
    full = tp.demonstration_jobs(0, 3)
    skip = ("gripper:slip", "gripper:slip transient")
    weak = tp.demonstration_jobs(0, 3, skip)
    faults = {fc.label: fc for fc in tp.FAULT_CLASSES}
    left_out = {(faults[s].fault, faults[s].transient) for s in skip}
    assert len(weak) == len(full) - 3 * len(skip)
    assert [j for j in full if (j.fault, j.transient) not in left_out] == weak
    assert not any((j.fault, j.transient) in left_out for j in weak)


def test_an_unknown_class_is_a_usage_error_naming_the_classes() -> None:
    res = subprocess.run([sys.executable, "models/train_policy.py", "--skip-class", "gripper:slp",
                          "--out", "/nonexistent/x.onnx"], cwd=REPO, capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 2, res
    assert "no fault class ['gripper:slp']" in res.stderr and "gripper:slip transient" in res.stderr
