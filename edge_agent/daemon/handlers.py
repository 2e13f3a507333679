"""Command handlers: the daemon's side of the in-process command API.

Each handler gets validated arguments and a context (the API already checked admission) and
returns a result dict or raises CommandRefused(code, message). `CommandHandlers` gets the parts
it drives (the control path, the link mirror, the policy loader) and the daemon's few actions as
callables; `register(api)` installs one handler per command.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from edge_agent.commands import CommandAPI, CommandContext, CommandRefused, ErrorCode
from edge_agent.comms.jsonline import json_line_request
from edge_agent.daemon.control import ControlPath
from edge_agent.daemon.linkmirror import LinkMirror
from edge_agent.daemon.policy_loader import PolicyLoader
from edge_agent.daemon.simrig import SimRig
from edge_agent.errors import EdgeAgentError
from edge_agent.executor.latch import ResetRefused
from edge_agent.executor.records import CommandResult
from edge_agent.link.codec import StopReason
from edge_agent.vocab import StopCause, estop_cause

if TYPE_CHECKING:
    from edge_agent.contract.status import StatusResult

RIG_TARGETS = ("sensor:", "gripper", "collision", "link", "estop")
INFERENCE_TARGETS = ("gpu", "triton", "model")
TASK_WAIT_S = 3.0


class CommandHandlers:
    """The handlers; `persist_latch()` saves the snapshot and waits (bounded) for the disk."""

    def __init__(self, control: ControlPath, mirror: LinkMirror, policy: PolicyLoader, *,
                 status: Callable[[], StatusResult], estop: Callable[[StopCause], None],
                 persist_latch: Callable[[], bool], state_changed: Callable[[], None],
                 rig: SimRig | None, model_wait_s: float) -> None:
        self.control = control
        self.mirror = mirror
        self.policy = policy
        self._status = status
        self._estop = estop
        self._persist_latch = persist_latch
        self._state_changed = state_changed
        self.rig = rig
        self.model_wait_s = model_wait_s

    def register(self, api: CommandAPI) -> None:
        for name, fn in (("status", self.status), ("model.update", self.model_update),
                         ("model.shadow", self.policy.shadow.command),
                         ("estop", self.estop), ("reset", self.reset),
                         ("failure.inject", self.failure_inject),
                         ("task.start", self.task_start), ("task.cancel", self.task_cancel),
                         ("resume", self.resume), ("manual.enter", self.manual_enter),
                         ("manual.jog", self.manual_jog), ("manual.exit", self.manual_exit)):
            api.register(name, fn)

    def status(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return cast("dict[str, Any]", self._status())  # a reply's result: any JSON object

    def estop(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        if ctx.source not in ("mqtt", "fleet", "socket"):
            # (the transports already called on_estop for this very message)
            self._estop(estop_cause(ctx.source))
        # The reply goes out only once the latch is on disk (or the store says it failed).
        persisted = self._persist_latch()
        return {"latched": True, "kind": "estop", "persisted": persisted}

    def reset(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        c = self.control
        if not c.latch.latched:  # diagnostic → idle, or a no-op
            return self._run(lambda now: c.executor.reset(now))
        try:
            c.latch.check_reset()
        except ResetRefused as exc:
            raise CommandRefused(ErrorCode(exc.code), exc.message) from exc
        g = c.guardian
        if g is not None:
            sent_at = c.clock.now()  # the mirror stamps G_STATEs with this clock
            g.reset()
            answer = self.mirror.wait_gstate(sent_at, timeout=1.0, pred=lambda s: (
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
        out = self._run(lambda now: c.executor.reset(now))
        return {"reset": True, **out}

    def _run(self, fn: Callable[[float], CommandResult], *, enable: bool = False
             ) -> dict[str, Any]:
        res = self.control.run(fn, enable=enable)
        self._state_changed()
        if not res.ok:
            try:
                code = ErrorCode(res.code or "refused")
            except ValueError:
                code = ErrorCode.REFUSED
            raise CommandRefused(code, res.message)
        out = dict(res.result)
        if res.message:
            out["note"] = res.message
        out.setdefault("mode", self.control.executor.mode)
        return out

    def task_start(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        params = args.get("params") or {}
        ex = self.control.executor
        # Just after start-up (or a link recovery) the first measurement may be a few ticks
        # away (and the camera's first object pose): a task that arrives then waits for them
        # (bounded, woken by the control ticks) instead of being refused.
        self.control.wait_until(lambda: ex.has_measurement and (
            "object" in params or ex.object_estimate is not None), TASK_WAIT_S)
        # ... and for its policy model, when one is configured and still loading
        model_ready = self.policy.wait(self.model_wait_s)
        task_id = f"{ctx.id}"
        out = self._run(lambda now: ex.start_task(
            now, task_id, args.get("task", "pick_place"), params.get("object"),
            params.get("place")), enable=True)
        out["policy"] = self.policy.in_use()
        if not model_ready:
            late = (f"no policy model is ready (its load failed, or is not done after "
                    f"{self.model_wait_s:g} s): decisions from {self.policy.in_use()} until one "
                    "is")
            out["note"] = f"{out['note']}; {late}" if out.get("note") else late
        return out

    def task_cancel(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return self._run(lambda now: self.control.executor.cancel(now))

    def resume(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return self._run(lambda now: self.control.executor.resume(now, args.get("task_id")),
                         enable=True)

    def manual_enter(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return self._run(lambda now: self.control.executor.manual_enter(now), enable=True)

    def manual_jog(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return self._run(lambda now: self.control.executor.manual_jog(
            now, args["dq"], int(args["ttl_ms"])))

    def manual_exit(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        return self._run(lambda now: self.control.executor.manual_exit(now))

    def failure_inject(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        target = str(args.get("target", ""))
        if target == "control_loop":  # make the watchdog's pings stop
            loop = self.control.loop
            if loop is None:
                raise CommandRefused(ErrorCode.REFUSED, "the control loop is not running")
            loop.hang_for_test(args.get("mode") == "hang")
            return {"injected": {"target": target, "mode": args.get("mode")}}
        if target in INFERENCE_TARGETS:  # the policy stack's own faults (inference/assembly.py)
            return {"injected": self._inject_inference(target, args)}
        if not target.startswith(RIG_TARGETS):
            raise CommandRefused(ErrorCode.NOT_IMPLEMENTED,
                                 f"failure target {target!r} has no injector in this daemon yet")
        if self.rig is None:
            raise CommandRefused(ErrorCode.REFUSED, "rig faults need the simulated robot (--sim)")
        req = {"cmd": "inject", "target": target, "mode": args.get("mode")}
        for k in ("duration_s", "severity"):
            if args.get(k) is not None:
                req[k] = args[k]
        resp = rig_request(str(self.rig.control_socket), req)
        if not resp.get("ok"):
            raise CommandRefused(ErrorCode.BAD_ARGS, f"the rig refused: {resp.get('error')}")
        return {"injected": req, "rig": {k: v for k, v in resp.items() if k != "ok"}}

    def _inject_inference(self, target: str, args: dict[str, Any]) -> dict[str, Any]:
        """failure.inject gpu fail / triton down / model slow (latency_ms), for duration_s
        (required: no mode ends them)."""
        stack = self.policy.stack
        if stack is None:
            raise CommandRefused(ErrorCode.REFUSED, f"{target} faults need the policy model "
                                 f"stack: {self.policy.unavailable() or 'not built'}")
        if args.get("duration_s") is None:
            raise CommandRefused(ErrorCode.BAD_ARGS,
                                 f"{target} {args.get('mode')} needs duration_s")
        try:
            return stack.inject(target, str(args.get("mode")), float(args["duration_s"]),
                                args.get("latency_ms"))
        except ValueError as exc:
            raise CommandRefused(ErrorCode.REFUSED, str(exc)) from exc

    def model_update(self, args: dict[str, Any], ctx: CommandContext) -> dict[str, Any]:
        from edge_agent.daemon.model_trial import UpdateRefused
        from edge_agent.inference.model_card import ModelError

        why = self.policy.unavailable()
        if why is not None:
            raise CommandRefused(ErrorCode.REFUSED, f"model.update refused: {why}")
        try:
            out = self.policy.update_model(args["uri"], args["sha256"], args.get("version"),
                                           bool(args.get("allow_bad")))
        except UpdateRefused as exc:  # a trial runs, or the model is marked bad
            raise CommandRefused(ErrorCode.REFUSED, str(exc)) from exc
        except ValueError as exc:
            raise CommandRefused(ErrorCode.BAD_ARGS, str(exc)) from exc
        except ModelError as exc:  # the cache is unchanged: the model in use stays
            why = str(exc)
            raise CommandRefused(ErrorCode.REFUSED, why if why.startswith("model rejected")
                                 else f"model rejected: {why}") from exc
        self._state_changed()
        return out


def rig_request(path: str, req: dict[str, Any], timeout: float = 2.0) -> dict[str, Any]:
    """One request to the simulated robot's control socket; failures become an error reply."""
    try:
        return json_line_request(path, req, timeout, what=str(req.get("cmd")))
    except EdgeAgentError as exc:
        return {"ok": False, "error": f"rig control socket {path}: {exc}"}
