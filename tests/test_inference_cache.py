"""The model cache: verified install, atomic swap, rollback, corrupt files, crash safety."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from inference_models import ROOT, bare_scores, bare_session, make_policy, observations, wait_for

from edge_agent.inference.assembly import (
    ACTION_LABELS,
    OBS_FIELD_UNITS,
    InferenceSettings,
    InferenceStack,
)
from edge_agent.inference.backend import EventBus, EventKind, InferenceEvent
from edge_agent.inference.model_cache import POINTER, ModelCache
from edge_agent.inference.model_card import ModelCard, ModelError, card_path_for, sha256_file


def _cache(d: Path, events: list[InferenceEvent] | None = None) -> ModelCache:
    bus = EventBus(events.append if events is not None else None)
    return ModelCache(d / "models", bus, fields=OBS_FIELD_UNITS, labels=ACTION_LABELS)


def _card(model: Path) -> ModelCard:
    return ModelCard.load(card_path_for(model))


def test_install_verifies_and_activates_and_keeps_the_previous(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    cache = _cache(tmp_path, events)
    a, b = make_policy(tmp_path, "a", seed=1), make_policy(tmp_path, "b", seed=2)
    ea = cache.install(a, _card(a))
    assert cache.current() == ea and cache.previous() is None
    eb = cache.install(b.read_bytes(), _card(b))  # bytes work as well as a path
    assert cache.current() == eb and cache.previous() == ea
    assert eb.path.read_bytes() == b.read_bytes() and eb.card.version == _card(b).version
    assert sorted(p.name for p in cache.dir.iterdir()) == sorted(
        [POINTER, f"{ea.sha256}.onnx", f"{ea.sha256}.card.json",
         f"{eb.sha256}.onnx", f"{eb.sha256}.card.json"])
    assert [e.kind for e in events] == [EventKind.MODEL_INSTALLED] * 2
    # a third model drops the oldest: only current + previous are kept
    c = make_policy(tmp_path, "c", seed=3)
    cache.install(c, _card(c))
    assert not ea.path.exists() and cache.previous() == eb


def test_rollback_swaps_current_and_previous(tmp_path: Path) -> None:
    cache = _cache(tmp_path)
    a, b = make_policy(tmp_path, "a", seed=1), make_policy(tmp_path, "b", seed=2)
    ea, eb = cache.install(a, _card(a)), cache.install(b, _card(b))
    assert cache.rollback() == ea
    assert cache.current() == ea and cache.previous() == eb
    empty = _cache(tmp_path / "other")
    with pytest.raises(ModelError, match="no previous"):
        empty.rollback()


@pytest.mark.parametrize("case", ["sha_card", "sha_command", "not_onnx", "nan", "shape",
                                  "fields", "labels"])
def test_bad_models_are_rejected_and_the_current_one_stays(tmp_path: Path, case: str) -> None:
    events: list[InferenceEvent] = []
    cache = _cache(tmp_path, events)
    good = make_policy(tmp_path, "good", seed=1)
    current = cache.install(good, _card(good))
    new = make_policy(tmp_path, "new", seed=2)
    card, data, sha = _card(new), new.read_bytes(), None
    if case == "sha_card":
        data = data[:-1] + bytes([data[-1] ^ 1])  # a flipped bit in transit
    elif case == "sha_command":
        sha = "0" * 64
    elif case == "not_onnx":
        data = b"\x08\x07garbage" * 50
        card = card.with_identity(__import__("hashlib").sha256(data).hexdigest())
    elif case == "nan":
        bad = make_policy(tmp_path, "nan", nan=True)
        data, card = bad.read_bytes(), _card(bad)
    else:
        raw = card.as_json()
        if case == "shape":
            raw["outputs"][0]["shape"] = [None, 5]
        elif case == "fields":
            raw["inputs"][0]["fields"][3]["name"] = "something_else"
        else:
            raw["outputs"][0]["labels"] = ["continue", "advance", "abort", "retry_alternative"]
        card = ModelCard.parse(raw)
    with pytest.raises(ModelError, match="model rejected"):
        cache.install(data, card, sha256=sha)
    assert cache.current() == current and cache.previous() is None
    assert events[-1].kind is EventKind.MODEL_REJECTED
    assert sorted(p.name for p in cache.dir.iterdir()) == sorted(
        [POINTER, current.path.name, card_path_for(current.path).name])


def test_a_corrupted_cached_model_is_not_used_and_the_previous_one_is(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    cache = _cache(tmp_path, events)
    a, b = make_policy(tmp_path, "a", seed=1), make_policy(tmp_path, "b", seed=2)
    ea, eb = cache.install(a, _card(a)), cache.install(b, _card(b))
    raw = bytearray(eb.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF  # bit rot on disk
    eb.path.write_bytes(bytes(raw))
    assert cache.current() is None
    assert cache.last_known_good() == ea
    assert EventKind.CACHE_CORRUPT in [e.kind for e in events]
    eb.path.unlink()
    assert cache.last_known_good() == ea


def test_a_garbled_pointer_reads_as_an_empty_cache(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    cache = _cache(tmp_path, events)
    a = make_policy(tmp_path, "a", seed=1)
    cache.install(a, _card(a))
    (cache.dir / POINTER).write_text("{not json")
    assert cache.current() is None and events[-1].kind is EventKind.CACHE_CORRUPT
    cache.install(a, _card(a))  # and a new install repairs it
    assert cache.current() is not None


def test_seed_keeps_an_update_across_restarts_until_a_new_model_is_deployed(
        tmp_path: Path) -> None:
    shipped = make_policy(tmp_path / "ship", "policy", seed=1)
    cache = _cache(tmp_path)
    first = cache.seed(shipped)
    assert first is not None and cache.current() == first
    update = make_policy(tmp_path / "upd", "policy", seed=2)
    updated = cache.install(update, _card(update))
    assert _cache(tmp_path).seed(shipped) == updated  # a restart keeps the update
    redeployed = make_policy(tmp_path / "ship", "policy", seed=3)
    assert _cache(tmp_path).seed(redeployed).sha256 == sha256_file(redeployed)  # type: ignore[union-attr]


def test_a_model_without_a_card_gets_a_derived_one(tmp_path: Path) -> None:
    model = make_policy(tmp_path, "bare", seed=4)
    card_path_for(model).unlink()
    entry = _cache(tmp_path).install(model, None, sha256=sha256_file(model), version="7")
    assert entry.card.version == "7" and entry.card.extra.get("derived") is True
    assert entry.card.inputs[0].shape[-1] == len(OBS_FIELD_UNITS)


def test_model_update_reloads_local_and_keeps_the_old_one_as_cached(tmp_path: Path) -> None:
    shipped = make_policy(tmp_path / "ship", "policy", seed=1)
    stack = InferenceStack(InferenceSettings(model=shipped, cache_dir=tmp_path / "state" / "m",
                                             update_dir=tmp_path / "upd"))
    stack.load()
    assert stack.router.ready() and stack.load_s is not None
    new = make_policy(tmp_path / "upd", "policy", seed=2, version="2.0.0")
    entry = stack.update_model(str(new), sha256_file(new))
    assert stack.status()["model"]["version"] == "2.0.0"  # type: ignore[index]
    assert stack.local.model_path == entry.path
    assert stack.cached.model_path is not None
    assert sha256_file(stack.cached.model_path) == sha256_file(shipped)  # last known good
    obs = observations(20)
    s_new, s_old = bare_session(new), bare_session(shipped)
    for o in obs:
        assert stack.local.submit(o.vector).scores == pytest.approx(bare_scores(s_new, o),
                                                                    abs=1e-6)
        assert stack.cached.submit(o.vector).scores == pytest.approx(bare_scores(s_old, o),
                                                                     abs=1e-6)
    with pytest.raises(ModelError):
        stack.update_model(str(new), "f" * 64)
    stack.stop()
    stack.stop()


_CRASHER = textwrap.dedent("""
    import sys
    from pathlib import Path
    from edge_agent.inference.model_cache import ModelCache
    from edge_agent.inference.model_card import ModelCard, card_path_for
    d, models = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    cache = ModelCache(d)
    cards = [ModelCard.load(card_path_for(m)) for m in models]
    datas = [m.read_bytes() for m in models]
    i = 0
    while True:
        cache.install(datas[i % 2], cards[i % 2])
        i += 1
""")


def test_killing_an_install_at_any_moment_leaves_a_verified_model(tmp_path: Path) -> None:
    a, b = make_policy(tmp_path, "a", seed=1), make_policy(tmp_path, "b", seed=2)
    shas = {sha256_file(a), sha256_file(b)}
    rng = random.Random(7)
    for round_ in range(6):
        d = tmp_path / f"cache{round_}"
        p = subprocess.Popen([sys.executable, "-c", _CRASHER, str(d), str(a), str(b)],
                             cwd=ROOT, stdout=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
        try:
            wait_for(lambda d=d: (d / POINTER).exists(), 60.0, "the first install")  # type: ignore[misc]
            time.sleep(rng.uniform(0.0, 0.2))  # a random kill point inside the install loop
            assert p.poll() is None
        finally:
            p.send_signal(signal.SIGKILL)
            p.wait(10)
        cur = ModelCache(d).current()
        assert cur is not None and cur.sha256 in shas


def test_status_reads_the_current_model_without_hashing_it_each_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`status` is polled: the model is verified again only when its files change (or after
    STATUS_REVERIFY_S), and a model.update or a corrupted file is seen at once."""
    import edge_agent.inference.model_cache as mc

    events: list[InferenceEvent] = []
    cache = _cache(tmp_path, events)
    a, b = make_policy(tmp_path, "a", seed=1), make_policy(tmp_path, "b", seed=2)
    ea = cache.install(a, _card(a))
    hashed: list[Path] = []
    real = mc.sha256_file
    monkeypatch.setattr(mc, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert cache.current_for_status() == ea and len(hashed) == 1
    for _ in range(5):
        assert cache.current_for_status() == ea
    assert len(hashed) == 1  # the files did not change: no new hash
    eb = cache.install(b, _card(b))  # model.update swaps the pointer
    assert cache.current_for_status() == eb
    raw = bytearray(eb.path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    eb.path.write_bytes(bytes(raw))
    os.utime(eb.path, ns=(time.time_ns(), time.time_ns() + 1_000_000))  # a visible change
    assert cache.current_for_status() is None
    assert EventKind.CACHE_CORRUPT in [e.kind for e in events]
    eb.path.write_bytes(b.read_bytes())
    os.utime(eb.path, ns=(time.time_ns(), time.time_ns() + 2_000_000))
    assert cache.current_for_status() == eb
    # bit rot that keeps size and mtime is found by the periodic re-verification
    st = eb.path.stat()
    eb.path.write_bytes(bytes(raw))
    os.utime(eb.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cache.current_for_status() == eb  # inside the window: the memo answers
    monkeypatch.setattr(mc, "STATUS_REVERIFY_S", 0.0)
    assert cache.current_for_status() is None
