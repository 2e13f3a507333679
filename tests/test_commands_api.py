"""CommandAPI: dedup (also across a restart), estop bypass, expiry, rate limit, errors, threads."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edge_agent.clock import ManualClock
from edge_agent.commands import (
    COMMANDS,
    CommandAPI,
    CommandContext,
    CommandRefused,
    ErrorCode,
    JsonFileDedupStore,
    MemoryDedupStore,
    Mode,
    Reply,
)


class Rig:
    """A CommandAPI with counting handlers and a settable mode."""

    def __init__(self, **kwargs: Any) -> None:
        self.mode = Mode.IDLE
        self.calls: list[tuple[str, dict[str, Any], CommandContext]] = []
        self.clock = kwargs.pop("clock", ManualClock(100.0))
        self.api = CommandAPI(lambda: self.mode, clock=self.clock, **kwargs)
        for name in COMMANDS:
            self.api.register(name, self._handler(name))

    def _handler(self, name: str) -> Any:
        def run(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
            self.calls.append((name, args, ctx))
            return {"ran": name, "n": len(self.calls)}
        return run

    def count(self, name: str) -> int:
        return sum(1 for c in self.calls if c[0] == name)


def cmd(cid: str, **args: Any) -> bytes:
    return json.dumps({"v": 1, "id": cid, **args}).encode()


def test_reply_shape() -> None:
    rig = Rig()
    reply = rig.api.handle("status", cmd("s1"), source="test")
    assert reply.to_dict() == {"v": 1, "id": "s1", "ok": True, "result": {"ran": "status", "n": 1}}
    ctx = rig.calls[0][2]
    assert (ctx.command, ctx.id, ctx.source, ctx.mode) == ("status", "s1", "test", Mode.IDLE)
    bad = rig.api.handle("status", b"{", source="test").to_dict()
    assert bad["ok"] is False and bad["error"]["code"] == "bad_json" and "result" not in bad


def test_duplicate_id_runs_once_and_is_answered_twice() -> None:
    rig = Rig()
    first = rig.api.handle("task.start", cmd("t1"), source="mqtt")
    second = rig.api.handle("task.start", cmd("t1"), source="mqtt")
    assert first == second and first.ok
    assert rig.count("task.start") == 1
    assert rig.api.counters["duplicates"] == 1
    other = rig.api.handle("task.cancel", cmd("t1"), source="mqtt")
    assert other.code is ErrorCode.DUPLICATE_ID and rig.count("task.cancel") == 0


def test_refusals_are_remembered_too() -> None:
    rig = Rig()
    rig.mode = Mode.RUNNING
    assert rig.api.handle("task.start", cmd("busy1"), source="t").code is ErrorCode.BUSY
    rig.mode = Mode.IDLE  # the duplicate is the same message: it gets the same answer
    assert rig.api.handle("task.start", cmd("busy1"), source="t").code is ErrorCode.BUSY
    assert rig.count("task.start") == 0


def test_dedup_window_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "dedup.json"
    rig = Rig(dedup_store=JsonFileDedupStore(path))
    assert rig.api.handle("task.start", cmd("keep"), source="t").ok
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    again = Rig(dedup_store=JsonFileDedupStore(path))  # a new process, same state dir
    reply = again.api.handle("task.start", cmd("keep"), source="t")
    assert reply.ok and reply.result == {"ran": "task.start", "n": 1}
    assert again.count("task.start") == 0


def test_dedup_window_expires_by_age_and_count(tmp_path: Path) -> None:
    wall = [1000.0]
    store = MemoryDedupStore()
    rig = Rig(dedup_store=store, dedup_window_s=60, dedup_max_entries=3,
              wall_clock=lambda: wall[0])
    rig.mode = Mode.RUNNING  # task.cancel is admitted (not a no-op) while running
    rig.api.handle("task.cancel", cmd("a"), source="t")
    wall[0] += 61
    rig.api.handle("task.cancel", cmd("a"), source="t")  # past the window: runs again
    assert rig.count("task.cancel") == 2
    for i in range(5):
        rig.api.handle("task.cancel", cmd(f"n{i}"), source="t")
    assert rig.api.dedup_size() == 3 and len(store.entries) == 3


def test_status_and_jog_are_deduplicated_in_memory_but_never_persisted() -> None:
    saves: list[int] = []

    class Counting(MemoryDedupStore):
        def save(self, entries: Any) -> None:
            saves.append(len(entries))
            super().save(entries)

    store = Counting()
    rig = Rig(dedup_store=store)
    rig.mode = Mode.MANUAL
    for _ in range(2):
        assert rig.api.handle("status", cmd("st"), source="t").ok
        assert rig.api.handle("manual.jog", cmd("j1", ttl_ms=100, dq=[0.1]), source="t").ok
    assert rig.count("status") == 1 and rig.count("manual.jog") == 1
    assert saves == [] and store.entries == []
    assert rig.api.handle("manual.exit", cmd("x"), source="t").ok
    assert saves == [1] and [e.id for e in store.entries] == ["x"]


def test_each_command_appends_one_line_and_the_log_is_compacted_at_twice_the_window(
        tmp_path: Path) -> None:
    """The window is not rewritten per command (that re-encoded up to max_entries replies each
    time, with the GIL held): one fsync'd line is appended; at twice the window (+64) the file
    is rewritten with the live window only, and a new process loads exactly that window."""
    path = tmp_path / "dedup.json"
    rig = Rig(dedup_store=JsonFileDedupStore(path), dedup_max_entries=5)
    rig.mode = Mode.RUNNING  # task.cancel admitted
    rig.api.handle("task.cancel", cmd("c0"), source="t")  # the first save writes the file
    inode, lines = os.stat(path).st_ino, len(path.read_text().splitlines())
    for i in range(1, 20):
        rig.api.handle("task.cancel", cmd(f"c{i}"), source="t")
        assert len(path.read_text().splitlines()) == lines + i
    assert os.stat(path).st_ino == inode  # appended, never replaced so far
    sizes = []
    for i in range(20, 200):
        rig.api.handle("task.cancel", cmd(f"c{i}"), source="t")
        sizes.append(len(path.read_text().splitlines()))
    assert max(sizes) <= 2 * 5 + 64 + 1
    assert min(sizes) == 5  # compacted to the live window (atomically: tmp + os.replace)
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    again = Rig(dedup_store=JsonFileDedupStore(path), dedup_max_entries=5)
    again.mode = Mode.RUNNING
    for i in range(195, 200):  # the last five are answered from the window, not run again
        assert again.api.handle("task.cancel", cmd(f"c{i}"), source="t").ok
    assert again.count("task.cancel") == 0
    assert again.api.handle("task.cancel", cmd("c194"), source="t").ok
    assert again.count("task.cancel") == 1  # pruned by count: runs


def test_an_old_one_object_file_and_a_torn_last_line_are_read_then_rewritten(
        tmp_path: Path) -> None:
    path = tmp_path / "dedup.json"
    old = {"v": 1, "entries": [{"id": "old1", "command": "task.start", "ts": 1e12,
                                "reply": {"id": "old1", "ok": True, "result": {"n": 7}}}]}
    path.write_text(json.dumps(old))
    rig = Rig(dedup_store=JsonFileDedupStore(path), wall_clock=lambda: 1e12)
    r = rig.api.handle("task.start", cmd("old1"), source="t")
    assert r.ok and r.result == {"n": 7} and rig.count("task.start") == 0
    rig.mode = Mode.RUNNING
    rig.api.handle("task.cancel", cmd("new1"), source="t")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [x["id"] for x in rows] == ["old1", "new1"]  # now one entry a line
    with open(path, "a") as f:
        f.write('{"id": "torn", "comm')  # a crash in the middle of an append
    again = Rig(dedup_store=JsonFileDedupStore(path), wall_clock=lambda: 1e12)
    assert again.api.handle("task.start", cmd("old1"), source="t").result == {"n": 7}
    again.mode = Mode.RUNNING
    again.api.handle("task.cancel", cmd("new2"), source="t")
    rows = [json.loads(line) for line in path.read_text().splitlines()]  # all lines parse
    assert [x["id"] for x in rows] == ["old1", "new1", "new2"]


def test_corrupt_dedup_file_is_an_empty_window(tmp_path: Path) -> None:
    path = tmp_path / "dedup.json"
    path.write_bytes(b'{"v":1,"entries":[{"id":"x"}, 5, {"id": "y", "command": "status", '
                     b'"ts": 1e12, "reply": {"id": "y", "ok": true, "result": {}}}]}')
    rig = Rig(dedup_store=JsonFileDedupStore(path), wall_clock=lambda: 1e12)
    assert rig.api.handle("status", cmd("y"), source="t").ok and rig.count("status") == 0
    path.write_bytes(b"\x00garbage")
    assert JsonFileDedupStore(path).load() == []


def test_store_failure_is_logged_and_commands_still_answer(tmp_path: Path) -> None:
    class Broken:
        def load(self) -> list[Any]:
            return []

        def save(self, entries: Any) -> None:
            raise OSError("fsync failed")

    rig = Rig(dedup_store=Broken())
    assert rig.api.handle("task.cancel", cmd("a"), source="t").ok
    assert rig.api.handle("task.cancel", cmd("b"), source="t").ok
    assert rig.api.counters["store_failures"] == 1  # not retried: fatal for that file


def test_estop_is_never_deduplicated_nor_expired_and_runs_on_garbage() -> None:
    rig = Rig()
    for _ in range(3):
        assert rig.api.handle("estop", cmd("e1"), source="mqtt").ok
    assert rig.count("estop") == 3
    assert rig.api.handle("estop", cmd("e2", expires_at=1.0), source="mqtt",
                          deadline=rig.clock.now() - 10).ok
    reply = rig.api.handle("estop", b"\x00not json", source="fleet")
    assert reply.ok and "payload_error" in (reply.result or {})
    assert rig.count("estop") == 5


def test_estop_runs_while_another_command_holds_the_lock() -> None:
    rig = Rig()
    release, entered = threading.Event(), threading.Event()

    def slow(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        entered.set()
        assert release.wait(10)
        return {}

    rig.api.register("task.start", slow)
    t = threading.Thread(target=rig.api.handle, args=("task.start", cmd("slow")),
                         kwargs={"source": "t"})
    t.start()
    assert entered.wait(10)
    assert rig.api.handle("estop", cmd("e"), source="mqtt").ok  # does not wait for "slow"
    release.set()
    t.join(10)


def test_expired_commands_are_refused() -> None:
    rig = Rig()
    now = rig.clock.now()
    assert rig.api.handle("status", cmd("late"), source="mqtt", deadline=now - 0.1).code \
        is ErrorCode.EXPIRED
    assert rig.api.handle("status", cmd("ok"), source="mqtt", deadline=now + 1).ok
    assert rig.api.handle("status", cmd("past", expires_at=1.0), source="t").code \
        is ErrorCode.EXPIRED
    assert rig.count("status") == 1 and rig.api.counters["expired"] == 2


def test_reset_is_rate_limited() -> None:
    rig = Rig(reset_min_interval_s=1.0)
    rig.mode = Mode.ESTOP
    assert rig.api.handle("reset", cmd("r1"), source="t").ok
    rig.clock.advance(0.5)
    assert rig.api.handle("reset", cmd("r2"), source="t").code is ErrorCode.RATE_LIMITED
    rig.clock.advance(0.6)
    assert rig.api.handle("reset", cmd("r3"), source="t").ok
    assert rig.count("reset") == 2
    rig.mode = Mode.IDLE  # a no-op reset is answered without calling the handler
    reply = rig.api.handle("reset", cmd("r4"), source="t")
    assert reply.ok and reply.result and reply.result["noop"] is True
    assert rig.count("reset") == 2


def test_handler_refusal_and_crash_become_replies() -> None:
    rig = Rig()

    def refuse(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        raise CommandRefused(ErrorCode.OUT_OF_WORKSPACE, "object at z=-0.2 is below the table")

    def crash(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        raise ZeroDivisionError("boom")

    rig.api.register("task.start", refuse)
    rig.api.register("status", crash)
    r = rig.api.handle("task.start", cmd("a"), source="t")
    assert r.code is ErrorCode.OUT_OF_WORKSPACE and "below the table" in r.error.message  # type: ignore[union-attr]
    r = rig.api.handle("status", cmd("b"), source="t")
    assert r.code is ErrorCode.INTERNAL and "ZeroDivisionError" in r.error.message  # type: ignore[union-attr]
    rig.api.register("status", lambda a, c: {"not": {1, 2}})  # type: ignore[arg-type,return-value]
    assert rig.api.handle("status", cmd("c"), source="t").code is ErrorCode.INTERNAL
    assert CommandRefused("made_up", "x").code is ErrorCode.REFUSED


def test_mode_provider_failure() -> None:
    def broken() -> Mode:
        raise RuntimeError("executor gone")

    api = CommandAPI(broken)
    api.register("estop", lambda a, c: {"tripped": True})
    assert api.handle("status", cmd("a"), source="t").code is ErrorCode.INTERNAL
    assert api.handle("estop", cmd("b"), source="t").ok  # the e-stop runs anyway


def test_unregistered_and_unknown() -> None:
    api = CommandAPI(lambda: Mode.IDLE)
    assert api.handle("status", cmd("a"), source="t").code is ErrorCode.NOT_IMPLEMENTED
    assert api.handle("fly", cmd("b"), source="t").code is ErrorCode.UNKNOWN_COMMAND
    with pytest.raises(ValueError):
        api.register("fly", lambda a, c: None)


def test_failure_inject_needs_the_switch() -> None:
    body = cmd("f", target="gpu", mode="fail")
    assert Rig().api.handle("failure.inject", body, source="t").code is ErrorCode.DISABLED
    assert Rig(failure_injection=True).api.handle("failure.inject", body, source="t").ok


def test_same_id_from_many_threads_runs_once() -> None:
    rig = Rig()
    gate = threading.Event()

    def slowish(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        gate.wait(10)
        rig.calls.append(("task.start", args, ctx))
        return {"n": 1}

    rig.api.register("task.start", slowish)
    replies: list[Reply] = []
    threads = [threading.Thread(target=lambda: replies.append(
        rig.api.handle("task.start", cmd("same"), source="t"))) for _ in range(8)]
    for t in threads:
        t.start()
    gate.set()
    for t in threads:
        t.join(10)
    assert len(replies) == 8 and all(r.ok and r.result == {"n": 1} for r in replies)
    assert rig.count("task.start") == 1


payloads = st.one_of(
    st.binary(max_size=200),
    st.text(max_size=200),
    st.dictionaries(st.text(max_size=10), st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda i: st.lists(i, max_size=3) | st.dictionaries(st.text(max_size=5), i, max_size=3),
        max_leaves=12), max_size=6),
    st.builds(lambda cid, extra: json.dumps({"v": 1, "id": cid, **extra}),
              st.text(min_size=0, max_size=140),
              st.dictionaries(st.sampled_from(["ttl_ms", "dq", "params", "target", "mode"]),
                              st.integers() | st.lists(st.floats(), max_size=4), max_size=3)),
)


@settings(deadline=None, max_examples=int(os.environ.get("EDGE_HYPOTHESIS_EXAMPLES", "200")))
@given(name=st.sampled_from([*COMMANDS, "nope", ""]), payload=payloads,
       mode=st.sampled_from(list(Mode)))
def test_random_payloads_never_raise(name: str, payload: Any, mode: Mode) -> None:
    rig = Rig(failure_injection=True)
    rig.mode = mode
    reply = rig.api.handle(name, payload, source="fuzz")
    assert isinstance(reply, Reply)
    json.dumps(reply.to_dict())
    assert reply.ok or reply.code is not ErrorCode.INTERNAL


def test_a_full_disk_is_counted_and_the_window_is_saved_again_once_there_is_room() -> None:
    """storage_low: ENOSPC is transient, not the fatal fsync failure above — every command still
    answers, the store stays in use, and the first save after the disk has room again
    persists the whole window (the file is rewritten)."""
    import errno

    from edge_agent.errors import StoreError

    class Full:
        def __init__(self) -> None:
            self.full = True
            self.saved: list[int] = []

        def load(self) -> list[Any]:
            return []

        def save(self, entries: Any) -> None:
            if self.full:
                raise StoreError("dedup window x: no room") from OSError(
                    errno.ENOSPC, "No space left on device")
            self.saved.append(len(entries))

    store = Full()
    rig = Rig(dedup_store=store)
    assert rig.api.handle("task.cancel", cmd("a"), source="t").ok
    assert rig.api.handle("task.cancel", cmd("b"), source="t").ok
    assert rig.api.counters["store_full"] == 2 and rig.api.counters["store_failures"] == 0
    store.full = False
    assert rig.api.handle("task.cancel", cmd("c"), source="t").ok
    assert store.saved == [3], store.saved  # a, b and c: nothing lost from the window
