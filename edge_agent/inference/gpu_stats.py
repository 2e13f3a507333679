"""NVML figures for the GPU health probe: memory, temperature, uncorrected ECC errors.

Through `nvidia-ml-py` (module `pynvml`, the `gpu` extra), imported on the first call, never at
start-up. Where there is no GPU — the package missing, no driver library, no device — the answer
says so (`gpu: none` and why) instead of raising: a robot without a GPU is not an error here;
the probe decides what a missing GPU means for the configured providers.
"""

from __future__ import annotations

from typing import Any

_init: bool | str | None = None  # None: not tried; True: initialised; str: why not


def _ensure() -> Any:
    """The pynvml module, initialised once; raises RuntimeError (why there is no GPU)."""
    global _init
    try:
        import pynvml
    except ImportError as e:
        raise RuntimeError(f"nvidia-ml-py is not installed ({e})") from e
    if _init is None:
        try:
            pynvml.nvmlInit()
            _init = True
        except pynvml.NVMLError as e:
            _init = f"NVML: {e}"
    if _init is not True:
        raise RuntimeError(str(_init))
    return pynvml


def gpu_figures(index: int = 0) -> dict[str, Any]:
    """Figures of GPU `index`; `{"gpu": "none", "why": ...}` where there is none. Never raises."""
    try:
        nv = _ensure()
        count = nv.nvmlDeviceGetCount()
        if index >= count:
            return {"gpu": "none", "why": f"NVML sees {count} GPU(s)"}
        h = nv.nvmlDeviceGetHandleByIndex(index)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        out: dict[str, Any] = {
            "gpu": str(nv.nvmlDeviceGetName(h)),
            "memory_used_mb": round(mem.used / 2**20, 1),
            "memory_total_mb": round(mem.total / 2**20, 1),
            "temperature_c": nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU),
        }
        try:
            out["ecc_uncorrected"] = nv.nvmlDeviceGetTotalEccErrors(
                h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC)
        except nv.NVMLError:  # consumer GPUs have no ECC
            out["ecc_uncorrected"] = None
        return out
    except Exception as e:
        return {"gpu": "none", "why": str(e)[:200]}
