"""Prometheus metrics (`observe.metrics_port`): O(1) tallies fed where figures are measured
(tally.py, imported by the daemon's parts: no prometheus_client), and the exposition that reads
them with the daemon's `status` on each scrape (collector.py, server.py: imported after READY,
only when the port is set). docs/OBSERVE.md "Metrics".
"""
