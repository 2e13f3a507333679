"""Command handlers: the daemon's side of the in-process command API.

Each handler gets validated arguments and a context (the API already checked admission) and
returns a result dict or raises CommandRefused(code, message).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from edge_agent import __version__
from edge_agent.commands import CommandContext, CommandRefused, ErrorCode
from edge_agent.comms.jsonline import json_line_request
from edge_agent.errors import EdgeAgentError
from edge_agent.executor.latch import ResetRefused
from edge_agent.executor.records import CommandResult
from edge_agent.link.codec import StopReason
from edge_agent.vocab import estop_cause

if TYPE_CHECKING:
    from edge_agent.daemon.app import Daemon

RIG_TARGETS = ("sensor:", "gripper", "collision", "link", "estop")
INFERENCE_TARGETS = ("gpu", "triton")
TASK_WAIT_S = 3.0


def register_handlers(d: Daemon) -> None:
    api = d.api

    def status(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return d.status()

    def estop(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        if ctx.source not in ("mqtt", "fleet", "socket"):
            # (the transports already called on_estop for this very message)
            d.estop(estop_cause(ctx.source))
        # The reply goes out only once the latch is on disk (or the store says it failed).
        d.save_snapshot()
        persisted = d.writer.flush(timeout=1.0)
        return {"latched": True, "kind": "estop", "persisted": persisted}

    def reset(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        if not d.latch.latched:  # diagnostic → idle, or a no-op
            return _run(lambda now: d.executor.reset(now))
        try:
            d.latch.check_reset()
        except ResetRefused as exc:
            raise CommandRefused(ErrorCode(exc.code), exc.message) from exc
        g = d.guardian
        if g is not None:
            sent_at = d.clock.now()  # the mirror stamps G_STATEs with this clock
            g.reset()
            answer = d.mirror.wait_gstate(sent_at, timeout=1.0, pred=lambda s: (
                not s.latched or s.cause == StopReason.RESET_REFUSED))
            if answer is None:
                raise CommandRefused(ErrorCode.TIMEOUT,
                                     "the link guardian did not confirm the reset within 1 s")
            if answer.latched:
                code = ErrorCode.ESTOP_ACTIVE if answer.estop_input else ErrorCode.CAUSE_PRESENT
                why = ("the hardware e-stop input is active" if answer.estop_input
                       else "the link guardian refused: the serial link is down")
                raise CommandRefused(code, f"reset refused by the link guardian: {why}")
        # A reset only permits motion: nothing moves until a new command (the executor drops
        # every setpoint on the latch's new generation; the guardian wants a fresh ENABLE).
        out = _run(lambda now: d.executor.reset(now))
        return {"reset": True, **out}

    def _run(fn: Callable[[float], CommandResult], *, enable: bool = False) -> dict[str, Any]:
        with d.exec_lock:
            res = fn(d.clock.now())
            if res.ok and enable:
                d.enable_drives()  # before the next tick's first setpoint
        d.publisher.state_changed()
        if not res.ok:
            try:
                code = ErrorCode(res.code or "refused")
            except ValueError:
                code = ErrorCode.REFUSED
            raise CommandRefused(code, res.message)
        out = dict(res.result)
        if res.message:
            out["note"] = res.message
        out.setdefault("mode", d.executor.mode)
        return out

    def task_start(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        params = args.get("params") or {}
        # Just after start-up (or a link recovery) the first measurement may be a few ticks
        # away (and the camera's first object pose): a task that arrives then waits for them
        # (bounded) instead of being refused.
        deadline = time.monotonic() + TASK_WAIT_S
        def ready() -> bool:
            ex = d.executor
            return ex.has_measurement and ("object" in params or ex.object_estimate is not None)

        while not ready() and time.monotonic() < deadline:
            time.sleep(0.01)
        # ... and for its policy model, when one is configured and still loading
        model_ready = d.policy.wait(d.cfg.inference.model_wait_s)
        task_id = f"{ctx.id}"
        out = _run(lambda now: d.executor.start_task(
            now, task_id, args.get("task", "pick_place"), params.get("object"),
            params.get("place")), enable=True)
        out["policy"] = d.policy.in_use()
        if not model_ready:
            late = (f"the policy model was not ready within {d.cfg.inference.model_wait_s:g} s: "
                    f"decisions from {d.policy.in_use()} until it is")
            out["note"] = f"{out['note']}; {late}" if out.get("note") else late
        return out

    def task_cancel(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return _run(lambda now: d.executor.cancel(now))

    def resume(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return _run(lambda now: d.executor.resume(now, args.get("task_id")), enable=True)

    def manual_enter(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return _run(lambda now: d.executor.manual_enter(now), enable=True)

    def manual_jog(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return _run(lambda now: d.executor.manual_jog(now, args["dq"], int(args["ttl_ms"])))

    def manual_exit(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return _run(lambda now: d.executor.manual_exit(now))

    def failure_inject(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        target = str(args.get("target", ""))
        if target == "control_loop":  # lifecycle helper: make the watchdog's pings stop
            if d.loop is None:
                raise CommandRefused(ErrorCode.REFUSED, "the control loop is not running")
            d.loop.hang_for_test(args.get("mode") == "hang")
            return {"injected": {"target": target, "mode": args.get("mode")}}
        if target in INFERENCE_TARGETS:  # the policy stack's own faults (inference/assembly.py)
            return {"injected": _inject_inference(d, target, args)}
        if not target.startswith(RIG_TARGETS):
            raise CommandRefused(ErrorCode.NOT_IMPLEMENTED,
                                 f"failure target {target!r} has no injector in this daemon yet")
        if d.rig is None:
            raise CommandRefused(ErrorCode.REFUSED, "rig faults need the simulated robot (--sim)")
        req = {"cmd": "inject", "target": target, "mode": args.get("mode")}
        for k in ("duration_s", "severity"):
            if args.get(k) is not None:
                req[k] = args[k]
        resp = rig_request(str(d.rig.control_socket), req)
        if not resp.get("ok"):
            raise CommandRefused(ErrorCode.BAD_ARGS, f"the rig refused: {resp.get('error')}")
        return {"injected": req, "rig": {k: v for k, v in resp.items() if k != "ok"}}

    def model_update(args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        from edge_agent.inference.model_card import ModelError

        why = d.policy.unavailable()
        if why is not None:
            raise CommandRefused(ErrorCode.REFUSED, f"model.update refused: {why}")
        try:
            out = d.policy.update_model(args["uri"], args["sha256"], args.get("version"))
        except ValueError as exc:
            raise CommandRefused(ErrorCode.BAD_ARGS, str(exc)) from exc
        except ModelError as exc:  # the cache is unchanged: the model in use stays
            why = str(exc)
            raise CommandRefused(ErrorCode.REFUSED, why if why.startswith("model rejected")
                                 else f"model rejected: {why}") from exc
        d.publisher.state_changed()
        return out

    api.register("status", status)
    api.register("model.update", model_update)
    api.register("estop", estop)
    api.register("reset", reset)
    api.register("failure.inject", failure_inject)
    api.register("task.start", task_start)
    api.register("task.cancel", task_cancel)
    api.register("resume", resume)
    api.register("manual.enter", manual_enter)
    api.register("manual.jog", manual_jog)
    api.register("manual.exit", manual_exit)


def _inject_inference(d: Daemon, target: str, args: dict[str, Any]) -> dict[str, Any]:
    """failure.inject gpu fail / triton down, for duration_s (required: no mode ends them)."""
    stack = d.policy.stack
    if stack is None:
        raise CommandRefused(ErrorCode.REFUSED, f"{target} faults need the policy model stack: "
                             f"{d.policy.unavailable() or 'not built'}")
    if args.get("duration_s") is None:
        raise CommandRefused(ErrorCode.BAD_ARGS, f"{target} {args.get('mode')} needs duration_s")
    try:
        return stack.inject(target, str(args.get("mode")), float(args["duration_s"]))
    except ValueError as exc:
        raise CommandRefused(ErrorCode.REFUSED, str(exc)) from exc


def rig_request(path: str, req: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """One request to the simulated robot's control socket; failures become an error reply."""
    try:
        return json_line_request(path, req, timeout, what=str(req.get("cmd")))
    except EdgeAgentError as exc:
        return {"ok": False, "error": f"rig control socket {path}: {exc}"}


def status_payload(d: Daemon) -> dict[str, Any]:
    now = time.monotonic()
    return {
        "device": d.cfg.device.id, "version": __version__, "boot_id": d.boot_id,
        "uptime_s": round(now - d.started_mono, 3), "startup_ms": d.startup_ms,
        "link_up_ms": d.link_up_ms,
        "config_hash": d.cfg.hash, "sim": d.sim, **d.publisher.build_state(),
        "executor": d.executor.status(),
        "journal": d.decisions.stats() if d.decisions is not None else None,
        "inference": d.policy.status(),
        "link": {**d.mirror.summary(), "watch": d.watch.summary()},
        "reports": d.reports.status(),
        "loop": {**d.loop.stats.as_dict(), "rate_hz": round(1.0 / d.loop.period, 3),
                 "scheduling": d.loop.scheduling,
                 "reader_scheduling": d.guardian.reader_scheduling if d.guardian else None,
                 "output_at_deadline": d.output.at_deadline,
                 "sent_at_once": d.output.sent_at_once, "gc": d.gc_stats.as_dict()}
        if d.loop else None,
        # connected with the command subscription granted: a command published now is received
        "background": d.background, "mqtt_connected": bool(
            d.publisher.bridge is not None and d.publisher.bridge.ready),
        # not connected is visible here with its reason (a TLS file, a refused login, ...)
        "mqtt": d.publisher.mqtt_status(),
        # every probe: level, message, figures, strikes, next run (health/monitor.py)
        "health": d.health.status() if d.health is not None else None,
    }
