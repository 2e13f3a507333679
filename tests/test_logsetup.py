"""edge_agent.logsetup: JSON lines off a terminal, console on one, and secrets never logged.

Each case runs the logging set-up in a real subprocess and reads what it wrote to its stdout
(a pipe, or a pty for the terminal case).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import structlog

from edge_agent.config import Secret
from edge_agent.log import capture_logs, get_logger
from edge_agent.logsetup import REDACTED, SecretRedactor

REPO = Path(__file__).resolve().parents[1]
PASSWORD = "Zq8-hunter2-Xk41"

SCRIPT = textwrap.dedent(f"""
    import logging, sys, warnings
    from edge_agent.config import Secret
    from edge_agent.log import get_logger
    from edge_agent.logsetup import configure_logging
    configure_logging(sys.argv[1], sys.argv[2], secrets=[{PASSWORD!r}])
    log = get_logger("edge_agent.demo")
    log.debug("debug_line", n=1)
    log.info("connect", host="broker", password="also-secret", pw=Secret("x"),
             note="using {PASSWORD} now", nested={{"a": [{PASSWORD!r}], "token": "t0k"}})
    try:
        raise RuntimeError("auth failed for {PASSWORD}")
    except RuntimeError:
        log.exception("crash")
    logging.getLogger("paho.client").warning("stdlib says %s", {PASSWORD!r})
    logging.getLogger("transitions.core").info("state change chatter")
    warnings.warn("a python warning")
""")


def run_logging(level: str, fmt: str) -> str:
    out = subprocess.run([sys.executable, "-c", SCRIPT, level, fmt], cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout


def test_json_lines_when_stdout_is_not_a_terminal() -> None:
    out = run_logging("info", "auto")
    assert PASSWORD not in out and "also-secret" not in out and "t0k" not in out
    records = [json.loads(line) for line in out.splitlines()]
    by_event = {r["event"]: r for r in records}
    assert "debug_line" not in by_event  # below the level
    assert not any("state change chatter" in r["event"] for r in records)  # transitions INFO
    c = by_event["connect"]
    assert list(c)[:4] == ["ts", "level", "logger", "event"]
    assert (c["level"], c["logger"], c["host"]) == ("info", "edge_agent.demo", "broker")
    assert c["password"] == c["pw"] == REDACTED
    assert c["note"] == f"using {REDACTED} now"
    assert c["nested"] == {"a": [REDACTED], "token": REDACTED}
    ts = datetime.fromisoformat(c["ts"].replace("Z", "+00:00"))
    assert ts.utcoffset() == timedelta(0)
    crash = by_event["crash"]
    assert crash["level"] == "error" and "RuntimeError: auth failed for ***" in crash["exception"]
    stdlib = next(r for r in records if r.get("logger") == "paho.client")
    assert stdlib["level"] == "warning" and stdlib["event"] == "stdlib says ***"
    assert any("a python warning" in r["event"] for r in records)


def test_debug_level_shows_debug() -> None:
    events = [json.loads(line)["event"] for line in run_logging("debug", "json").splitlines()]
    assert "debug_line" in events


def test_console_format_is_forced_and_redacted() -> None:
    out = run_logging("info", "console")
    assert PASSWORD not in out and "also-secret" not in out
    assert "connect" in out and "password=***" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.splitlines()[0])


def test_console_on_a_terminal_in_auto_mode() -> None:
    main, sub = os.openpty()
    try:
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT, "info", "auto"], cwd=REPO,
                                stdout=sub, stderr=subprocess.DEVNULL)
        os.close(sub)
        chunks = []
        while True:
            try:
                data = os.read(main, 4096)
            except OSError:  # EIO: the child closed the pty
                break
            if not data:
                break
            chunks.append(data)
        assert proc.wait(timeout=60) == 0
    finally:
        os.close(main)
    out = b"".join(chunks).decode(errors="replace")
    assert "connect" in out and PASSWORD not in out
    assert not out.lstrip().startswith("{")  # not JSON lines


def test_redactor_unit() -> None:
    r = SecretRedactor(["long-secret-value", "abc"])
    ev = {"event": "x long-secret-value y", "short": "abc", "contains_short": "xabcx",
          "api_key": "k", "Authorization": "Bearer z", "obj": Path("/a/long-secret-value"),
          "n": 3, "none_password": None, "s": Secret("q")}
    got = r(None, "info", ev)
    assert got["event"] == "x *** y"
    assert got["short"] == REDACTED  # short secrets: whole values only
    assert got["contains_short"] == "xabcx"
    assert got["api_key"] == got["Authorization"] == got["s"] == REDACTED
    assert got["obj"] == "PosixPath('/a/***')" and got["n"] == 3
    assert got["none_password"] is None


def test_reconfiguration_reaches_loggers_already_used() -> None:
    import io
    import logging

    from edge_agent.logsetup import configure_logging

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    log = get_logger("edge_agent.somewhere")  # as a library module holds it
    first, second = io.StringIO(), io.StringIO()
    try:
        configure_logging("info", "json", stream=first)
        log.info("warm_up")
        configure_logging("info", "json", stream=second, secrets=["s3cr3t-value"])
        log.info("after", detail="s3cr3t-value")
        with capture_logs() as logs:
            log.info("hello", k=1)
    finally:  # leave the pytest process as it was
        structlog.reset_defaults()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)
    assert "warm_up" in first.getvalue() and "after" not in first.getvalue()
    after = json.loads(second.getvalue().splitlines()[0])
    assert (after["event"], after["detail"]) == ("after", REDACTED)
    assert logs == [{"event": "hello", "k": 1, "log_level": "info"}]


def test_bind_task_tags_the_threads_records_until_unbound() -> None:
    import io
    import logging
    import threading

    from edge_agent.log import bind_task
    from edge_agent.logsetup import configure_logging

    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    out = io.StringIO()
    log = get_logger("edge_agent.executor")
    try:
        configure_logging("info", "json", stream=out)
        bind_task("t-7")
        log.info("in_task")
        other = threading.Thread(target=lambda: log.info("other_thread"))
        other.start()
        other.join()
        bind_task(None)
        log.info("after_task")
    finally:
        bind_task(None)
        structlog.reset_defaults()
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.captureWarnings(False)
    recs = {r["event"]: r for r in map(json.loads, out.getvalue().splitlines())}
    assert recs["in_task"]["task_id"] == "t-7"
    assert "task_id" not in recs["other_thread"]  # a thread has its own context
    assert "task_id" not in recs["after_task"]


def test_structlog_is_imported_without_asyncio_greenlet_or_rich_and_still_works() -> None:
    # edge_agent.log.import_structlog: asyncio (and its ssl) only when structlog's async
    # methods first use it; greenlet and rich never on structlog's account
    code = textwrap.dedent("""
        import sys
        from edge_agent.log import import_structlog
        structlog = import_structlog()
        print(sorted(m for m in ("asyncio", "ssl", "greenlet", "rich") if m in sys.modules))
        log = structlog.wrap_logger(structlog.ReturnLogger(),
                                    wrapper_class=structlog.stdlib.BoundLogger)
        import asyncio
        print(asyncio.run(log.ainfo("async_line", n=1)) is None, "asyncio" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True, timeout=60).stdout.splitlines()
    assert out == ["[]", "True True"]
