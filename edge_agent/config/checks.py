"""Configuration checks that span keys: derived defaults, consistency, secrets and file modes.

Works on the per-section value dicts the loader (edge_agent.config.load) has already type-checked,
before they become frozen dataclasses. Errors raise ConfigError naming the first key; softer
findings are appended to `LoadContext.warnings` (the daemon logs them, check-config prints them).
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edge_agent.comms.topic_rules import portability_problem
from edge_agent.config.spec import Secret
from edge_agent.errors import ConfigError
from edge_agent.robot import RobotDescription

Values = dict[str, Any]


@dataclass
class LoadContext:
    """What the loader knows while it reads one file: where it is and which keys --set gave."""

    source: str
    base_dir: Path
    cwd: Path
    sim: bool = False
    overridden: set[str] = field(default_factory=set)
    warnings: list[str] = field(default_factory=list)

    def fail(self, key: str, value: object, why: str) -> ConfigError:
        src = f"{self.source} (--set)" if key in self.overridden else self.source
        return ConfigError(key, value, why, src)


def fill_derived(v: dict[str, Values], state_dir: Path, ctx: LoadContext) -> None:
    """Defaults that depend on other keys."""
    dev_id = v["device"]["id"]
    mqtt = v["mqtt"]
    if mqtt["username"] is None:
        mqtt["username"] = dev_id
    if mqtt["topic_prefix"] is None:
        mqtt["topic_prefix"] = f"edge/{dev_id}"
    if v["reports"]["dir"] is None:
        v["reports"]["dir"] = state_dir / "reports"
    if v["inference"]["cache_dir"] is None:
        v["inference"]["cache_dir"] = state_dir / "models"
    tls = mqtt["tls"]
    has_files = tls["ca_file"] is not None or tls["cert_file"] is not None
    if tls["enabled"] is None:
        tls["enabled"] = has_files
    elif not tls["enabled"] and has_files:
        raise ctx.fail("mqtt.tls.enabled", False, "is false but mqtt.tls.ca_file/cert_file are set")
    if v["link"]["port"] is None and not ctx.sim:
        raise ctx.fail("link.port", None, "is required: a tty such as /dev/ttyUSB0 or a pyserial "
                                          "URL (run with --sim to use the simulated robot)")


def check(v: dict[str, Values], ctx: LoadContext) -> None:
    """Consistency between keys of the same file (the robot is checked in check_robot)."""
    _check_inline_secrets(v, ctx)
    _check_mqtt(v["mqtt"], ctx)
    _check_webhook_file(v["reports"], ctx)
    _check_trusted_keys(v["inference"]["trusted_keys"], ctx)
    if v["inference"]["require_gate"] and not v["inference"]["trusted_keys"]:
        raise ctx.fail("inference.require_gate", True,
                       "needs inference.trusted_keys: a gate record is evidence only under a "
                       "trusted signature (`edge-agent model keygen`, then sign with --gate)")
    _check_topic("mqtt.topic_prefix", v["mqtt"]["topic_prefix"], ctx, wildcards=False)
    _check_topic("mqtt.fleet_topic", v["mqtt"]["fleet_topic"], ctx, wildcards=True)
    _ordered("mqtt.reconnect_min_s", v["mqtt"], "reconnect_min_s", "reconnect_max_s", ctx)
    _ordered("link.reopen_min_s", v["link"], "reopen_min_s", "reopen_max_s", ctx)
    _check_port(v["link"]["port"], ctx)

    ctl = v["control"]
    period_ms = 1000.0 / ctl["rate_hz"]
    if ctl["decision_hz"] > ctl["rate_hz"]:
        raise ctx.fail("control.decision_hz", ctl["decision_hz"],
                       f"must not exceed control.rate_hz ({ctl['rate_hz']:g})")
    ratio = ctl["rate_hz"] / ctl["decision_hz"]
    if abs(ratio - round(ratio)) > 1e-9:
        ctx.warnings.append(f"control.decision_hz = {ctl['decision_hz']:g} does not divide "
                            f"control.rate_hz = {ctl['rate_hz']:g}: decisions fall unevenly")
    if ctl["spin_s"] * 1000.0 > period_ms / 2:
        raise ctx.fail("control.spin_s", ctl["spin_s"],
                       f"must be under half the control period ({period_ms / 2:g} ms)")
    link = v["link"]
    if ctl["priority"] > 0 and link["guardian_priority"] > 0 and (
            ctl["priority"] >= link["guardian_priority"]):
        raise ctx.fail("control.priority", ctl["priority"],
                       f"must be below link.guardian_priority ({link['guardian_priority']}): "
                       "the e-stop path must preempt the control loop, never the reverse")
    if link["reader_priority"] > 0 and link["guardian_priority"] > 0 and (
            link["reader_priority"] >= link["guardian_priority"]):
        raise ctx.fail("link.reader_priority", link["reader_priority"],
                       f"must be below link.guardian_priority ({link['guardian_priority']}): "
                       "the guardian owns the e-stop path")
    if link["deadman_ms"] < 2 * period_ms:
        raise ctx.fail("link.deadman_ms", link["deadman_ms"],
                       f"must be at least 2 control periods ({2 * period_ms:g} ms at "
                       f"control.rate_hz = {ctl['rate_hz']:g}), else every late tick trips it")
    if link["status_period_us"] > period_ms * 1000.0:
        raise ctx.fail("link.status_period_us", link["status_period_us"],
                       f"status must arrive at least at the control rate (<= {period_ms * 1000:g}"
                       f" us at control.rate_hz = {ctl['rate_hz']:g})")
    decision_ms = 1000.0 / ctl["decision_hz"]
    if v["inference"]["deadline_ms"] > decision_ms:
        raise ctx.fail("inference.deadline_ms", v["inference"]["deadline_ms"],
                       f"must not exceed the decision period ({decision_ms:g} ms at "
                       f"control.decision_hz = {ctl['decision_hz']:g})")
    if "CPUExecutionProvider" not in v["inference"]["providers"]:
        ctx.warnings.append("inference.providers lacks CPUExecutionProvider: no CPU fallback "
                            "when the accelerator fails")
    ex = v["executor"]
    if ex["grip_force_band_n"] >= ex["grip_force_n"]:
        raise ctx.fail("executor.grip_force_band_n", ex["grip_force_band_n"],
                       f"must be smaller than executor.grip_force_n ({ex['grip_force_n']:g})")
    rep = v["reports"]
    _ordered("reports.retry_min_s", rep, "retry_min_s", "retry_max_s", ctx)
    hook = v["reports"]["webhook_url"]
    if hook is not None and hook.reveal().startswith("http://") and not _is_loopback(
            _url_host(hook.reveal())):
        ctx.warnings.append("reports.webhook_url is plain http to another host: reports travel "
                            "unencrypted")


def check_robot(v: dict[str, Values], robot: RobotDescription, ctx: LoadContext) -> None:
    """Keys that must agree with the robot description."""
    ex = v["executor"]
    g = robot.gripper
    if not g.force_min_n <= ex["grip_force_n"] <= g.force_max_n:
        raise ctx.fail("executor.grip_force_n", ex["grip_force_n"],
                       f"outside the gripper's force range {g.force_min_n:g}..{g.force_max_n:g} N "
                       f"({robot.name}, {robot.source})")


def _check_mqtt(m: Values, ctx: LoadContext) -> None:
    if m["password"] is not None and m["password_file"] is not None:
        raise ctx.fail("mqtt.password_file", str(m["password_file"]),
                       "set either mqtt.password or mqtt.password_file, not both")
    if m["password_file"] is not None:
        m["password"] = _read_password("mqtt.password_file", m["password_file"], ctx)
    tls = m["tls"]
    if (tls["cert_file"] is None) != (tls["key_file"] is None):
        missing, given = (("cert_file", "key_file") if tls["cert_file"] is None
                          else ("key_file", "cert_file"))
        raise ctx.fail(f"mqtt.tls.{missing}", None,
                       f"is required when mqtt.tls.{given} is set (they go together)")
    if tls["key_file"] is not None:
        _private("mqtt.tls.key_file", tls["key_file"], ctx)
    if tls["insecure"] and not tls["enabled"]:
        raise ctx.fail("mqtt.tls.insecure", True, "has no effect without TLS")
    if tls["insecure"]:
        ctx.warnings.append("mqtt.tls.insecure = true: the broker certificate's host name is not "
                            "checked against mqtt.host (the certificate chain still is): any "
                            "certificate the CA signed is accepted for this broker")
    if tls["enabled"] and m["port"] == 1883:
        ctx.warnings.append("TLS on mqtt.port 1883 (the plain-text port); 8883 is usual")
    if m["password"] is not None and not tls["enabled"] and not _is_loopback(m["host"]):
        ctx.warnings.append(f"mqtt.password is sent in clear text to {m['host']}: enable mqtt.tls")


def _check_inline_secrets(v: dict[str, Values], ctx: LoadContext) -> None:
    """A secret written into a config file that other users can read is refused."""
    inline = [k for k, val, f in (
        ("mqtt.password", v["mqtt"]["password"], v["mqtt"]["password_file"]),
        ("reports.webhook_url", v["reports"]["webhook_url"], v["reports"]["webhook_url_file"]))
        if val is not None and f is None and k not in ctx.overridden]  # both: said later
    if not inline:
        return
    try:
        mode = stat.S_IMODE(os.stat(ctx.source).st_mode)
    except OSError:
        return
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        key = inline[0]
        raise ctx.fail(key, Secret(""), f"a secret in a file other users can read (mode "
                                        f"{mode:04o}): move it to {key}_file (mode 0640, "
                                        f"not readable by others) or run: chmod o-rwx "
                                        f"{ctx.source}")


def _check_webhook_file(r: Values, ctx: LoadContext) -> None:
    path = r["webhook_url_file"]
    if path is None:
        return
    if r["webhook_url"] is not None:
        raise ctx.fail("reports.webhook_url_file", str(path),
                       "set either reports.webhook_url or reports.webhook_url_file, not both")
    url = _read_password("reports.webhook_url_file", path, ctx, what="webhook URL")
    if not re.fullmatch(r"https?://\S+", url.reveal()):
        raise ctx.fail("reports.webhook_url_file", str(path),
                       "the file must hold one http:// or https:// URL")
    r["webhook_url"] = url


def _check_trusted_keys(keys: tuple[str, ...], ctx: LoadContext) -> None:
    from edge_agent.inference.model_signing import parse_public_key

    for i, text in enumerate(keys):
        try:
            parse_public_key(text)
        except ValueError as exc:
            raise ctx.fail(f"inference.trusted_keys[{i}]", text, str(exc)) from None


def _read_password(key: str, path: Path, ctx: LoadContext, what: str = "password") -> Secret:
    _private(key, path, ctx)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeError) as exc:
        raise ctx.fail(key, str(path), f"cannot be read: {exc.__class__.__name__}") from None
    text = text.rstrip("\r\n")
    if not text:
        raise ctx.fail(key, str(path), "the file is empty")
    if "\n" in text:
        raise ctx.fail(key, str(path), f"the {what} must be on one line")
    return Secret(text)


def _private(key: str, path: Path, ctx: LoadContext) -> None:
    """Refuse secret files other users can read or write (the way ssh refuses such keys)."""
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & (stat.S_IROTH | stat.S_IWOTH):
        raise ctx.fail(key, str(path), f"other users can access it (mode {mode:04o}); "
                                       f"run: chmod o-rwx {path}")


def _ordered(key: str, sec: Values, lo: str, hi: str, ctx: LoadContext) -> None:
    if sec[lo] > sec[hi]:
        raise ctx.fail(key, sec[lo], f"must not exceed {key.rsplit('.', 1)[0]}.{hi} "
                                     f"({sec[hi]:g})")


def _check_topic(key: str, topic: str, ctx: LoadContext, *, wildcards: bool) -> None:
    levels = topic.split("/")
    if "\0" in topic or "" in levels:
        raise ctx.fail(key, topic, "an MQTT topic without empty levels or a leading/trailing '/'")
    for i, lvl in enumerate(levels):
        if ("+" in lvl or "#" in lvl) and not wildcards:
            raise ctx.fail(key, topic, "must not contain the wildcards '+' or '#'")
        if ("+" in lvl and lvl != "+") or ("#" in lvl and (lvl != "#" or i != len(levels) - 1)):
            raise ctx.fail(key, topic, "'+' must fill a whole level and '#' only the last one")
    # valid on every major broker (Mosquitto, EMQX, HiveMQ, NATS, RabbitMQ): docs/INSTALL.md
    problem = portability_problem(topic, wildcards=wildcards)
    if problem is not None:
        raise ctx.fail(key, topic, problem)


def _check_port(port: str | None, ctx: LoadContext) -> None:
    if port is None:
        return
    if "://" in port:
        scheme = port.split("://", 1)[0]
        if not scheme.replace("+", "").isalnum():
            raise ctx.fail("link.port", port, "not a pyserial URL (e.g. socket://host:port)")
    elif not port.startswith("/"):
        raise ctx.fail("link.port", port, "an absolute tty path (/dev/ttyUSB0, /dev/serial/by-id/"
                                          "...) or a pyserial URL (socket://host:port)")


def _url_host(url: str) -> str:
    from urllib.parse import urlsplit

    try:
        return urlsplit(url).hostname or ""
    except ValueError:
        return ""


def _is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
