"""Write the live view's Foxglove layout, docs/foxglove/edge-agent-live.json, with foxglove-sdk's
own layout types (foxglove.layouts): plots of the joints, currents, force and latencies, the
state transitions (events, executor, decisions), the last decision, the log. 3D-free. Every
topic it names is a channel of the live view and the flight recorder
(edge_agent/observe/channels.py; tests/test_liveview.py checks both, and that this file is what
the script writes).

    python -m hil.foxglove_layout [--check]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import foxglove.layouts as fl

from edge_agent.observe import channels as ch

OUT = Path(__file__).resolve().parents[1] / "docs" / "foxglove" / "edge-agent-live.json"
JOINTS = 4  # the simulated robot's arm (configs/robot); extra series only show nothing


def _series(paths: list[tuple[str, str]]) -> list[fl.PlotSeries]:
    # ordered by log time: the tap's time, which is also each message's `timestamp`
    return [fl.PlotSeries(value=p, label=label) for p, label in paths]


def _plot(title: str, paths: list[tuple[str, str]], y_label: str) -> fl.PlotPanel:
    return fl.PlotPanel(title=title, config=fl.PlotConfig(
        paths=_series(paths), show_legend=True, legend_display="top", y_axis_label=y_label,
        time_window_mode="sliding", following_view_width=30.0))


def layout() -> fl.Layout:
    s = ch.LINK_STATUS
    joints = _plot("Joints (rad)", [(f"{s}.q[{i}]", f"q{i}") for i in range(JOINTS)], "rad")
    currents = _plot("Joint currents (A)",
                     [(f"{s}.current[{i}]", f"i{i}") for i in range(JOINTS)], "A")
    force = _plot("Gripper force (N)", [(f"{s}.gripper_force", "measured (link)"),
                                        (f"{ch.SENSORS}.gripper_force", "control tick")], "N")
    # every control tick's lateness and duration; each decision's latency
    lat_paths = [(f"{ch.LOOP}.late_ms", "tick lateness"), (f"{ch.LOOP}.tick_ms", "tick duration"),
                 (f"{ch.DECISIONS}.latency_ms", "decision latency")]
    latency = _plot("Loop lateness and decision latency (ms)", lat_paths, "ms")
    states = fl.StateTransitionsPanel(title="State", config=fl.StateTransitionsConfig(
        paths=[fl.StateTransitionsSeries(value=f"{ch.EVENTS}.type", label="events"),
               fl.StateTransitionsSeries(value=f"{ch.EXECUTOR}.type", label="executor"),
               fl.StateTransitionsSeries(value=f"{ch.DECISIONS}.action", label="decision"),
               fl.StateTransitionsSeries(value=f"{ch.DECISIONS}.backend", label="backend")],
        show_legend=True, time_window_mode="sliding"))
    decision = fl.RawMessagesPanel(title="Last decision",
                                   config=fl.RawMessagesConfig(topic_path=ch.DECISIONS))
    log = fl.LogPanel(title="Log", config=fl.LogConfig(topic_to_render=ch.LOG, show_name=True,
                                                       show_level=True, show_time=True))

    def col(*items: fl.Content) -> fl.SplitContainer:
        return fl.SplitContainer(direction="column",
                                 items=[fl.SplitItem(content=c) for c in items])

    return fl.Layout(content=fl.SplitContainer(direction="row", items=[
        fl.SplitItem(proportion=3, content=col(joints, currents, force, latency)),
        fl.SplitItem(proportion=2, content=col(states, decision, log))]))


def render() -> str:
    return json.dumps(json.loads(layout().to_json()), indent=1, ensure_ascii=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        same = OUT.exists() and OUT.read_text() == text
        print("up to date" if same else f"{OUT} is out of date: run python -m hil.foxglove_layout")
        return 0 if same else 1
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
