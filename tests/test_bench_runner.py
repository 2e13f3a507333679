"""`python -m hil.bench` and `python -m hil.bench_page` without running a benchmark: the page
renders a small fixture JSON (tables, plots, the soak and footprint sections), `--list` names
every bench, every hil/bench_*.py is run or excluded with a reason, and each bench's quick and
full arguments (with `--json`) parse with that bench's own parser."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hil import bench, bench_page
from hil.bench_stats import figure, target
from hil.bench_suite import AREAS, BENCHES, EXCLUDED, by_name

REPO = Path(__file__).resolve().parents[1]


def _fixture() -> dict[str, Any]:
    lat = [0.1 + 0.001 * k for k in range(300)]
    base = [0.05 + 0.001 * k for k in range(300)]
    est = figure("hardware e-stop, daemon up", "ms", lat, baseline=("bare pty round trip", base),
                 samples=True, tgt=target("P99 ≤ 0.3 ms", 0.3, 0.398), notes="presses 300")
    loop = figure("control loop 500 Hz", "ms", [0.01, 0.02, 0.5],
                  baseline=("bare loop", [0.01, 0.01, 0.02]),
                  series=[(0.002 * k, 0.01 + (k % 7) * 0.01) for k in range(50)],
                  tgt=target("P99 ≤ 0.5 ms", 0.5, 0.5))
    tri = figure("Triton loopback decision", "ms", [], skipped="no server here")
    for f in (est, loop, tri):
        f.update(steal_pct=1.5, wall_s=12.0)
    est["bench"], loop["bench"], tri["bench"] = "daemon_estop", "control_loop", "inference"

    def run(name: str, area: str, figs: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
        return {"name": name, "module": f"hil.bench_{name}", "area": area, "what": "",
                "argv": ["-m", f"hil.bench_{name}", "--n", "3", "--json", "/tmp/x.json"],
                "load_before": [2.5, 1.0, 0.5], "load_after": [2.7, 1.1, 0.5],
                "figures": figs, "wall_s": 12.0, "rc": 0, "steal_pct": 1.5, "log": "/tmp/l",
                **kw}

    return {"kind": "quick", "started_utc": "2026-12-06T09:00:00+00:00", "short": "abc1234",
            "commit": "abc1234" * 5, "subject": "a commit", "dirty": True, "wall_s": 60.0,
            "machine": {"cpu": "AMD EPYC", "cores": 2, "kernel": "Linux 6", "python": "3.11.7",
                        "onnxruntime": "1.32.0", "load_before": [2.5, 1.0, 0.5],
                        "load_after": [2.7, 1.1, 0.5], "steal_pct": 1.2},
            "benches": [run("daemon_estop", "E-stop", [est]),
                        run("control_loop", "Control loop", [loop]),
                        run("inference", "Inference", [tri]),
                        run("shadow", "Observers (on vs off)", [], rc=1, error="exit code 1",
                            output_tail=["Traceback", "SystemExit: the daemon exited"])]}


def test_page_renders_a_fixture(tmp_path: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    src = results / "bench-2026-12-06-abc1234-quick.json"
    src.write_text(json.dumps(_fixture()))
    soak_md = "### One hour\n\nRSS slope 0.4 MB/h.\n\n![rss](perf/soak-rss.png)"
    (results / "soak.json").write_text(json.dumps({"markdown": soak_md, "rss_mb": [1, 2]}))
    (results / "footprint-x.json").write_text(json.dumps({"rss_mb": 93.5, "wheel_kb": 512,
                                                          "ok": True, "name": "x"}))
    doc = tmp_path / "docs" / "PERFORMANCE.md"
    (tmp_path / "docs" / "perf").mkdir(parents=True)
    (tmp_path / "docs" / "perf" / "soak-rss.png").write_bytes(b"png")  # another helper's
    (tmp_path / "docs" / "perf" / "bench-stale.png").write_bytes(b"png")  # an old run's
    assert bench_page.latest(results) == src
    bench_page.render(src, doc)
    text = doc.read_text()
    assert "python -m hil.bench --quick --page" in text and "python -m hil.bench_page" in text
    assert "| CPU | AMD EPYC, 2 cores |" in text and "`abc1234` (uncommitted" in text
    assert "## E-stop" in text and "## Control loop" in text and "## Fleet" not in text
    assert ("| hardware e-stop, daemon up (ms) | 300 | 0.25 | 0.397 | 0.399 | "
            "bare pty round trip: 0.2 / 0.347 | 1.14 (P99) | P99 ≤ 0.3 ms | **no** | 1.5 % | "
            "12 s |") in text
    assert "| control loop 500 Hz (ms) | 3 |" in text and "**yes**" in text
    assert "skipped: no server here" in text
    assert "`hil.bench_shadow` failed (exit code 1)" in text and "the daemon exited" in text
    assert "Targets met: 1 of 2" in text
    assert "## Soak\n\n" + soak_md + "\n" in text
    assert "## Footprint" in text and "| rss_mb | 93.5 |" in text and "| ok |" not in text
    pngs = sorted(p.name for p in (tmp_path / "docs" / "perf").iterdir())
    assert "bench-stale.png" not in pngs and "soak-rss.png" in pngs
    assert any(p.startswith("bench-daemon_estop-") and p.endswith("-cdf.png") for p in pngs)
    assert any(p.startswith("bench-control_loop-") and p.endswith("-time.png") for p in pngs)
    for png in pngs:
        if png.startswith("bench-"):
            assert f"(perf/{png})" in text
            assert (tmp_path / "docs" / "perf" / png).read_bytes()[:4] == b"\x89PNG"


def test_a_partial_run_is_marked_on_the_page(tmp_path: Path) -> None:
    """hil.bench writes its JSON after each bench with `partial` until the last one ends (a run
    stopped midway keeps what it measured); the page says the run is partial."""
    r = _fixture()
    r["partial"] = "1 of 2 benches: the run stopped after link_reader"
    src = tmp_path / "bench-2026-12-07-abc1234.json"
    src.write_text(json.dumps(r))
    doc = tmp_path / "docs" / "PERFORMANCE.md"
    (tmp_path / "docs" / "perf").mkdir(parents=True)
    bench_page.render(src, doc)
    assert "| partial run | 1 of 2 benches: the run stopped after link_reader |" in doc.read_text()


def test_footprint_markdown_is_used_verbatim(tmp_path: Path) -> None:
    (tmp_path / "footprint.json").write_text(json.dumps({"markdown": "| a | b |\n", "x": 1}))
    assert bench_page.footprint_section(tmp_path) == ["## Footprint", "", "| a | b |", ""]
    assert bench_page.soak_section(tmp_path) == []


def test_list_names_every_bench(capsys: pytest.CaptureFixture[str]) -> None:
    assert bench.main(["--list"]) == 0
    out = capsys.readouterr().out
    for b in BENCHES:
        assert f"{b.name} " in out and b.module in out
    assert "(full run only)" in out
    assert {b.area for b in BENCHES} <= set(AREAS)
    assert "fleet_estop" not in {b.name for b in by_name(None, quick=True)}
    assert [b.name for b in by_name("relay,startup", quick=True)] == ["relay", "startup"]
    with pytest.raises(SystemExit, match="unknown bench"):
        by_name("nope", quick=True)


def test_every_bench_module_is_run_or_excluded_with_a_reason() -> None:
    modules = {f"hil.{p.stem}" for p in (REPO / "hil").glob("bench_*.py")}
    run = {b.module for b in BENCHES}
    assert not run & set(EXCLUDED), run & set(EXCLUDED)
    assert modules == run | set(EXCLUDED), (
        f"not in hil/bench_suite.py: {sorted(modules - run - set(EXCLUDED))}; "
        f"gone: {sorted((run | set(EXCLUDED)) - modules)}")
    assert all(len(why) > 20 for why in EXCLUDED.values())
    assert len({b.name for b in BENCHES}) == len(BENCHES)


def test_each_bench_parses_its_quick_and_full_arguments() -> None:
    jobs = [[b.module, [*(b.quick if q else b.full), "--json", "out.json"], "parse"]
            for b in BENCHES for q in (True, False)]
    out = subprocess.run([sys.executable, str(REPO / "tests" / "doc_argv_check.py")],
                         input=json.dumps(jobs), capture_output=True, text=True, cwd=REPO,
                         timeout=240, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    bad = [(j[0], j[1], r["error"]) for j, r in zip(jobs, json.loads(out.stdout), strict=True)
           if not r["ok"]]
    assert not bad, bad


def test_a_bench_daemon_dies_with_its_bench(tmp_path: Path) -> None:
    """A bench starts its daemons in sessions of their own (`hil.daemon_proc.with_parent`): a
    bench killed with SIGKILL, before any `finally` of its could stop them, takes them along."""
    code = ("import subprocess, sys, time\n"
            "from hil.daemon_proc import with_parent\n"
            "p = subprocess.Popen(with_parent([sys.executable, '-c', 'import time; "
            "print(\"up\", flush=True); time.sleep(120)']), start_new_session=True)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(120)\n")
    bench_proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                  text=True, cwd=REPO)
    assert bench_proc.stdout is not None
    # the bench's pid line, and the child's own "up" (its stdout is the bench's): the child
    # runs Python, so setpriv has armed the signal (killed before that, setpriv would arm it
    # after its parent is gone, and no signal comes: a microsecond window, seen once on CI)
    lines = {bench_proc.stdout.readline().strip(), bench_proc.stdout.readline().strip()}
    assert "up" in lines, lines
    child = int((lines - {"up"}).pop())
    try:
        os.kill(child, 0)  # running, in a session of its own
        assert os.getsid(child) == child
        bench_proc.kill()
        bench_proc.wait(10)
        for _ in range(200):
            try:
                os.kill(child, 0)
            except ProcessLookupError:
                break
            with open(f"/proc/{child}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    break  # exited, not yet reaped by init
            time.sleep(0.05)
        else:
            pytest.fail(f"the bench's child {child} outlived the bench by 10 s")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, 9)
