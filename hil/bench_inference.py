"""Benchmark of policy inference: router decisions vs. a bare onnxruntime run, Triton, load time.

    python3 -m hil.bench_inference [--n 5000] [--model M.onnx] [--triton | --triton-url H:P]

Prints median / P99 / max (µs or ms) with same-run baselines, so a loaded machine shows as such:
1. local: one decision through `PolicyRouter` → `OnnxBackend` (CPU, 1 thread, no spinning),
   interleaved with a bare `session.run` on the same model and options (target P99 ≤ 3 × bare);
2. load: a fresh interpreter from `InferenceStack.load()` (onnxruntime import, cache seed,
   session + warm-up) to the first possible decision, and that first decision;
3. Triton loopback (--triton starts a pytriton server in .venv-triton: scripts/setup.sh --tests;
   --triton-url uses a running server): decisions through the router's worker thread vs. a bare
   tritonclient `infer` in the same run (target P99 ≤ 5 ms).
Without --model, a deterministic test MLP is generated (needs the `onnx` package).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from hil.bench_stats import figure, stats, target, write_json

ROOT = Path(__file__).resolve().parents[1]


def _pct(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(len(s) * q))]


def _row(name: str, samples: list[float], unit: str = "us") -> dict[str, float]:
    k = 1e6 if unit == "us" else 1e3
    r = {"p50": _pct(samples, 0.5) * k, "p99": _pct(samples, 0.99) * k, "max": max(samples) * k}
    print(f"{name:<46} n={len(samples):<6} median {r['p50']:9.2f} {unit}   "
          f"P99 {r['p99']:9.2f} {unit}   max {r['max']:9.2f} {unit}")
    return r


def _make_model(d: Path) -> Path:
    sys.path.insert(0, str(ROOT / "tests"))
    from inference_models import make_policy

    return make_policy(d, "policy", seed=0)


def bench_local(model: Path, n: int) -> dict[str, list[float]]:
    import numpy as np
    import onnxruntime as ort

    from edge_agent.inference.backend import DecisionRecord, EventBus
    from edge_agent.inference.onnx_backend import OnnxBackend
    from edge_agent.inference.providers import configure_session_options
    from edge_agent.inference.router import PolicyRouter

    sys.path.insert(0, str(ROOT / "tests"))
    from inference_models import observations

    journal: list[DecisionRecord] = []
    backend = OnnxBackend("local", model, ["CPUExecutionProvider"], EventBus())
    assert backend.load()
    router = PolicyRouter([backend], EventBus(), deadline_s=0.02,
                          decision_sink=journal.append)
    opts = configure_session_options(ort.SessionOptions(), 1)
    bare = ort.InferenceSession(str(model), sess_options=opts,
                                providers=["CPUExecutionProvider"])
    obs = observations(n, seed=3)
    rows = [np.asarray(o.vector, dtype=np.float32).reshape(1, -1) for o in obs]
    for o, x in zip(obs[:200], rows[:200], strict=True):  # warm both paths
        router.decide(o)
        bare.run(["scores"], {"obs": x})
    t_router, t_bare = [], []
    for o, x in zip(obs, rows, strict=True):  # interleaved: both see the same machine state
        t = time.perf_counter()
        bare.run(["scores"], {"obs": x})
        t_bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        router.decide(o)
        t_router.append(time.perf_counter() - t)
    print("\n== local decision (CPU, intra_op 1, no spinning) ==")
    b = _row("bare session.run (prepared array)", t_bare)
    r = _row("router.decide (obs → action + record)", t_router)
    print(f"router/bare P99 ratio {r['p99'] / b['p99']:.2f} (target <= 3), "
          f"median overhead {r['p50'] - b['p50']:.1f} us; {len(journal) - 200} records")
    return {"router_us": [x * 1e6 for x in t_router], "bare_us": [x * 1e6 for x in t_bare]}


_LOAD_SNIPPET = """
import json, sys, time
from pathlib import Path
t0 = time.perf_counter()
from edge_agent.policy_seam import Observation, OBS_DIM
from edge_agent.executor.tasks import State
from edge_agent.inference.assembly import InferenceSettings, InferenceStack
stack = InferenceStack(InferenceSettings(model=Path(sys.argv[1]), cache_dir=Path(sys.argv[2])))
t1 = time.perf_counter()
stack.load()
t2 = time.perf_counter()
stack.router.decide(Observation(State.GRASP, (0.0,) * OBS_DIM))
t3 = time.perf_counter()
print(json.dumps({"build_ms": (t1 - t0) * 1e3, "ready_ms": stack.load_s * 1e3,
                  "load_ms": (t2 - t1) * 1e3, "session_ms": stack.local.load_s * 1e3,
                  "first_decision_ms": (t3 - t2) * 1e3}))
"""
_IMPORT_SNIPPET = ("import json, time; t = time.perf_counter(); import onnxruntime; "
                   "print(json.dumps({'ort_ms': (time.perf_counter() - t) * 1e3}))")


def bench_load(model: Path, runs: int = 5) -> list[dict[str, float]]:
    print("\n== load() → first possible decision (fresh interpreter each run) ==")
    res: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(runs):
            out = subprocess.run([sys.executable, "-c", _LOAD_SNIPPET, str(model),
                                  f"{d}/cache{i}"], cwd=ROOT, capture_output=True, text=True,
                                 check=True)
            res.append(json.loads(out.stdout.strip().splitlines()[-1]))
            out = subprocess.run([sys.executable, "-c", _IMPORT_SNIPPET], capture_output=True,
                                 text=True, check=True)
            res[-1].update(json.loads(out.stdout.strip().splitlines()[-1]))
    for key, what in (("build_ms", "import edge_agent.inference + build (pre-READY)"),
                      ("ort_ms", "import onnxruntime alone (own interpreter)"),
                      ("ready_ms", "load() start → first backend ready"),
                      ("session_ms", "  local session + warm-up (ort imported)"),
                      ("load_ms", "load() total (seed cache, local + cached)"),
                      ("first_decision_ms", "first decision after load")):
        v = sorted(r[key] for r in res)
        print(f"{what:<52} median {v[len(v) // 2]:8.1f} ms   max {v[-1]:8.1f} ms")
    return res


def bench_triton(url: str, model: Path, n: int) -> dict[str, list[float]]:
    import numpy as np
    import tritonclient.grpc as grpcclient

    from edge_agent.inference.backend import EventBus
    from edge_agent.inference.onnx_backend import OnnxBackend
    from edge_agent.inference.router import PolicyRouter
    from edge_agent.inference.triton_backend import TritonBackend

    sys.path.insert(0, str(ROOT / "tests"))
    from inference_models import observations

    bus = EventBus()
    remote = TritonBackend("triton", url, "policy", bus, request_timeout_s=0.5)
    local = OnnxBackend("local", model, ["CPUExecutionProvider"], bus)
    assert local.load()
    router = PolicyRouter([remote, local], bus, deadline_s=0.5)
    remote.start()
    assert remote.wait_ready(30.0), remote.status()
    client = grpcclient.InferenceServerClient(url)
    obs = observations(n, seed=5)
    for o in obs[:50]:
        router.decide(o)
    t_dec, t_bare, used = [], [], {"triton": 0}
    for o in obs:
        x = np.asarray(o.vector, dtype=np.float32).reshape(1, -1)
        inp = grpcclient.InferInput("obs", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        t = time.perf_counter()
        client.infer("policy", [inp])
        t_bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        d = router.begin(o)
        d.wait()
        t_dec.append(time.perf_counter() - t)
        used[d.backend or "-"] = used.get(d.backend or "-", 0) + 1
    print(f"\n== Triton loopback ({url}) ==")
    _row("bare tritonclient infer (same thread)", t_bare, "ms")
    r = _row("router.decide via the inference worker", t_dec, "ms")
    print(f"decisions by backend {used}; target P99 <= 5 ms: "
          f"{'met' if r['p99'] <= 5 else 'NOT met'}")
    client.close()
    router.stop()
    return {"router_ms": [x * 1e3 for x in t_dec], "bare_ms": [x * 1e3 for x in t_bare]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000, help="local decisions (Triton: n/10)")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--triton", action="store_true", help="start a pytriton server")
    ap.add_argument("--triton-url", help="host:port of a running Triton serving `policy`")
    ap.add_argument("--load-runs", type=int, default=5)
    ap.add_argument("--json", metavar="PATH", help="write the figure records here (hil.bench)")
    a = ap.parse_args(argv)
    why: str | None = None if a.triton or a.triton_url else "not asked (--triton)"
    tri: dict[str, list[float]] | None = None
    with tempfile.TemporaryDirectory() as d:
        model = a.model or _make_model(Path(d))
        local = bench_local(model, a.n)
        load = bench_load(model, a.load_runs)
        server: Any = None
        url = a.triton_url
        if a.triton and not url:
            sys.path.insert(0, str(ROOT / "tests"))
            from triton_server import TritonServer, triton_unavailable

            why = triton_unavailable()
            if why:
                print(f"\n== Triton loopback skipped: {why}")
            else:
                server = TritonServer(model, Path(d) / "triton.log")
                try:
                    server.start()
                    url = server.url
                except Exception as exc:  # say why, go on: the local figures stand
                    why = f"the pytriton server did not start: {type(exc).__name__}: {exc}"
                    print(f"\n== Triton loopback skipped: {why}")
        try:
            if url:
                tri = bench_triton(url, model, max(200, a.n // 10))
        finally:
            if server is not None:
                server.stop()
    write_json(a.json, figures(local, load, tri, why))
    return 0


def figures(local: dict[str, list[float]], load: list[dict[str, float]],
            tri: dict[str, list[float]] | None, why: str | None) -> list[dict[str, object]]:
    """The `--json` figure records (hil.bench); the decision target from issue 32."""
    r, b = stats(local["router_us"]), stats(local["bare_us"])
    out = [figure("policy decision: router.decide (obs → action + record)", "µs",
                  local["router_us"], baseline=("bare onnxruntime session.run",
                                                local["bare_us"]), samples=True,
                  tgt=target("P99 ≤ 1.5 × bare onnxruntime (issue 32)", 1.5,
                             r["p99"] / b["p99"] if b.get("p99") else None)),
           figure("load() → first possible decision (fresh interpreter)", "ms",
                  [x["load_ms"] for x in load], ratio_of="p50",
                  baseline=("import onnxruntime alone", [x["ort_ms"] for x in load]))]
    name = "Triton loopback decision via the inference worker"
    if tri is None:
        out.append(figure(name, "ms", [], skipped=why or "no server"))
    else:
        out.append(figure(name, "ms", tri["router_ms"], samples=True,
                          baseline=("bare tritonclient infer", tri["bare_ms"]),
                          tgt=target("P99 ≤ 5 ms", 5.0, stats(tri["router_ms"]).get("p99"))))
    return out


if __name__ == "__main__":
    raise SystemExit(main())
