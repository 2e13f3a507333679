"""A remote policy on a Triton Inference Server over gRPC; every network call on its own worker.

The control thread only ever touches `ready()` (a cached flag) and `submit()` (hands the row to
the worker and returns a pending ticket, or None while the worker is still busy with an earlier
request). The worker thread owns the tritonclient (imported there, lazily: it costs 150–250 ms),
runs each request with a per-request deadline (`client_timeout`), and between requests refreshes
readiness (`is_server_ready` and `is_model_ready`) every `ready_period_s`. A request that fails
outright (the server refused, reset or unreachable) marks the backend down at once, so later
decisions skip it without waiting; one that only missed its deadline fails that decision (the
router asks the next backend), and only the `DEADLINE_MISSES_DOWN`-th in a row marks it down: one
slow answer on a loaded host is not an outage, a hung server is. The next successful probe brings
it back. While down, each probe uses a fresh channel: gRPC's reconnect back-off would otherwise
delay noticing a restarted server by up to two minutes.

`request_health()` (the health monitor's remote-policy probe) asks the worker for one health
sample — server live, server ready, model ready and a probe inference's latency — between two
requests; `health` holds the latest (`TritonHealth`), so the monitor never waits on the network.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from edge_agent.inference.backend import EventBus, EventKind, Row, Ticket
from edge_agent.log import get_logger
from edge_agent.metrics.tally import TRITON_ROUND_TRIP

if TYPE_CHECKING:
    from edge_agent.contract.status_parts import TritonBackendStatus

log = get_logger(__name__)

DEADLINE_MISSES_DOWN = 3  # requests in a row over their deadline before the backend is down
_DEADLINE_STATUS = "StatusCode.DEADLINE_EXCEEDED"  # tritonclient's InferenceServerException
_STOP = object()
_HEALTH = object()


@dataclass(frozen=True, slots=True)
class TritonHealth:
    """One health sample the worker took (monotonic time `mono`)."""

    mono: float
    live: bool
    ready: bool
    model_ready: bool
    latency_s: float | None  # the probe inference's round trip; None when not run
    error: str | None
# The longest reply read: a policy's scores are bytes (tritonclient would allow 2 GiB, gRPC's
# own default is 4 MiB); a larger reply fails the request (RESOURCE_EXHAUSTED) unread.
MAX_REPLY_BYTES = 1024 * 1024
_CHANNEL_ARGS = [
    ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.min_reconnect_backoff_ms", 200),
    ("grpc.max_reconnect_backoff_ms", 1000), ("grpc.enable_http_proxy", 0),
    ("grpc.max_receive_message_length", MAX_REPLY_BYTES),
]


class TritonBackend:
    """Policy scores from a Triton model (see the module docstring)."""

    def __init__(self, name: str, url: str, model_name: str, bus: EventBus, *,
                 input_name: str = "obs", output_name: str = "scores", model_version: str = "",
                 request_timeout_s: float = 0.02, ready_period_s: float = 1.0,
                 probe_timeout_s: float = 0.5, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        self.name = name
        self.url = url
        self.model_name = model_name
        self.model_version = model_version
        self._bus = bus
        self._x_name, self._y_name = input_name, output_name
        self._request_timeout = request_timeout_s
        self._ready_period = ready_period_s
        self._probe_timeout = probe_timeout_s
        self._clock = clock
        self._q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._busy = False
        self._ready = False
        self._announced: bool | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._outage_until = 0.0  # failure.inject triton down: unreachable until then
        self._width: int | None = None  # the model's input width (rows sent, or its metadata)
        self.health: TritonHealth | None = None
        self._health_pending = False
        self.last_error: str | None = None
        self.requests = 0
        self.failures = 0
        self.deadline_misses = 0  # of `failures`: requests that only missed the deadline
        self._misses_in_row = 0

    # -- control-thread side --------------------------------------------------------------
    def ready(self) -> bool:
        return self._ready

    def answered(self) -> bool:
        """Whether the worker's first readiness probe has answered (until then `ready()` is
        False only because nobody asked the server yet)."""
        return self._announced is not None

    def submit(self, row: Row) -> Ticket | None:
        """Queue one request for the worker; None when it is still busy (never blocks)."""
        with self._lock:
            if self._busy or self._stopped:
                return None
            self._busy = True
        ticket = Ticket(self._clock(), pending=True)
        self._q.put((ticket, tuple(row)))
        return ticket

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the worker (it imports tritonclient and probes readiness); idempotent."""
        if self._thread is None and not self._stopped:
            self._thread = threading.Thread(target=self._run, name=f"inference-{self.name}",
                                            daemon=True)
            self._thread.start()

    def wait_ready(self, timeout: float) -> bool:
        return self._bus.wait_until(self.ready, timeout)

    def stop(self) -> None:
        """Stop the worker and close the channel; idempotent, never raises."""
        self._stopped = True
        self._ready = False
        self._q.put(_STOP)
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=2.0)

    def inject_outage(self, duration_s: float) -> None:
        """failure.inject triton down: behave as if the server were unreachable for a while.

        The worker notices at its next request or probe (the same path as a real outage), and
        the first probe after `duration_s` brings the backend back.
        """
        self._outage_until = time.monotonic() + duration_s

    def request_health(self) -> bool:
        """Ask the worker for a fresh `health` sample (never blocks); False when not running."""
        if self._thread is None or self._stopped:
            return False
        with self._lock:
            if self._health_pending:  # one at a time: a hung server must not pile them up
                return True
            self._health_pending = True
        self._q.put(_HEALTH)
        return True

    def status(self) -> TritonBackendStatus:
        return {"name": self.name, "url": self.url, "model": self.model_name,
                "ready": self._ready, "requests": self.requests, "failures": self.failures,
                "deadline_misses": self.deadline_misses, "last_error": self.last_error}

    # -- worker ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            import numpy as np
            import tritonclient.grpc as grpcclient
        except ImportError as e:
            self._bus.emit(EventKind.LOAD_FAILED, self.name,
                           f"tritonclient is not installed (pip install edge-agent[triton]): {e}")
            return
        next_probe = 0.0
        try:
            while not self._stopped:
                try:
                    item = self._q.get(timeout=max(0.0, next_probe - time.monotonic()))
                except queue.Empty:
                    item = None
                if item is _STOP:
                    break
                if item is _HEALTH:
                    self._health(grpcclient, np)
                elif item is not None:
                    ticket, row = item
                    ok = self._infer(grpcclient, np, ticket, row)
                    with self._lock:
                        self._busy = False
                    if not ok:
                        next_probe = time.monotonic() + self._ready_period
                if time.monotonic() >= next_probe and not self._stopped:
                    self._probe(grpcclient)
                    next_probe = time.monotonic() + self._ready_period
        finally:
            self._close()

    def _connect(self, grpcclient: Any) -> Any:
        if self._client is None:
            self._client = grpcclient.InferenceServerClient(self.url, channel_args=_CHANNEL_ARGS)
        return self._client

    def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                client.close()
            except Exception:
                log.debug("triton_close_failed", backend=self.name)

    def _probe(self, grpcclient: Any) -> None:
        if not self._ready:
            self._close()  # a fresh channel: no inherited reconnect back-off
        if time.monotonic() < self._outage_until:
            self._set_ready("injected outage (failure.inject triton down)")
            return
        try:
            client = self._connect(grpcclient)
            server = client.is_server_ready(client_timeout=self._probe_timeout)
            model = server and client.is_model_ready(self.model_name, self.model_version,
                                                     client_timeout=self._probe_timeout)
            why = None if model else ("server not ready" if not server else
                                      f"model {self.model_name} not ready")
        except Exception as e:
            why = _short(e)
        self._set_ready(why)

    def _health(self, grpcclient: Any, np: Any) -> None:
        live = ready = model = False
        latency: float | None = None
        error: str | None = None
        timeout = self._probe_timeout
        try:
            if time.monotonic() < self._outage_until:
                raise ConnectionError("injected outage (failure.inject triton down)")
            client = self._connect(grpcclient)
            live = bool(client.is_server_live(client_timeout=timeout))
            ready = live and bool(client.is_server_ready(client_timeout=timeout))
            model = ready and bool(client.is_model_ready(self.model_name, self.model_version,
                                                         client_timeout=timeout))
            if model:
                if self._width is None:
                    meta = client.get_model_metadata(self.model_name, self.model_version,
                                                     as_json=True, client_timeout=timeout)
                    self._width = int(meta["inputs"][0]["shape"][-1])
                x = np.zeros((1, self._width), dtype=np.float32)
                inp = grpcclient.InferInput(self._x_name, list(x.shape), "FP32")
                inp.set_data_from_numpy(x)
                for _ in range(2):  # the better of two: one stall of this host is not the server
                    t0 = time.perf_counter()
                    client.infer(self.model_name, [inp], model_version=self.model_version,
                                 outputs=[grpcclient.InferRequestedOutput(self._y_name)],
                                 client_timeout=timeout)
                    took = time.perf_counter() - t0
                    latency = took if latency is None else min(latency, took)
            else:
                error = ("server not live" if not live else "server not ready" if not ready
                         else f"model {self.model_name} not ready")
        except Exception as e:
            error = _short(e)
        self.health = TritonHealth(time.monotonic(), live, ready, model, latency, error)
        self._health_pending = False

    def _infer(self, grpcclient: Any, np: Any, ticket: Ticket, row: tuple[float, ...]) -> bool:
        self.requests += 1
        self._width = len(row)
        try:
            if time.monotonic() < self._outage_until:
                raise ConnectionError("injected outage (failure.inject triton down)")
            client = self._connect(grpcclient)
            x = np.asarray(row, dtype=np.float32).reshape(1, -1)
            inp = grpcclient.InferInput(self._x_name, list(x.shape), "FP32")
            inp.set_data_from_numpy(x)
            out = grpcclient.InferRequestedOutput(self._y_name)
            t0 = time.perf_counter()
            result = client.infer(self.model_name, [inp], model_version=self.model_version,
                                  outputs=[out], client_timeout=self._request_timeout)
            TRITON_ROUND_TRIP.observe(time.perf_counter() - t0)  # answered requests only
            scores: list[float] = result.as_numpy(self._y_name).reshape(-1).tolist()
        except Exception as e:
            self.failures += 1
            why = _short(e)
            ticket.complete(None, why, self._clock())
            if _missed_deadline(e):
                self.deadline_misses += 1
                self._misses_in_row += 1
                if self._misses_in_row < DEADLINE_MISSES_DOWN:
                    return True  # this decision fell through; the backend stays in service
                why = (f"{self._misses_in_row} requests in a row over the "
                       f"{self._request_timeout * 1e3:g} ms deadline ({why})")
            self._set_ready(f"request failed: {why}")
            return False
        self._misses_in_row = 0
        ticket.complete(scores, None, self._clock())
        return True

    def _set_ready(self, why_not: str | None) -> None:
        was = self._announced  # None until the first probe: the first answer is always told
        # the reason first: a probe reading `ready()` False between the two sees why
        self.last_error = why_not or self.last_error
        self._ready = why_not is None and not self._stopped
        if self._ready is was:
            return
        self._announced = self._ready
        if self._ready:
            self._bus.emit(EventKind.BACKEND_UP, self.name, f"{self.url} model {self.model_name}")
        else:
            self._bus.emit(EventKind.BACKEND_DOWN, self.name, why_not or "stopped")


def _missed_deadline(e: BaseException) -> bool:
    """The request ran out of time (gRPC DEADLINE_EXCEEDED), as opposed to failing outright."""
    status = getattr(e, "status", None)
    return callable(status) and status() == _DEADLINE_STATUS


def _short(e: BaseException) -> str:
    text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return text[:200]
