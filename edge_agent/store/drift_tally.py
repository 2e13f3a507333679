"""Running counters for the drift report: decisions per (executor state, action), episode outcomes.

    tally = DriftTally()
    journal.tally = tally            # DecisionJournal.record() counts each journaled decision
    tally.count_episode(record)      # the episode writer (daemon/episodes.py), off the control path
    delta = tally.take()             # the drift thread: what was counted since its last take

Why counters and not a scan of the journal at the period's end: the journal is bounded (16 x
4 MiB by default, ~500 k decisions) while a week at 20 Hz is ~12 M decisions, so the journal no
longer holds the period when the report is due; and decoding millions of records is CPU-bound
pure Python that must not run in the daemon. A count is one tuple and one dict update on the
control thread (`hil.bench_store` times the record path with and without it, same run).

One writer per counter: the control thread (through the decision journal) owns `decisions`;
`take()` copies the dict (one C call under the GIL, so a concurrent increment is either in the
copy or in the next one, never lost) and subtracts what it took before — it never resets the
dict the control thread is writing.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

NO_ACTION = "none"  # a decision without an action (inference failed)
NO_STATE = "none"


class DriftTally:
    """See the module doc."""

    __slots__ = ("_episodes", "_lock", "_taken", "decisions")

    def __init__(self) -> None:
        self.decisions: dict[tuple[Any, Any], int] = {}  # (state, action) -> count, since boot
        self._taken: dict[tuple[Any, Any], int] = {}
        self._lock = threading.Lock()
        self._episodes = _empty_episodes()

    def count_decision(self, state: Any, action: Any) -> None:
        """One journaled decision (the control thread: one dict update)."""
        k = (state, action)
        d = self.decisions
        d[k] = d.get(k, 0) + 1

    def count_episode(self, rec: Mapping[str, Any]) -> None:
        """One ended task's episode record (store/episodes.py)."""
        with self._lock:
            e = self._episodes
            e["episodes"] += 1
            outcome = str(rec.get("outcome") or "unknown")
            e["outcomes"][outcome] = e["outcomes"].get(outcome, 0) + 1
            e["l3"] += bool(rec.get("l3"))
            e["l1"] += int(rec.get("l1") or 0)

    def take(self) -> dict[str, Any]:
        """What was counted since the last take: {"actions": {state: {action: n}},
        "episodes", "outcomes", "l3", "l1"} (JSON-ready)."""
        snap = dict(self.decisions)
        taken, self._taken = self._taken, snap
        actions: dict[str, dict[str, int]] = {}
        for (state, action), n in snap.items():
            dn = n - taken.get((state, action), 0)
            if dn > 0:
                row = actions.setdefault(str(state or NO_STATE), {})
                a = str(action or NO_ACTION)
                row[a] = row.get(a, 0) + dn
        with self._lock:
            eps, self._episodes = self._episodes, _empty_episodes()
        return {"actions": actions, **eps}


def _empty_episodes() -> dict[str, Any]:
    return {"episodes": 0, "outcomes": {}, "l3": 0, "l1": 0}


def empty_counts() -> dict[str, Any]:
    """A period with nothing counted yet."""
    return {"actions": {}, **_empty_episodes()}


def add_counts(into: dict[str, Any], more: Mapping[str, Any]) -> dict[str, Any]:
    """`into` += `more` (both in `take()`'s shape); returns `into`."""
    for state, row in (more.get("actions") or {}).items():
        mine = into["actions"].setdefault(str(state), {})
        for action, n in row.items():
            mine[str(action)] = mine.get(str(action), 0) + int(n)
    for k in ("episodes", "l3", "l1"):
        into[k] = int(into.get(k, 0)) + int(more.get(k, 0))
    for outcome, n in (more.get("outcomes") or {}).items():
        into["outcomes"][str(outcome)] = into["outcomes"].get(str(outcome), 0) + int(n)
    return into
