"""`model.shadow` on a real daemon (--sim, the trained model acting, a private broker with the
shipped ACL): refusals name the problem; the shipped model shadowing itself agrees on every
decision it made itself; a different candidate runs beside it through a task, its decisions are
journalled in the shadow journal (never in the acting one), `status.model.shadow` carries the
agreement and latency per state, a report is filed after `inference.shadow_report_after`
decisions and another when an operator stops it over MQTT (with `shadow_stopped`)."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from conftest import MQTT_USERS
from daemon_proc import JOURNAL_TASK_SETS, REPO, DaemonProc, wait_ready_for_tasks
from inference_models import make_policy
from mosquitto import Mosquitto, Probe, wait_until

from edge_agent.comms.mqtt_common import Topics
from edge_agent.store.decisions import SHADOW_NAME, journal_dir, read_decisions

T1 = Topics("edge/dev1")  # its command and reply topics

SHIPPED = REPO / "models" / "pick-place-policy.onnx"
REPORT_AFTER = 60


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _shadow(d: DaemonProc) -> dict[str, Any] | None:
    out = d.socket_cmd("status")["result"]["model"]["shadow"]
    assert out is None or isinstance(out, dict)
    return out


def _task(d: DaemonProc) -> None:
    r = d.socket_cmd("task.start", {"task": "pick_place"}, timeout=30)
    assert r["ok"], r
    wait_until(lambda: d.socket_cmd("status")["result"]["mode"] != "running", 120, "task end")


def _reports(d: DaemonProc) -> list[dict[str, Any]]:
    out = []
    for p in sorted((d.state_dir / "reports").glob("*.json")):
        rep = json.loads(p.read_text())
        if rep["kind"] == "shadow":
            out.append(rep)
    return out


def _payload(msg: Any) -> dict[str, Any]:
    out = json.loads(msg.payload)
    assert isinstance(out, dict)
    return out


def test_shadow_candidates_beside_the_acting_policy(tmp_path: Path, broker: Mosquitto) -> None:
    drop = tmp_path / "drop"  # inference.update_dir: model.shadow reads from here as update does
    drop.mkdir(mode=0o755)
    same = drop / "same.onnx"  # a copy of the shipped model (and its card)
    shutil.copyfile(SHIPPED, same)
    shutil.copyfile(SHIPPED.with_suffix(".card.json"), same.with_suffix(".card.json"))
    cand = make_policy(drop, "candidate", seed=7, version="candidate-7")
    op = Probe(broker, "operator", MQTT_USERS["operator"])
    assert op.connect() == 0
    op.subscribe("edge/dev1/#")
    d = DaemonProc(tmp_path, broker, extra=(
        f"inference.update_dir={drop}", f"inference.shadow_report_after={REPORT_AFTER}",
        *JOURNAL_TASK_SETS)).start()
    try:
        d.wait_ready()
        wait_ready_for_tasks(d)
        assert _shadow(d) is None
        # refusals, with what is wrong
        bad = d.socket_cmd("model.shadow", {"uri": str(cand), "sha256": "0" * 64})
        assert not bad["ok"] and bad["error"]["code"] == "refused", bad
        assert "sha256 mismatch" in bad["error"]["message"]
        out = d.socket_cmd("model.shadow", {"uri": str(tmp_path / "x.onnx"), "sha256": "0" * 64})
        assert not out["ok"] and out["error"]["code"] == "bad_args"
        assert "model.shadow reads only files directly inside" in out["error"]["message"], out
        idle = d.socket_cmd("model.shadow", {"stop": True})
        assert idle["ok"] and idle["result"]["stopped"] is False, idle

        # the shipped model against itself, started with the CLI (it finds the daemon's socket)
        rc, ok = _cli("model", "shadow", str(same), "--sha256", _sha(same))
        assert rc == 0 and ok["ok"], ok
        assert ok["result"]["shadow"]["sha256"] == ok["result"]["acting"]["sha256"]
        again = d.socket_cmd("model.shadow", {"uri": str(cand), "sha256": _sha(cand)})
        assert not again["ok"] and again["error"]["code"] == "busy", again
        _task(d)
        wait_until(lambda: (_shadow(d) or {}).get("queued") == 0, 30, "the shadow caught up")
        s = _shadow(d)
        assert s is not None and s["active"] and s["decisions"] >= REPORT_AFTER, s
        # every decision the shipped model made itself agreed (under load a decision may fall
        # back to the rule backend: those may differ, and say so)
        rc, reply = _cli("model", "shadow", "--stop")
        stopped = reply["result"]
        assert rc == 0 and stopped["stopped"] and stopped["report"], stopped
        examples = _reports_wait(d, 2)[-1]["details"]["examples"]
        assert all(e["acting_backend"] != "local" for e in examples), examples
        assert s["agreement"] >= 0.9 and set(s["per_state"]) >= {"approach"}, s
        assert s["latency"]["shadow_p99_ms"] is not None and s["dropped"] == 0, s

        # a different candidate: started here, a task, then an operator stops it over MQTT
        ok = d.socket_cmd("model.shadow", {"uri": cand.as_uri(), "sha256": _sha(cand)},
                          timeout=30)
        assert ok["ok"] and ok["result"]["shadow"]["version"] == "candidate-7", ok
        busy_task = d.socket_cmd("task.start", {"task": "pick_place"}, timeout=30)
        assert busy_task["ok"], busy_task
        mid = d.socket_cmd("model.shadow", {"stop": True})
        assert not mid["ok"] and mid["error"]["code"] == "busy", mid  # between tasks
        wait_until(lambda: d.socket_cmd("status")["result"]["mode"] != "running", 120, "end")
        wait_until(lambda: len(_reports(d)) >= 3, 60, "the report after N decisions")
        after = _reports(d)[-1]
        assert after["details"]["why"] == "after" and after["details"]["decisions"] >= \
            REPORT_AFTER and after["details"]["candidate"]["version"] == "candidate-7"
        wait_until(lambda: (_shadow(d) or {}).get("queued") == 0, 30, "the shadow caught up")
        s = _shadow(d)
        assert s is not None and s["candidate"]["version"] == "candidate-7"
        assert all(0 <= v["agreement"] <= 1 for v in s["per_state"].values()), s

        op.publish(T1.cmd("model.shadow"), json.dumps({"v": 1, "id": "sh-stop",
                                                              "stop": True}))
        reply = _payload(op.expect(lambda m: m.topic == T1.reply("model.shadow")
                                   and _payload(m).get("id") == "sh-stop", timeout=30))
        assert reply["ok"] and reply["result"]["stopped"], reply
        ev = _payload(op.expect(lambda m: m.topic == "edge/dev1/event"
                                and _payload(m).get("type") == "shadow_stopped"
                                and _payload(m)["candidate"]["version"] == "candidate-7",
                                timeout=30))
        assert ev["decisions"] == reply["result"]["decisions"] and ev["report"]
        rep = _payload(op.expect(lambda m: m.topic == "edge/dev1/report"
                                 and _payload(m).get("id") == ev["report"], timeout=60))
        assert rep["kind"] == "shadow" and "## Confusion" in rep["markdown"], rep["title"]
        last = _shadow(d)
        assert last is not None and last["active"] is False and last["reports_filed"] == 4
        started = [e for e in d.events("event") if e.get("type") == "shadow_started"]
        assert [e["candidate"]["version"] for e in started] == ["1.0.0", "candidate-7"]
    finally:
        assert d.stop() == 0
    op.close()

    # the shadow journal has both candidates' decisions with the acting task ids; the acting
    # journal (what the export, drift and episodes read) has none of them
    j = journal_dir(d.state_dir)
    shadow = list(read_decisions(j, SHADOW_NAME))
    assert {r.backend for r in shadow} == {f"shadow:{_sha(same)[:12]}",
                                           f"shadow:{_sha(cand)[:12]}"}
    assert all(r.task_id is not None and r.outcome in ("agree", "differ") for r in shadow)
    assert not any((r.backend or "").startswith("shadow") for r in read_decisions(j))


def _cli(*args: str) -> tuple[int, dict[str, Any]]:
    p = subprocess.run([sys.executable, "-m", "edge_agent.cli", *args, "--device", "dev1",
                        "--json", "--timeout", "30"], cwd=REPO, capture_output=True, text=True,
                       timeout=60)
    out = json.loads(p.stdout)
    assert isinstance(out, dict), p.stderr
    return p.returncode, out


def _reports_wait(d: DaemonProc, n: int) -> list[dict[str, Any]]:
    wait_until(lambda: len(_reports(d)) >= n, 60, f"{n} shadow reports on disk")
    return _reports(d)


def test_with_trusted_keys_only_a_signed_candidate_shadows(tmp_path: Path) -> None:
    """As model.update: an unsigned candidate is refused, naming why; a signed one runs."""
    from edge_agent.inference.model_card import ModelCard, card_path_for
    from edge_agent.inference.model_signing import generate_key, sign_card

    pem, public = generate_key()
    drop = tmp_path / "drop"
    drop.mkdir(mode=0o755)
    shipped = tmp_path / "shipped.onnx"  # the acting model, signed
    shutil.copyfile(SHIPPED, shipped)
    shutil.copyfile(SHIPPED.with_suffix(".card.json"), card_path_for(shipped))
    unsigned = make_policy(drop, "unsigned", seed=5)
    signed = make_policy(drop, "signed", seed=7, version="7.0.0")
    for m in (shipped, signed):
        card_path_for(m).write_text(sign_card(ModelCard.load(card_path_for(m)), pem).dumps())
    d = DaemonProc(tmp_path, None, extra=(
        f"inference.model={shipped}", f"inference.update_dir={drop}",
        f'inference.trusted_keys=["{public}"]')).start()
    try:
        d.wait_ready()
        wait_until(lambda: (d.socket_cmd("status")["result"]["inference"] or {}).get("model")
                   is not None, 60, "the signed model loaded")
        r = d.socket_cmd("model.shadow", {"uri": str(unsigned), "sha256": _sha(unsigned)},
                         timeout=30)
        assert not r["ok"] and r["error"]["code"] == "refused", r
        assert "unsigned: the card has no signature" in r["error"]["message"], r
        assert _shadow(d) is None
        ok = d.socket_cmd("model.shadow", {"uri": str(signed), "sha256": _sha(signed)},
                          timeout=30)
        assert ok["ok"] and ok["result"]["shadow"]["version"] == "7.0.0", ok
        s = _shadow(d)
        assert s is not None and s["active"] and s["candidate"]["sha256"] == _sha(signed)
    finally:
        assert d.stop() == 0
    # a restart drops the shadow (it lives in memory only): start it again after one
    d = DaemonProc(tmp_path, None, extra=(
        f"inference.model={shipped}", f"inference.update_dir={drop}",
        f'inference.trusted_keys=["{public}"]')).start()
    try:
        d.wait_ready()
        assert _shadow(d) is None
    finally:
        assert d.stop() == 0
