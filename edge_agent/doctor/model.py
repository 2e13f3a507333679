"""Doctor checks of the policy model: it verifies against its card, and what onnxruntime gives.

The model is verified exactly as the daemon seeds it at start-up (`ModelCache.seed` into a
throwaway cache: sha256 against the card, the session's inputs and outputs against the card, the
card's meaning against the executor's observation layout, a smoke run). The providers are the
ones a session created with `inference.providers` really uses (`session.get_providers()`):
onnxruntime-gpu without working CUDA lists CUDAExecutionProvider as available and still creates
CPU sessions.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.doctor import Finding, error, ok, warn

if TYPE_CHECKING:
    from edge_agent.config import Config


def check_model(cfg: Config) -> list[Finding]:
    """The configured model against its card (as the daemon would install it)."""
    model = cfg.inference.model
    if model is None:
        return [ok("model", "no inference.model configured: the rule policy decides"
                   + (" (Triton configured)" if cfg.inference.triton_url else ""))]
    from edge_agent.inference.assembly import ACTION_LABELS, OBS_FIELD_UNITS
    from edge_agent.inference.model_cache import ModelCache
    from edge_agent.inference.model_card import ModelError, card_path_for

    card = card_path_for(Path(model))
    out: list[Finding] = []
    if not card.exists():
        out.append(warn("model", f"{model}: no card beside it ({card.name}): the daemon accepts "
                                 "it unverified, with its sha256 as the only identity",
                        "ship the model with its card (models/README.md: `python3 -m "
                        "models.train_policy` writes both)"))
    with tempfile.TemporaryDirectory(prefix="edge-agent-doctor-") as tmp:
        cache = ModelCache(Path(tmp), fields=OBS_FIELD_UNITS, labels=ACTION_LABELS)
        try:
            entry = cache.seed(Path(model))
        except (ModelError, OSError) as exc:
            return [*out, error("model", f"{model} fails verification: {exc}",
                                "deploy the model together with the card it was released "
                                "with (a model and a card that disagree are never loaded); "
                                "check both files' sha256 against the release")]
    if entry is not None and card.exists():
        c = entry.card
        out.append(ok("model", f"{Path(model).name}: {c.name} {c.version} verifies against its "
                               f"card (sha256 {c.sha256[:12]})"))
    return out


def check_providers(cfg: Config) -> list[Finding]:
    """Create a session with the configured providers and report what it really runs on."""
    model = cfg.inference.model
    requested = list(cfg.inference.providers)
    if model is None:
        return [ok("providers", f"no local model: not checked (configured: "
                                f"{', '.join(requested)})")]
    try:
        import onnxruntime as ort
    except ImportError as exc:
        return [error("providers", f"onnxruntime cannot be imported: {exc}",
                      "install it into the daemon's environment: `pip install onnxruntime` "
                      "(or onnxruntime-gpu, README \"GPU robots\")")]
    from edge_agent.inference.providers import resolve

    listed = list(ort.get_available_providers())
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = cfg.inference.intra_op_threads
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Specified provider")
            session = ort.InferenceSession(str(model), sess_options=opts, providers=requested)
    except Exception as exc:  # onnxruntime raises its own exception types
        return [error("providers", f"no session with {', '.join(requested)}: {exc}",
                      "check inference.providers and the model file")]
    res = resolve(requested, session.get_providers())
    if res.gpu_unavailable:
        return [warn("providers", f"{res.describe()} — the GPU is not used (onnxruntime lists "
                                  f"{', '.join(listed)})",
                     "check the CUDA/cuDNN libraries onnxruntime-gpu needs (`nvidia-smi`, "
                     "`ldconfig -p | grep -E 'cudnn|cublas'`) and that the service may open "
                     "/dev/nvidia* (DeviceAllow=); or set inference.providers = "
                     "[\"CPUExecutionProvider\"] to say CPU is intended")]
    return [ok("providers", res.describe())]
