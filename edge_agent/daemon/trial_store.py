"""The model trial's files in the state dir: the trial record and the list of bad models.

    <state_dir>/model_trial.json   the last trial: its state, the candidate and the model before
                                   it, the rules, the baseline, the evidence so far, the verdict
    <state_dir>/model_bad.json     {"v": 1, "bad": [{"sha256", "name", "version", "wall",
                                   "reasons"}]}: models a trial rolled back (newest last)

Both written atomically (store/atomic.py: tmp + fsync + rename + fsync of the directory) and read
capped: a crash leaves the old record or the new one. A trial's states:

    pending      written before `model.update` installs the candidate (it has not decided yet)
    on_trial     installed; watched (the record is saved before the candidate's first decision)
    rolling_back the verdict is a regression: the candidate is marked bad, the pointer not yet
                 swapped back (a start-up finds this and finishes it)
    rolled_back | committed   the end (the record stays for `status.model.trial`)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from edge_agent.inference.trial_rules import Baseline, baseline_of
from edge_agent.log import get_logger
from edge_agent.store.atomic import read_capped, remove_durably, write_atomic

_log = get_logger(__name__)
TRIAL_NAME = "model_trial.json"
BAD_NAME = "model_bad.json"
FORMAT = 1
MAX_BYTES = 256 << 10
MAX_BAD = 64  # the oldest bad marks go first past this
BASELINE_SEGMENTS = 4  # episode segments read for the baseline (256 KiB each), newest first
PENDING, ON_TRIAL, ROLLING_BACK = "pending", "on_trial", "rolling_back"
ROLLED_BACK, COMMITTED = "rolled_back", "committed"
OPEN_STATES = (PENDING, ON_TRIAL, ROLLING_BACK)


class TrialStore:
    """Reads and writes the two files (see the module doc); the caller serialises writes."""

    def __init__(self, state_dir: str | Path) -> None:
        self.dir = Path(state_dir)
        self.trial_path = self.dir / TRIAL_NAME
        self.bad_path = self.dir / BAD_NAME
        self._bad: list[dict[str, Any]] | None = None  # the list as last read or written

    # -- the trial record ------------------------------------------------------------------
    def load_trial(self) -> dict[str, Any] | None:
        """The last trial record; None when there is none or it is unreadable (logged)."""
        rec = self._read(self.trial_path)
        if rec is None or not isinstance(rec.get("sha256"), str) or not isinstance(
                rec.get("state"), str):
            return None
        return rec

    def save_trial(self, rec: Mapping[str, Any]) -> None:
        self._write(self.trial_path, {**rec, "v": FORMAT})

    def clear_trial(self) -> None:
        remove_durably([self.trial_path])

    # -- the bad list ----------------------------------------------------------------------
    def bad(self) -> list[dict[str, Any]]:
        """The bad list (read once; this store is its only writer): `status` asks often."""
        if self._bad is None:
            rec = self._read(self.bad_path)
            items = rec.get("bad") if rec is not None else None
            self._bad = [dict(b) for b in items or () if isinstance(b, dict)
                         and isinstance(b.get("sha256"), str)] if isinstance(items, list) else []
        return [dict(b) for b in self._bad]

    def bad_entry(self, sha: str) -> dict[str, Any] | None:
        return next((b for b in self.bad() if b["sha256"] == sha), None)

    def mark_bad(self, sha: str, name: str | None, version: str | None,
                 reasons: list[str]) -> None:
        items = [b for b in self.bad() if b["sha256"] != sha]
        items.append({"sha256": sha, "name": name, "version": version,
                      "wall": round(time.time(), 3), "reasons": list(reasons)[:8]})
        self._write(self.bad_path, {"v": FORMAT, "bad": items[-MAX_BAD:]})
        self._bad = items[-MAX_BAD:]

    def unmark_bad(self, sha: str) -> None:
        items = self.bad()
        if any(b["sha256"] == sha for b in items):
            keep = [b for b in items if b["sha256"] != sha]
            self._write(self.bad_path, {"v": FORMAT, "bad": keep})
            self._bad = keep

    # -- files -----------------------------------------------------------------------------
    def _read(self, path: Path) -> dict[str, Any] | None:
        try:
            rec = json.loads(read_capped(path, MAX_BYTES))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            _log.warning("model_trial_file_unreadable", path=str(path), error=str(exc))
            return None
        if not isinstance(rec, dict) or rec.get("v") != FORMAT:
            _log.warning("model_trial_file_unreadable", path=str(path), error="format")
            return None
        return rec

    def _write(self, path: Path, rec: Mapping[str, Any]) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        write_atomic(path, json.dumps(rec, separators=(",", ":"), allow_nan=False).encode())


def read_baseline(journal_dir: Path, sha: str | None) -> Baseline:
    """Model `sha`'s recent judged episodes (the episode journal, newest first, at most
    `BASELINE_SEGMENTS` segments read); no journal: no baseline."""
    from edge_agent.store.episodes import EPISODES_NAME, decode_episode
    from edge_agent.store.journal import Journal

    def newest_first() -> Iterator[dict[str, Any]]:
        j = Journal(journal_dir, EPISODES_NAME)
        for seg in list(reversed(j.segments()))[:BASELINE_SEGMENTS]:
            for payload in reversed(list(j.iter_segment(seg))):
                rec = decode_episode(payload)
                if rec is not None:
                    yield rec
    try:
        return baseline_of(newest_first(), sha)
    except Exception:  # the success rule then says it had no baseline
        _log.exception("model_trial_baseline_failed")
        return Baseline(0, 0)


def card_summary(cache_dir: Path | None, sha: str | None,
                 memo: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """name, version, sha256 of a cached model from its card (not re-hashed: for status)."""
    if sha is None:
        return None
    if sha not in memo:
        from edge_agent.inference.model_card import ModelCard, ModelError

        try:
            if cache_dir is None:
                raise ModelError("no model cache")
            card = ModelCard.load(Path(cache_dir) / f"{sha}.card.json")
        except ModelError:
            return {"name": None, "version": None, "sha256": sha}
        memo[sha] = {"name": card.name, "version": card.version, "sha256": sha}
    return memo[sha]


def utc_text(wall: Any) -> str:
    """A wall time as `2026-12-06 06:07:37 UTC` ("?" for none)."""
    if not isinstance(wall, int | float):
        return "?"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(wall))
