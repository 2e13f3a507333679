"""The metrics endpoint: prometheus_client's HTTP server on its own thread, one registry holding
the status collector (collector.py). Imported only when `observe.metrics_port` is set, after
READY; a scrape runs on the server's thread, never on the control thread.
"""

from __future__ import annotations

from prometheus_client import start_http_server
from prometheus_client.registry import CollectorRegistry

from edge_agent.log import get_logger
from edge_agent.metrics.collector import MetricsSource, StatusCollector

_log = get_logger(__name__)


class MetricsServer:
    """`GET http://host:port/metrics` until `stop()`."""

    def __init__(self, source: MetricsSource, host: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(StatusCollector(source))
        self.host, self.port = host, port
        # a thread of its own (daemon thread): bind errors surface here, before READY's work
        self._httpd, self._thread = start_http_server(port, addr=host, registry=self.registry)
        _log.info("metrics_listening", host=host, port=port)

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(2.0)
