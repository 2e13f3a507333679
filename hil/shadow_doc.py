"""The shadow report for docs/REPORTS.md: a candidate shadowing the trained policy through tasks
(called by hil/make_reports_doc.py; `python -m hil.shadow_doc` adds only this report's section
to an existing docs/REPORTS.md, as the full generator would write it).

A daemon with the trained policy starts `model.shadow` with an untrained candidate
(models/make_test_policy.py, seed 7) from `inference.update_dir`, runs tasks until the report
after `inference.shadow_report_after` (200) decisions is filed, then stops the shadow (its
second report). The section shows the first.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import tempfile
import time
from pathlib import Path

from hil.make_reports_doc import CHAT_TOKEN, REPO, Daemon, report_part, reports_of, wait
from hil.webhook_receiver import Receiver

REPORT_AFTER = 200


def run_shadow(state_dir: Path, sets: list[str]) -> None:
    from inference_models import make_policy  # tests/ is on sys.path (make_reports_doc)

    drop = state_dir.parent / "shadow-drop"
    drop.mkdir(mode=0o755, exist_ok=True)
    model = make_policy(drop, "candidate", seed=7, version="candidate-7")
    sha = hashlib.sha256(model.read_bytes()).hexdigest()
    d = Daemon(state_dir, [*sets, f"inference.update_dir={drop}",
                           f"inference.shadow_report_after={REPORT_AFTER}"]).start()
    try:
        wait(lambda: bool((d.status().get("inference") or {}).get("model")), 60, "the model")
        before = len(shadow_reports(state_dir))
        r = d.cmd_("model.shadow", uri=str(model), sha256=sha)
        if not r.get("ok"):
            raise SystemExit(f"make_reports_doc: model.shadow refused: {r}")
        end = time.monotonic() + 300
        while len(shadow_reports(state_dir)) < before + 1:
            if time.monotonic() > end:
                raise SystemExit("make_reports_doc: no shadow report after 300 s of tasks")
            mode = d.status().get("mode")
            if mode == "idle":
                d.cmd_("task.start", task="pick_place")
            elif mode not in ("running", None):
                d.reset()
            wait(lambda: d.status().get("mode") != "running", 120, "a task's end")
        d.cmd_("model.shadow", stop=True)
        wait(lambda: len(shadow_reports(state_dir)) >= before + 2, 60, "the report at stop")
    finally:
        d.stop()


def shadow_reports(state_dir: Path) -> list[str]:
    return [rid for rid, r in reports_of(state_dir).items() if r["kind"] == "shadow"]


def main() -> int:
    """Append this report's section to docs/REPORTS.md (a doc generated before shadows)."""
    out = REPO / "docs"
    base = Path(tempfile.mkdtemp(prefix="shadow-doc-"))
    state_dir = base / "state"
    state_dir.mkdir(parents=True)
    chat = Receiver().start()
    try:
        run_shadow(state_dir, [f'reports.webhook_url="{chat.url(CHAT_TOKEN)}"'])
        rid = shadow_reports(state_dir)[0]
        rep = {**reports_of(state_dir)[rid], "id": rid}
        wait(lambda: rid in chat.unique(), 60, "the report in the chat")
        name, text = report_part(state_dir, out / "reports", rep["fault"], rep, chat.unique())
    finally:
        chat.stop()
    doc = out / "REPORTS.md"
    doc.write_text(doc.read_text(encoding="utf-8") + text, encoding="utf-8")
    print(f"appended {name} to {doc}")
    shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
