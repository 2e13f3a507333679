"""The in-process command API: parse → dedup → expiry → freshness → admission → handler → Reply.

MQTT, the local control socket and tests all call `CommandAPI.handle`. It never raises: every
problem becomes an error reply. Thread-safe: it is called from the bridge's worker, the socket
threads and paho's thread. Commands other than `estop` run one at a time (admission and handler
form one step); `estop` bypasses that lock, the dedup window and expiry, and runs even when its
payload is malformed — it must never wait behind a slow handler or be refused on a technicality.
Freshness (commands/freshness.py) is checked in the same step as admission: a motion command that
arrived before the latest stop or reset is refused `stale` when its turn comes.
"""

from __future__ import annotations

import errno
import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from edge_agent.clock import Clock, MonotonicClock
from edge_agent.commands.admission import Admission, AdmissionContext, Verdict, admit
from edge_agent.commands.codes import CommandRefused, Reply
from edge_agent.commands.dedup import DedupEntry, DedupStore, DedupWindow
from edge_agent.commands.freshness import Epoch, Freshness
from edge_agent.commands.schema import (
    COMMANDS,
    Limits,
    ParsedCommand,
    PayloadError,
    decode,
    parse,
    recover_id,
)
from edge_agent.log import get_logger
from edge_agent.observe import channels as obs
from edge_agent.observe.tap import TAP
from edge_agent.vocab import ErrorCode, Mode

_log = get_logger(__name__)

Payload = Mapping[str, Any] | bytes | bytearray | str
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _disk_full(exc: BaseException) -> bool:
    """The save found no room (the store wraps the OSError): storage_low's business, not a bug."""
    cause = exc if isinstance(exc, OSError) else exc.__cause__
    return isinstance(cause, OSError) and cause.errno in _NO_SPACE
# Deduplicated in memory only (never written to disk): re-running them is harmless, and a jog
# stream at 20 Hz must not turn into 20 fsyncs a second or push task commands out of the window.
EPHEMERAL = frozenset({"status", "manual.jog"})


@dataclass(frozen=True)
class CommandContext:
    """What a handler learns besides its validated arguments."""

    command: str
    id: str
    source: str  # "mqtt", "fleet", "socket", "test", ...
    mode: Mode
    admission: Admission
    received_at: float  # the API clock (monotonic) when handle() was entered


Handler = Callable[[dict[str, Any], CommandContext], Mapping[str, Any] | None]


class CommandAPI:
    """Validates, deduplicates and admits commands, then runs the registered handler."""

    def __init__(
        self,
        mode_provider: Callable[[], Mode | str],
        *,
        dedup_store: DedupStore | None = None,
        dedup_window_s: float = 600.0,
        dedup_max_entries: int = 4096,
        reset_min_interval_s: float = 1.0,
        failure_injection: bool = False,
        limits: Limits | None = None,
        clock: Clock | None = None,
        wall_clock: Callable[[], float] = time.time,
        duplicate_wait_s: float = 30.0,
        freshness: Freshness | None = None,
    ) -> None:
        self._mode_provider = mode_provider
        self._store = dedup_store
        self._store_failed = False
        self._limits = limits or Limits()
        self._clock: Clock = clock or MonotonicClock()
        self._wall = wall_clock
        self._ctx = AdmissionContext(failure_injection=failure_injection)
        self._reset_min_interval_s = reset_min_interval_s
        self._last_reset: float | None = None
        self._duplicate_wait_s = duplicate_wait_s
        self._freshness = freshness
        self._handlers: dict[str, Handler] = {}
        self._lock = threading.Lock()  # dedup window, in-flight ids, counters
        self._done = threading.Condition(self._lock)
        self._exec_lock = threading.RLock()  # admission + handler of non-estop commands
        self._save_lock = threading.Lock()  # saves happen in order, newest snapshot last
        self._inflight: set[str] = set()
        self._window = DedupWindow(window_s=dedup_window_s, max_entries=dedup_max_entries)
        self._ephemeral = DedupWindow(window_s=min(dedup_window_s, 60.0), max_entries=512)
        self.counters: dict[str, int] = {"handled": 0, "duplicates": 0, "errors": 0,
                                         "internal": 0, "expired": 0, "stale": 0,
                                         "store_failures": 0, "store_full": 0}
        self._store_full = False  # the last save found the disk full (logged once per spell)
        if dedup_store is not None:
            self._window.load(dedup_store.load(), self._wall())

    def register(self, name: str, handler: Handler) -> None:
        """Install the handler for a command named in DESIGN.md; one handler per command."""
        if name not in COMMANDS:
            raise ValueError(f"unknown command {name!r} (known: {', '.join(COMMANDS)})")
        self._handlers[name] = handler

    @property
    def limits(self) -> Limits:
        return self._limits

    def epoch(self) -> Epoch | None:
        """The stop epoch now: a transport notes it when a command arrives (`handle(arrived=)`)."""
        return self._freshness.epoch() if self._freshness is not None else None

    def dedup_size(self) -> int:
        """Entries in the persisted window (EPHEMERAL commands are kept apart, in memory)."""
        with self._lock:
            return len(self._window)

    def handle(self, name: str, payload: Payload, *, source: str,
               deadline: float | None = None, arrived: Epoch | None = None) -> Reply:
        """Run one command and return its reply. `deadline` is on the API clock (MQTT expiry);
        `arrived` is the stop epoch when the transport received it (default: now)."""
        received = self._clock.now()
        if arrived is None:
            arrived = self.epoch()
        try:
            reply = self._handle(name, payload, source, deadline, received, arrived)
        except Exception as exc:  # last resort: handle() never raises
            _log.exception("command_internal_error", command=name, source=source)
            reply = Reply.failure(None, ErrorCode.INTERNAL, f"internal error: {type(exc).__name__}")
        with self._lock:
            self.counters["handled"] += 1
            if not reply.ok:
                self.counters["errors"] += 1
                if reply.code is ErrorCode.INTERNAL:
                    self.counters["internal"] += 1
                elif reply.code is ErrorCode.EXPIRED:
                    self.counters["expired"] += 1
                elif reply.code is ErrorCode.STALE:
                    self.counters["stale"] += 1
        if TAP.active:
            TAP.publish(obs.COMMANDS, {"command": name, "id": reply.id, "source": source,
                                       "reply": reply.to_dict()})
        return reply

    def _handle(self, name: str, payload: Payload, source: str, deadline: float | None,
                received: float, arrived: Epoch | None) -> Reply:
        try:
            if name not in COMMANDS:
                raise PayloadError(ErrorCode.UNKNOWN_COMMAND, f"unknown command {name!r}",
                                   self._id_of(payload))
            parsed = parse(name, decode(payload, self._limits), self._limits)
        except PayloadError as exc:
            if name == "estop":  # a malformed e-stop still stops
                return self._run_estop(ParsedCommand(exc.command_id or "", {}, None), source,
                                       received, payload_error=exc.message)
            _log.warning("command_rejected", command=name, source=source, id=exc.command_id,
                         code=exc.code.value, why=exc.message)
            return Reply.failure(exc.command_id, exc.code, exc.message)
        if name == "estop":
            return self._run_estop(parsed, source, received)
        return self._run_once(name, parsed, source, deadline, received, arrived)

    def _id_of(self, payload: Payload) -> str | None:
        if isinstance(payload, Mapping):
            raw = payload.get("id")
            return raw if isinstance(raw, str) and 0 < len(raw) <= self._limits.max_id_len else None
        return recover_id(payload)

    def _run_estop(self, parsed: ParsedCommand, source: str, received: float,
                   payload_error: str | None = None) -> Reply:
        cid = parsed.id or None
        mode = self._current_mode_or_estop()
        adm = admit("estop", mode, self._ctx)
        reply = self._call("estop", parsed, source, adm, received)
        if payload_error is not None and reply.ok:
            reply = Reply.success(cid, {**(reply.result or {}), "payload_error": payload_error})
        _log.info("estop_command", source=source, id=cid, ok=reply.ok)
        return Reply(cid, reply.ok, reply.result, reply.error)

    def _current_mode_or_estop(self) -> Mode:
        try:
            return Mode(self._mode_provider())
        except Exception:  # the e-stop runs whatever the mode provider says
            _log.exception("mode_provider_failed")
            return Mode.ESTOP

    def _run_once(self, name: str, parsed: ParsedCommand, source: str, deadline: float | None,
                  received: float, arrived: Epoch | None) -> Reply:
        cid = parsed.id
        with self._lock:
            limit = time.monotonic() + self._duplicate_wait_s  # a real wait on another thread
            while cid in self._inflight:  # the same id is running in another thread
                if not self._done.wait(timeout=max(0.0, limit - time.monotonic())):
                    return Reply.failure(cid, ErrorCode.BUSY, "a command with this id is running")
            now_wall = self._wall()
            seen = self._window.get(cid, now_wall) or self._ephemeral.get(cid, now_wall)
            if seen is not None:
                if seen.command != name:
                    return Reply.failure(cid, ErrorCode.DUPLICATE_ID,
                                         f"id already used for {seen.command}")
                self.counters["duplicates"] += 1
                _log.info("command_duplicate", command=name, id=cid, source=source)
                return seen.reply
            self._inflight.add(cid)
        reply = Reply.failure(cid, ErrorCode.INTERNAL, "internal error")
        try:
            with self._exec_lock:
                reply = self._admit_and_run(name, parsed, source, deadline, received, arrived)
        finally:
            self._remember(name, cid, reply)
        return reply

    def _admit_and_run(self, name: str, parsed: ParsedCommand, source: str,
                       deadline: float | None, received: float, arrived: Epoch | None) -> Reply:
        cid = parsed.id
        now = self._clock.now()
        if deadline is not None and now > deadline:
            return Reply.failure(cid, ErrorCode.EXPIRED,
                                 f"message expired {now - deadline:.3f} s before processing")
        if parsed.expires_at is not None and self._wall() > parsed.expires_at:
            return Reply.failure(cid, ErrorCode.EXPIRED, "expires_at is in the past")
        if self._freshness is not None:
            stale = self._freshness.check(name, parsed.ts, arrived)
            if stale is not None:
                _log.warning("command_stale", command=name, id=cid, source=source,
                             code=stale.code.value, why=stale.message)
                return Reply.failure(cid, stale.code, stale.message)
        try:
            mode = Mode(self._mode_provider())
        except Exception as exc:
            _log.exception("mode_provider_failed", command=name)
            return Reply.failure(cid, ErrorCode.INTERNAL, f"mode unknown: {type(exc).__name__}")
        adm = admit(name, mode, self._ctx)
        if not adm.admitted:
            _log.info("command_refused", command=name, id=cid, mode=mode.value,
                      code=adm.code.value if adm.code else None)
            return Reply.failure(cid, adm.code or ErrorCode.NOT_ADMITTED, adm.message)
        if adm.verdict is Verdict.NOOP:
            return Reply.success(cid, {"noop": True, "mode": mode.value, "note": adm.message})
        if name == "reset":
            if (self._last_reset is not None
                    and now - self._last_reset < self._reset_min_interval_s):
                return Reply.failure(cid, ErrorCode.RATE_LIMITED,
                                     f"reset at most once per {self._reset_min_interval_s:g} s")
            self._last_reset = now
        return self._call(name, parsed, source, adm, received)

    def _call(self, name: str, parsed: ParsedCommand, source: str, adm: Admission,
              received: float) -> Reply:
        cid = parsed.id or None
        handler = self._handlers.get(name)
        if handler is None:
            return Reply.failure(cid, ErrorCode.NOT_IMPLEMENTED, f"no handler for {name}")
        ctx = CommandContext(name, parsed.id, source, adm.mode, adm, received)
        try:
            result = handler(dict(parsed.args), ctx)
            if result is not None and not isinstance(result, Mapping):
                raise TypeError(f"handler returned {type(result).__name__}, not a mapping")
            json.dumps(result)  # the reply must be serialisable by every transport
        except CommandRefused as exc:
            _log.info("command_refused", command=name, id=cid, code=exc.code.value,
                      why=exc.message)
            return Reply.failure(cid, exc.code, exc.message)
        except Exception as exc:
            _log.exception("command_handler_failed", command=name, id=cid, source=source)
            return Reply.failure(cid, ErrorCode.INTERNAL,
                                 f"{name} handler failed: {type(exc).__name__}")
        return Reply.success(cid, result)

    def _remember(self, name: str, cid: str, reply: Reply) -> None:
        now = self._wall()
        ephemeral = name in EPHEMERAL
        with self._lock:
            window = self._ephemeral if ephemeral else self._window
            window.put(DedupEntry(cid, name, now, reply), now)
            self._inflight.discard(cid)
            self._done.notify_all()
        if self._store is None or ephemeral:
            return
        with self._save_lock:
            with self._lock:
                if self._store_failed:
                    return
                snapshot = self._window.entries()
            try:
                self._store.save(snapshot)
            except Exception as exc:
                if _disk_full(exc):
                    # A full disk is transient (storage_low): one warning per spell, no
                    # traceback; the store stays in use and its next save rewrites the window.
                    with self._lock:
                        self.counters["store_full"] += 1
                        first, self._store_full = not self._store_full, True
                    if first:
                        _log.warning("dedup_store_failed", reason="disk_full", error=str(exc))
                    return
                # An fsync failure is fatal for that file (REQUIREMENTS 16): stop using it.
                _log.exception("dedup_store_failed")
                with self._lock:
                    self._store_failed = True
                    self.counters["store_failures"] += 1
                return
            if self._store_full:
                self._store_full = False
                _log.info("dedup_store_resumed", skipped=self.counters["store_full"])
