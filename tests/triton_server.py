"""Test helper: a real Triton Inference Server (nvidia-pytriton) serving an ONNX policy on CPU.

Run as a script it is the server: pytriton starts the tritonserver binary it ships and binds the
model `policy` (input `obs` [-1, D] FP32, output `scores` [-1, 4] FP32, dynamic batching) to a
function that runs the ONNX file through onnxruntime on CPU, so its answers are the local
session's. The number in `--delay-file` (ms, read per request) slows every request down.

Imported, `TritonServer` starts that script in a subprocess on free 127.0.0.1 ports, waits until
the server and the model are ready (tritonclient, with a deadline), and stops/restarts it on the
same ports. `triton_unavailable()` says why a server cannot run here (pytest skip reason).
The server's interpreter is $EDGE_AGENT_TRITON_PYTHON, else .venv-triton/bin/python (what
`scripts/setup.sh --tests` makes from the `triton-server` extra: pytriton needs numpy<2, the
daemon runs on numpy 2), else the running one; LD_LIBRARY_PATH is set on that Python's own lib
dir here so its stub finds libpython.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

START_TIMEOUT_S = 90.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _shm_names() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except OSError:
        return set()


_OWN_VENV = Path(__file__).resolve().parent.parent / ".venv-triton" / "bin" / "python"


def server_python() -> str:
    if os.environ.get("EDGE_AGENT_TRITON_PYTHON"):
        return os.environ["EDGE_AGENT_TRITON_PYTHON"]
    return str(_OWN_VENV) if _OWN_VENV.exists() else sys.executable


def triton_unavailable() -> str | None:
    """None when a pytriton server and a tritonclient can run here, else why not."""
    try:
        import tritonclient.grpc  # noqa: F401
    except ImportError as e:
        return f"tritonclient[grpc] is not installed in the test interpreter ({e})"
    py = server_python()
    probe = subprocess.run([py, "-c", "import pytriton.triton, onnxruntime, numpy; "
                            "print(numpy.__version__)"], capture_output=True, text=True,
                           timeout=60, check=False)
    if probe.returncode != 0:
        tail = (probe.stderr.strip().splitlines() or ["?"])[-1]
        return (f"nvidia-pytriton is not importable by {py} ({tail}); it needs numpy<2 — run "
                "scripts/setup.sh --tests (it makes .venv-triton) or set "
                "EDGE_AGENT_TRITON_PYTHON to an interpreter that has it")
    return None


@contextlib.contextmanager
def serving(model: Path, log_path: Path) -> Iterator[TritonServer]:
    """A started server (model ready), killed on the way out (a graceful stop takes ~4 s of
    pytriton shutdown here that no test looks at; stop() removes the segments a kill leaves)."""
    s = TritonServer(model, log_path)
    s.start()
    try:
        yield s
    finally:
        s.stop(graceful=False)


class TritonServer:
    """One pytriton server process serving `model` as `policy` (see the module docstring)."""

    def __init__(self, model: Path, log_path: Path) -> None:
        self.model = model
        self.log_path = log_path
        self.delay_file = log_path.with_suffix(".delay_ms")
        self.set_delay_ms(0.0)
        self.grpc_port, self.http_port, self.metrics_port = (_free_port() for _ in range(3))
        self.proc: subprocess.Popen[bytes] | None = None
        self._shm_before: set[str] = set()

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self) -> None:
        import sysconfig

        py = server_python()
        libdir = subprocess.run([py, "-c", "import sysconfig; "
                                 "print(sysconfig.get_config_var('LIBDIR'))"],
                                capture_output=True, text=True, check=True).stdout.strip()
        env = dict(os.environ)
        env["LD_LIBRARY_PATH"] = ":".join(
            p for p in (libdir or sysconfig.get_config_var("LIBDIR"),
                        env.get("LD_LIBRARY_PATH")) if p)
        log = self.log_path.open("ab")
        self._shm_before = _shm_names()
        self.proc = subprocess.Popen(
            [py, __file__, "--model", str(self.model), "--grpc-port", str(self.grpc_port),
             "--http-port", str(self.http_port), "--metrics-port", str(self.metrics_port),
             "--delay-file", str(self.delay_file)],
            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        self.wait_ready(START_TIMEOUT_S)

    def wait_ready(self, timeout: float) -> None:
        import tritonclient.grpc as grpcclient

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"triton server exited with {self.proc.returncode}; "
                                   f"see {self.log_path}:\n{self.log_tail()}")
            client = grpcclient.InferenceServerClient(self.url)
            try:
                if (client.is_server_ready(client_timeout=1.0)
                        and client.is_model_ready("policy", client_timeout=1.0)):
                    return
            except Exception:
                pass
            finally:
                client.close()
            time.sleep(0.1)  # polling a server that is starting, not synchronising threads
        raise TimeoutError(f"triton not ready in {timeout} s; log:\n{self.log_tail()}")

    def set_delay_ms(self, ms: float) -> None:
        """Every request from now on takes `ms` longer (read by the server per request)."""
        self.delay_file.write_text(f"{ms}\n")

    def stop(self, graceful: bool = True) -> None:
        """SIGINT the process group (or SIGKILL: a crash), then SIGKILL; idempotent."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        from hil.daemon_proc import stop_group  # here: __main__ runs in .venv-triton

        if graceful:
            stop_group(p)
        else:
            stop_group(p, signal.SIGKILL, 10.0)
        # the tritonserver child must not outlive the test (it holds the ports)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        # a killed pytriton leaves its shared-memory segments behind: remove the ones it made
        for name in _shm_names() - self._shm_before:
            if name.startswith(("pytrtion", "psm_")):
                with contextlib.suppress(OSError):
                    os.unlink(f"/dev/shm/{name}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"


def _serve(model: Path, grpc_port: int, http_port: int, metrics_port: int,
           delay_file: Path) -> None:
    import numpy as np
    import onnxruntime as ort
    from pytriton.decorators import batch
    from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
    from pytriton.triton import Triton, TritonConfig

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    session = ort.InferenceSession(str(model), sess_options=opts,
                                   providers=["CPUExecutionProvider"])
    x_arg, y_arg = session.get_inputs()[0], session.get_outputs()[0]
    dim, n_out = int(x_arg.shape[-1]), int(y_arg.shape[-1])

    @batch
    def infer(obs: np.ndarray) -> dict[str, np.ndarray]:
        delay_ms = float(delay_file.read_text() or 0)
        if delay_ms > 0:
            time.sleep(delay_ms / 1e3)  # the slowness under test
        y = session.run([y_arg.name], {x_arg.name: obs.astype(np.float32)})[0]
        return {"scores": y.astype(np.float32)}

    config = TritonConfig(grpc_port=grpc_port, http_port=http_port, metrics_port=metrics_port,
                          grpc_address="127.0.0.1", http_address="127.0.0.1")
    with Triton(config=config) as triton:
        triton.bind(model_name="policy", infer_func=infer,
                    inputs=[Tensor(name="obs", dtype=np.float32, shape=(dim,))],
                    outputs=[Tensor(name="scores", dtype=np.float32, shape=(n_out,))],
                    config=ModelConfig(max_batch_size=8, batcher=DynamicBatcher(
                        max_queue_delay_microseconds=100)),
                    strict=True)
        triton.serve()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--grpc-port", type=int, required=True)
    ap.add_argument("--http-port", type=int, required=True)
    ap.add_argument("--metrics-port", type=int, required=True)
    ap.add_argument("--delay-file", type=Path, required=True)
    a = ap.parse_args()
    _serve(a.model, a.grpc_port, a.http_port, a.metrics_port, a.delay_file)
