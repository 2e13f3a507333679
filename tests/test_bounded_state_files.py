"""State-dir files are read with a bound (issue 27 item 1): a file grown past anything the daemon
writes there — the model cache pointer, the outbox's entries and state, the dedup log — is
treated as corrupt (with the path in the log or event) and never read whole. Snapshots have their
own `max_bytes` (tests/test_snapshot*.py), the journal reads long records in pieces
(tests/test_journal.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edge_agent.commands import dedup
from edge_agent.inference.backend import EventBus, EventKind, InferenceEvent
from edge_agent.inference.model_cache import POINTER, POINTER_MAX_BYTES, ModelCache
from edge_agent.reports import outbox
from edge_agent.store.atomic import FileTooLarge, read_capped


def _grow(path: Path, size: int) -> None:
    """A file of `size` bytes, most of it a hole: nothing held here either."""
    with open(path, "wb") as f:
        f.write(b'{"current": "')
        f.truncate(size)


def test_read_capped_reads_up_to_the_bound_and_refuses_past_it(tmp_path: Path) -> None:
    p = tmp_path / "f"
    p.write_bytes(b"x" * 100)
    assert read_capped(p, 100) == b"x" * 100
    with pytest.raises(FileTooLarge, match="over 99 bytes"):
        read_capped(p, 99)
    (tmp_path / "link").symlink_to(p)
    with pytest.raises(OSError):
        read_capped(tmp_path / "link", 100, nofollow=True)


def test_a_huge_model_cache_pointer_is_corrupt_not_read(tmp_path: Path) -> None:
    events: list[InferenceEvent] = []
    cache = ModelCache(tmp_path, EventBus(events.append))
    _grow(tmp_path / POINTER, 512 << 20)  # 512 MB (sparse)
    assert cache.pointer() == {"current": None, "previous": None, "seeded": None}
    (corrupt,) = [e for e in events if e.kind is EventKind.CACHE_CORRUPT]
    assert f"over {POINTER_MAX_BYTES} bytes" in corrupt.detail


def test_an_outbox_entry_over_the_bound_is_set_aside_as_corrupt(tmp_path: Path) -> None:
    box = tmp_path / "outbox"
    box.mkdir()
    big = box / "01M94M737Z2ZF48YXJK82416RH.json"
    _grow(big, outbox.ENTRY_MAX_BYTES + 1)
    _grow(box / outbox.STATE_NAME, 256 << 20)
    ob = outbox.Outbox(box, [], plot=False)
    ob.start()
    try:
        st = ob.status()
        assert st["corrupt"] == 1 and st["dropped"] == 0 and ob.pending_ids() == []
    finally:
        ob.stop()
    assert big.with_suffix(".corrupt").exists() and not big.exists()


def test_a_dedup_log_over_the_bound_is_an_empty_window_with_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from edge_agent.commands.codes import Reply

    path = tmp_path / "dedup.json"
    dedup.JsonFileDedupStore(path).save([dedup.DedupEntry("a", "reset", 1.0,
                                                          Reply.success("a", {}))])
    assert len(dedup.JsonFileDedupStore(path).load()) == 1  # an ordinary file: untouched
    monkeypatch.setattr(dedup, "DEDUP_MAX_BYTES", path.stat().st_size - 1)
    assert dedup.JsonFileDedupStore(path).load() == []


def test_a_model_card_over_the_bound_is_refused_unread(tmp_path: Path) -> None:
    from edge_agent.inference.model_card import CARD_MAX_BYTES, ModelCard, ModelError

    card = tmp_path / "m.card.json"
    _grow(card, 256 << 20)
    with pytest.raises(ModelError, match=f"over {CARD_MAX_BYTES} bytes"):
        ModelCard.load(card)
