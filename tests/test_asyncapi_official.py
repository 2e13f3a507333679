"""docs/asyncapi.yaml passes the official AsyncAPI parser (@asyncapi/parser 3, run with node).

scripts/setup.sh installs node (apt) and the parser (npm, pinned by tests/asyncapi's lockfile);
our own schema checks in test_asyncapi.py are not enough: tooling reads the document with this.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CHECKER = REPO / "tests" / "asyncapi"


def test_the_official_parser_accepts_the_document() -> None:
    node = shutil.which("node")
    assert node, "node is missing: run scripts/setup.sh (it installs nodejs and the parser)"
    assert (CHECKER / "node_modules" / "@asyncapi" / "parser").is_dir(), (
        "the parser is missing: run scripts/setup.sh (npm ci in tests/asyncapi)")
    proc = subprocess.run([node, str(CHECKER / "check.mjs"), str(REPO / "docs" / "asyncapi.yaml")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "errors: 0," in proc.stdout and "parsed: true" in proc.stdout, proc.stdout


def test_the_checker_rejects_an_invalid_document(tmp_path: Path) -> None:
    """The check can fail: an empty enum (what DegradationMode once had) is an error."""
    doc = (REPO / "docs" / "asyncapi.yaml").read_text(encoding="utf-8")
    bad = tmp_path / "bad.yaml"
    # the DegradationMode enum, whatever modes it lists today
    found = re.search(r"enum: \[cpu_inference,[^\]]*\]", doc)
    assert found is not None
    bad.write_text(doc.replace(found.group(0), "enum: []", 1), encoding="utf-8")
    assert bad.read_text(encoding="utf-8") != doc
    proc = subprocess.run([shutil.which("node") or "node", str(CHECKER / "check.mjs"), str(bad)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "must not have fewer than 1 items" in proc.stdout
