"""Load an `edge-agent journal export` directory with LeRobot's own `LeRobotDataset` and check it.

    python -m hil.load_lerobot DIR [--repo-id local/edge-agent]

Needs `lerobot` (0.4+, the v3.0 format) and its torch, which are not edge-agent's: run it with a
Python that has them (docs/FLYWHEEL.md says how one was made here). It loads DIR offline
(HF_HUB_OFFLINE=1: nothing is fetched from the Hub), reads every frame through
`LeRobotDataset.__getitem__` (the task string from meta/tasks.parquet, the episode bounds from
meta/episodes/ through `delta_timestamps`), checks the counts and shapes against meta/info.json
and prints one JSON line. Exit 0: loaded and consistent; 1: a check failed; 3: no lerobot here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m hil.load_lerobot", description=__doc__)
    p.add_argument("dir", type=Path, help="the dataset directory edge-agent journal export wrote")
    p.add_argument("--repo-id", default="local/edge-agent",
                   help="a name for LeRobot (nothing is fetched; default: %(default)s)")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import lerobot
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as e:
        print(f"no lerobot in this Python ({sys.executable}): {e}", file=sys.stderr)
        return 3
    info = json.loads((a.dir / "meta/info.json").read_text())
    fps = info["fps"]
    t0 = time.monotonic()
    ds = LeRobotDataset(a.repo_id, root=a.dir,
                        delta_timestamps={"observation.state": [-1 / fps, 0.0]})
    load_s = time.monotonic() - t0
    problems = []
    if (len(ds), ds.num_episodes) != (info["total_frames"], info["total_episodes"]):
        problems.append(f"{len(ds)} frames / {ds.num_episodes} episodes, info.json says "
                        f"{info['total_frames']} / {info['total_episodes']}")
    dim = info["features"]["observation.state"]["shape"][0]
    n_act = info["features"]["action"]["shape"][0]
    tasks = set()
    for i in range(len(ds)):
        item = ds[i]
        tasks.add(item["task"])
        obs = item["observation.state"]
        if tuple(obs.shape) != (2, dim) or tuple(item["action"].shape) != (n_act,):
            problems.append(f"frame {i}: observation {tuple(obs.shape)}, action "
                            f"{tuple(item['action'].shape)}")
            break
        # the frame before the episode's first is padded (LeRobot's episode bounds at work)
        if bool(item["observation.state_is_pad"][0]) != (int(item["frame_index"]) == 0):
            problems.append(f"frame {i}: padding disagrees with frame_index")
            break
    if len(tasks) != info["total_tasks"]:
        problems.append(f"tasks {sorted(tasks)}, info.json says {info['total_tasks']}")
    print(json.dumps({"lerobot": getattr(lerobot, "__version__", "?"), "frames": len(ds),
                      "episodes": ds.num_episodes, "tasks": sorted(tasks), "fps": ds.fps,
                      "load_s": round(load_s, 3), "features": sorted(ds.features),
                      "problems": problems}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
