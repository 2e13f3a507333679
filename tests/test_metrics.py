"""The Prometheus endpoint of a real daemon (`observe.metrics_port`): scraped over HTTP, parsed
with prometheus_client's own parser; the Grafana dashboard names only metrics a scrape has."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from daemon_proc import REPO, DaemonProc
from mosquitto import free_port, wait_until
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

DASHBOARD = REPO / "docs" / "grafana" / "edge-agent.json"
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def scrape(port: int) -> tuple[dict[str, str], list[Sample]]:
    """({family name: type}, every sample) of one GET /metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as r:
        text = r.read(4 << 20).decode()
    fams = list(text_string_to_metric_families(text))
    return {f.name: f.type for f in fams}, [s for f in fams for s in f.samples]


def listening(port: int) -> bool:
    """The endpoint answers (it starts just after READY)."""
    try:
        scrape(port)
    except OSError:
        return False
    return True


def one(samples: list[Sample], name: str, **labels: str) -> float:
    found = [s.value for s in samples
             if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def buckets(samples: list[Sample], name: str) -> list[tuple[float, float]]:
    return sorted((float(s.labels["le"]), s.value) for s in samples
                  if s.name == name + "_bucket")


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    port = free_port()
    d = DaemonProc(tmp_path_factory.mktemp("metrics"), None,
                   extra=(f"observe.metrics_port={port}",)).start()
    try:
        d.wait_ready()
        wait_until(lambda: listening(port), 60, "the metrics endpoint up")
        wait_until(lambda: bool(d.socket_cmd("status")["result"]["model"]["current"]), 60,
                   "the policy model loaded")
        d.port = port  # type: ignore[attr-defined]
        yield d
    finally:
        d.stop()


def test_scrape_has_the_daemons_figures(daemon: DaemonProc) -> None:
    port: int = daemon.port  # type: ignore[attr-defined]
    wait_until(lambda: one(scrape(port)[1], "edge_agent_loop_ticks_total") > 50, 60,
               "the loop ticking")
    # a task: the policy decides (the decision latency histogram by backend), then the e-stop
    assert daemon.socket_cmd("task.start")["ok"]

    def decided() -> int:
        inf = daemon.socket_cmd("status")["result"]["inference"]
        return int(inf["decisions"]) + int(inf["no_decisions"])

    wait_until(lambda: decided() >= 3, 60, "three policy decisions")
    made = decided()
    counts = [s for s in scrape(port)[1] if s.name == "edge_agent_decision_latency_seconds_count"]
    assert sum(s.value for s in counts) >= made, counts
    assert {s.labels["backend"] for s in counts} <= {"triton", "local", "cached", "rule", "none"}
    assert daemon.socket_cmd("estop")["ok"]
    wait_until(lambda: one(scrape(port)[1], "edge_agent_stop_latched") == 1.0, 30, "latched")
    fams, samples = scrape(port)
    st = daemon.socket_cmd("status")["result"]
    assert fams["edge_agent_loop_lateness_seconds"] == "histogram"
    assert fams["edge_agent_estop_reaction_seconds"] == "histogram"
    assert fams["edge_agent_decision_latency_seconds"] == "histogram"
    assert fams["edge_agent_triton_round_trip_seconds"] == "histogram"
    assert fams["edge_agent_stops"] == "counter"
    assert fams["edge_agent_degraded"] == "gauge"
    # the loop's lateness histogram: cumulative, ending in +Inf == count, at least the ticks
    # counted before this scrape's status
    late = buckets(samples, "edge_agent_loop_lateness_seconds")
    assert late[-1][0] == float("inf")
    assert [c for _, c in late] == sorted(c for _, c in late)
    assert late[-1][1] == one(samples, "edge_agent_loop_lateness_seconds_count")
    assert 0.0005 in [le for le, _ in late]  # the lateness target is a bucket edge
    assert late[-1][1] >= one(samples, "edge_agent_loop_ticks_total") - 5
    # the e-stop we sent: counted by cause, its reaction observed, the mode labelled
    assert one(samples, "edge_agent_stops_total", cause="estop_local") == 1.0
    assert one(samples, "edge_agent_estop_reaction_seconds_count") >= 1.0
    assert one(samples, "edge_agent_mode", mode="estop") == 1.0
    # what status says, the scrape says
    assert one(samples, "edge_agent_info", boot_id=st["boot_id"]) == 1.0
    assert one(samples, "edge_agent_link_up") == float(st["link_up"])
    for probe, p in st["health"]["probes"].items():
        level = {"ok": 0, "warn": 1, "error": 2, "stale": 3}[p["level"]]
        if probe != "broker":  # no broker: it may go error -> stale between the two reads
            assert one(samples, "edge_agent_health_probe_level", probe=probe) == level
    for sink in st["reports"]["sinks"]:
        assert one(samples, "edge_agent_reports_total", sink=sink, result="delivered") >= 0
    assert one(samples, "edge_agent_model_info", sha256=st["model"]["current"]["sha256"]) == 1
    segs = list((daemon.state_dir / "journal").glob("*.jnl"))
    assert len(segs) >= 2  # decisions and episodes at least
    assert one(samples, "edge_agent_journal_bytes") == pytest.approx(
        sum(p.stat().st_size for p in segs), abs=4096)


def test_dashboard_names_only_scraped_metrics(daemon: DaemonProc) -> None:
    fams, samples = scrape(daemon.port)  # type: ignore[attr-defined]
    have = set(fams) | {s.name for s in samples}
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    named = {m for e in exprs for m in re.findall(r"edge_agent_[a-z0-9_]+", e)}
    assert len(named) >= 15
    missing = sorted(n for n in named if n not in have and not any(
        n.endswith(x) and n[: -len(x)] in have for x in SUFFIXES))
    assert not missing, f"the dashboard names metrics no scrape has: {missing}"


def test_bound_to_localhost_and_not_imported_without_the_port(daemon: DaemonProc) -> None:
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=False).stdout
    port = daemon.port  # type: ignore[attr-defined]
    listening = [ln for ln in out.splitlines() if re.search(rf":{port}\s", ln)]
    if listening:  # ss present: the one socket is on the loopback address
        assert all("127.0.0.1:" in ln for ln in listening), listening
    code = ("import sys\nimport edge_agent.daemon.app, edge_agent.daemon.observers\n"
            "print([m for m in ('prometheus_client', 'foxglove', 'websockets') "
            "if m in sys.modules])")
    probe = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                           text=True, timeout=60, check=True)
    assert probe.stdout.strip().splitlines()[-1] == "[]"


def test_a_port_in_use_does_not_stop_the_daemon(tmp_path: Path) -> None:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        d = DaemonProc(tmp_path, None,
                       extra=(f"observe.metrics_port={s.getsockname()[1]}",)).start()
        try:
            d.wait_ready()
            wait_until(lambda: bool(d.events("metrics_not_started")), 30, "the error logged")
            assert d.socket_cmd("status")["result"]["link_up"] in (True, False)
            assert not d.exited()
        finally:
            d.stop()
