"""The bound (IOBinding) run of a CPU session: the same scores as session.run, never shared."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from inference_models import bare_scores, bare_session, make_policy, observations

from edge_agent.inference.bound_run import bind
from edge_agent.policy_seam import OBS_DIM


def _bound(model: Path) -> tuple[Any, Any]:
    import numpy as np

    session = bare_session(model)
    y = session.run(None, {"obs": np.zeros((1, OBS_DIM), dtype=np.float32)})[0]
    bound = bind(session, np, OBS_DIM, y)
    assert bound is not None
    return session, bound


def test_bound_scores_equal_session_run(tmp_path: Path) -> None:
    session, bound = _bound(make_policy(tmp_path, seed=4))
    for o in observations(200, seed=7):
        assert bound.scores(o.vector) == bare_scores(session, o)


def test_a_row_of_the_wrong_width_is_left_to_the_plain_run(tmp_path: Path) -> None:
    _, bound = _bound(make_policy(tmp_path))
    assert bound.scores((1.0, 2.0, 3.0)) is None


def test_a_session_without_iobinding_is_not_bound() -> None:
    import numpy as np

    class StandIn:  # a test's session factory may return any object with run()
        def run(self, outputs: Any, feed: Any) -> Any:
            return [np.zeros((1, 4), dtype=np.float32)]

    assert bind(StandIn(), np, OBS_DIM, np.zeros((1, 4), dtype=np.float32)) is None


def test_two_threads_never_share_the_buffers(tmp_path: Path) -> None:
    # every answer is the right one or None (that caller then takes session.run): never a mix
    session, bound = _bound(make_policy(tmp_path, seed=5))
    obs = observations(300, seed=9)
    want = [bare_scores(session, o) for o in obs]
    wrong: list[int] = []

    def worker() -> None:
        for _ in range(5):
            for i, o in enumerate(obs):
                got = bound.scores(o.vector)
                if got is not None and got != want[i]:
                    wrong.append(i)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert wrong == []
