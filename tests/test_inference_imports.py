"""Importing the inference layer (what the daemon imports before READY) loads nothing heavy."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("onnxruntime", "tritonclient", "numpy", "grpc", "onnx", "scipy", "pynvml", "filterpy")
MODULES = ("edge_agent.inference.router", "edge_agent.inference.assembly",
           "edge_agent.inference.backend", "edge_agent.inference.onnx_backend",
           "edge_agent.inference.triton_backend", "edge_agent.inference.model_cache",
           "edge_agent.inference.model_card", "edge_agent.inference.providers",
           "edge_agent.inference.gpu_stats", "edge_agent.health.inference_probes",
           "edge_agent.health.sensor_probes")


def _imported_after(code: str) -> list[str]:
    probe = (f"import sys, json\n{code}\n"
             f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                         text=True, timeout=60, check=True)
    heavy: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return heavy


def test_importing_the_inference_layer_imports_no_heavy_module() -> None:
    assert _imported_after("\n".join(f"import {m}" for m in MODULES)) == []


def test_building_the_stack_imports_no_heavy_module(tmp_path: Path) -> None:
    # what the daemon does before READY: build the stack (no load, no file read)
    code = ("from pathlib import Path\n"
            "from edge_agent.inference.assembly import InferenceSettings, InferenceStack\n"
            f"s = InferenceStack(InferenceSettings(model=Path({str(tmp_path / 'm.onnx')!r}), "
            f"cache_dir=Path({str(tmp_path / 'models')!r}), triton_url='127.0.0.1:1'))\n"
            "assert not s.model_ready() and s.router.preferred_ready() == 'rule'\n")
    assert _imported_after(code) == []


def test_load_is_what_imports_onnxruntime(tmp_path: Path) -> None:
    from inference_models import make_policy

    model = make_policy(tmp_path)
    code = ("from pathlib import Path\n"
            "from edge_agent.inference.backend import EventBus\n"
            "from edge_agent.inference.onnx_backend import OnnxBackend\n"
            f"b = OnnxBackend('local', Path({str(model)!r}), ['CPUExecutionProvider'], "
            "EventBus())\n"
            "assert 'onnxruntime' not in sys.modules\n"
            "assert b.load() and b.ready()\n")
    assert "onnxruntime" in _imported_after(code)


def test_load_imports_numpy_before_the_remote_worker_starts(tmp_path: Path) -> None:
    """The remote worker imports tritonclient (numpy) on its thread while load() imports
    onnxruntime (numpy) on its own: numpy 2 imported by two threads at once fails in one, and
    then no model backend loads (1 daemon start in 4 here). numpy must come first, alone."""
    from inference_models import make_policy

    model = make_policy(tmp_path)
    code = ("from pathlib import Path\n"
            "from edge_agent.inference.assembly import InferenceSettings, InferenceStack\n"
            f"s = InferenceStack(InferenceSettings(model=Path({str(model)!r}), "
            f"cache_dir=Path({str(tmp_path / 'models')!r}), triton_url='127.0.0.1:1'))\n"
            "seen = []\n"
            "start = s.remote.start\n"
            "s.remote.start = lambda: (seen.append('numpy' in sys.modules), start())\n"
            "assert 'numpy' not in sys.modules\n"
            "s.load()\n"
            "assert seen == [True], seen\n"
            "assert s.local.ready()\n"
            "s.router.stop()\n")
    assert "numpy" in _imported_after(code)
