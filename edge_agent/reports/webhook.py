"""The chat webhook sink (WeCom group robot, or plain JSON) over urllib3.

WeCom facts this follows: `{"msgtype": "markdown", "markdown": {"content"}}` with content at most
4,096 bytes UTF-8 — the classic type, which renders no tables and no lists, so the content is the
report's phone-sized summary (reports/chat.py), not its full Markdown; `{"msgtype": "image",
"image": {"base64", "md5"}}` up to 2 MB for the plot; at most 20 messages a minute per robot
(here at most `rate_per_min` in any 60 s); HTTP 200 with `errcode` ≠ 0 is a failure (45009: rate
limited). Every request carries the report's idempotency key (header `Idempotency-Key` and the
body's `idempotency_key`), so a retry after a timeout or a crash can be de-duplicated by the
receiver.
Repeats of one fault inside `merge_window_s` go as one message with a count. TLS is verified,
every request has connect and read timeouts, and the URL (its token) never reaches a log line or
an error string: errors name the exception class and HTTP status only.
An answer is read up to `ANSWER_MAX` bytes and no further: WeCom's is `{"errcode":0,"errmsg":"ok"}`;
a longer one (a proxy's or a captive portal's page, a broken receiver streaming) fails the delivery
with that reason and its connection is closed unread, so no peer decides how much the daemon holds.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import json
import math
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edge_agent.reports.build import utc
from edge_agent.reports.chat import WECOM_MARKDOWN_MAX as WECOM_MARKDOWN_MAX  # re-exported
from edge_agent.reports.chat import chat_summary
from edge_agent.reports.outbox import Entry, Result

WECOM_IMAGE_MAX = 2 * 1024 * 1024
WECOM_RATE_LIMITED = 45009
ANSWER_MAX = 4096  # bytes of an HTTP answer read at most (a receiver's JSON is ~30 bytes)
FORMATS = ("wecom", "json")


class SendWindow:
    """At most `rate_per_min` sends in any 60 s (a fake clock in tests).

    A sliding window, not a token bucket: WeCom counts messages per minute, and a bucket of 20
    that refills at 20 a minute lets 40 through in one minute (a burst, then the refill) — the
    fault storm bench saw 39 in 60 s."""

    def __init__(self, rate_per_min: float, window_s: float = 60.0) -> None:
        self.limit = max(1, math.floor(rate_per_min * window_s / 60.0))
        self.window_s = window_s
        self._sent: deque[float] = deque()

    def _forget(self, now: float) -> None:
        while self._sent and now - self._sent[0] >= self.window_s:
            self._sent.popleft()

    def wait_s(self, now: float) -> float:
        """Seconds until a send is allowed (0: now)."""
        self._forget(now)
        if len(self._sent) < self.limit:
            return 0.0
        return self._sent[0] + self.window_s - now

    def take(self, now: float) -> bool:
        """Count a send now if one is allowed."""
        if self.wait_s(now) > 0:
            return False
        self._sent.append(now)
        return True


def parse_retry_after(value: str | None, now_wall: float) -> float | None:
    """`Retry-After` as seconds from now: delta-seconds or an HTTP date; None when absent/bad."""
    if not value:
        return None
    value = value.strip()
    try:
        secs = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        secs = when.timestamp() - now_wall
    return max(0.0, min(secs, 3600.0)) if math.isfinite(secs) else None


def merged_note(entry: Entry, merged: Sequence[Entry]) -> str:
    """The line that says a message stands for several reports of the same fault."""
    if not merged:
        return ""
    last = max(m.report.wall for m in merged)
    return (f"**{1 + len(merged)}× this fault** between {utc(entry.report.wall)} and "
            f"{utc(last)} (reports: {', '.join([entry.id, *(m.id for m in merged)])})\n\n")


def wecom_messages(entry: Entry, merged: Sequence[Entry], plot: Path | None, device: str, *,
                   report_topic: str | None = None, secrets: Sequence[str] = (),
                   ) -> list[tuple[str, dict[str, Any]]]:
    """(part name, body) of each message for one report: the summary (classic markdown), then
    the plot image (`report_topic`: where MQTT has the full report; default edge/<device>)."""
    key = entry.id
    image = plot.read_bytes() if plot is not None else None
    if image is not None and len(image) > WECOM_IMAGE_MAX:
        image = None
    text = chat_summary(entry.report, [m.report for m in merged],
                        report_topic=report_topic or f"edge/{device}/report",
                        plot=image is not None, secrets=secrets)
    # `report_ids`: every report this message stands for (the text names the first five of a
    # merge); like `idempotency_key`, a field for the receiver that WeCom does not read
    out: list[tuple[str, dict[str, Any]]] = [("markdown", {
        "msgtype": "markdown", "markdown": {"content": text}, "idempotency_key": key,
        "report_ids": [key, *(m.id for m in merged)]})]
    if image is not None:
        out.append(("image", {"msgtype": "image", "image": {
            "base64": base64.b64encode(image).decode(), "md5": hashlib.md5(image).hexdigest()},
            "idempotency_key": f"{key}.plot"}))
    return out


def json_message(entry: Entry, merged: Sequence[Entry], plot: Path | None
                 ) -> list[tuple[str, dict[str, Any]]]:
    """One plain JSON message: the report's headline fields, Markdown and the plot inline."""
    r = entry.report
    image = None
    if plot is not None:
        data = plot.read_bytes()
        if len(data) <= WECOM_IMAGE_MAX:
            image = {"base64": base64.b64encode(data).decode(),
                     "md5": hashlib.md5(data).hexdigest()}
    return [("report", {"v": 1, "idempotency_key": r.id, "id": r.id, "ts": r.wall,
                        "kind": r.kind.value, "fault": r.fault, "title": r.title,
                        "device": r.origin.device, "count": 1 + len(merged),
                        "ids": [r.id, *(m.id for m in merged)],
                        "markdown": merged_note(entry, merged) + entry.markdown, "plot": image})]


class WebhookSink:
    """See the module doc. `url` is the secret itself (kept here, never logged)."""

    name = "webhook"

    def __init__(self, url: str, *, fmt: str = "wecom", device: str, rate_per_min: float = 20.0,
                 merge_window_s: float = 60.0, timeout_s: float = 10.0,
                 ca_file: str | None = None, report_topic: str | None = None,
                 secrets: Sequence[str] = ()) -> None:
        import urllib3  # lazy: only a daemon with a webhook pays for it

        if fmt not in FORMATS:
            raise ValueError(f"webhook format {fmt!r} (expected one of {', '.join(FORMATS)})")
        self._url = url
        self.fmt = fmt
        self.device = device
        self.report_topic = report_topic or f"edge/{device}/report"
        self._secrets = (url, *secrets)  # the summary is built here: redacted here
        self.bucket = SendWindow(rate_per_min)
        self.merge_window_s = merge_window_s
        self._timeout = urllib3.Timeout(connect=min(5.0, timeout_s), read=timeout_s)
        self._http = urllib3.PoolManager(cert_reqs="CERT_REQUIRED", ca_certs=ca_file,
                                         retries=False, maxsize=1)
        self._errors: tuple[type[BaseException], ...] = (urllib3.exceptions.HTTPError, OSError)
        self.requests = 0

    def wait_s(self, now: float) -> float:
        return self.bucket.wait_s(now)

    def group(self, entry: Entry, pending: Sequence[Entry]) -> list[Entry]:
        """Later pending reports of the same fault and kind inside the merge window (a mode
        entered and left share a fault: "left" is news of its own, not a repeat)."""
        if self.merge_window_s <= 0:
            return []
        end = entry.report.wall + self.merge_window_s
        return [e for e in pending if e.report.fault == entry.report.fault
                and e.report.kind == entry.report.kind
                and entry.report.wall <= e.report.wall <= end][:100]

    def deliver(self, entry: Entry, merged: Sequence[Entry], plot: Path | None,
                state: dict[str, Any]) -> Result:
        parts = (wecom_messages(entry, merged, plot, self.device, report_topic=self.report_topic,
                                secrets=self._secrets) if self.fmt == "wecom"
                 else json_message(entry, merged, plot))
        done: list[str] = state.setdefault("parts_done", [])
        for part, body in parts:
            if part in done:
                continue
            if not self.bucket.take(time.monotonic()):
                return Result(False, "webhook: local rate limit",
                              retry_after_s=self.bucket.wait_s(time.monotonic()), deferred=True)
            res = self._post(body)
            if not res.ok:
                return res
            done.append(part)
        return Result(True)

    def _post(self, body: dict[str, Any]) -> Result:
        data = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        self.requests += 1
        try:
            resp = self._http.request(
                "POST", self._url, body=data, timeout=self._timeout, redirect=False,
                preload_content=False,
                headers={"Content-Type": "application/json; charset=utf-8",
                         "Idempotency-Key": str(body["idempotency_key"])})
        except self._errors as exc:  # the message may hold the URL: the class name only
            return Result(False, f"webhook: {type(exc).__name__}")
        retry_after = parse_retry_after(resp.headers.get("Retry-After"), time.time())
        try:
            answer = _read_bounded(resp)
        except self._errors as exc:
            return Result(False, f"webhook: HTTP {resp.status}, answer unreadable: "
                                 f"{type(exc).__name__}", retry_after)
        if answer is None:
            return Result(False, f"webhook: HTTP {resp.status} with an answer over {ANSWER_MAX} "
                                 "bytes (not the receiver's: a proxy or captive portal?); "
                                 "not read", retry_after)
        errcode, errmsg = _errcode(answer)
        if resp.status == 429 or errcode == WECOM_RATE_LIMITED:
            return Result(False, f"webhook: rate limited (HTTP {resp.status}, errcode "
                                 f"{errcode})", retry_after)
        if not 200 <= resp.status < 300:
            return Result(False, f"webhook: HTTP {resp.status}", retry_after)
        if errcode not in (None, 0):
            return Result(False, f"webhook: errcode {errcode} {errmsg[:80]}", retry_after)
        if self.fmt == "wecom" and errcode is None:
            return Result(False, f"webhook: HTTP {resp.status} without an errcode", retry_after)
        return Result(True)


def _read_bounded(resp: Any) -> bytes | None:
    """The answer's body when it is at most ANSWER_MAX bytes, else None; the connection goes back
    to the pool only when the body was read to its end (else it is closed with the rest unread)."""
    data = bytearray()
    try:
        while len(data) <= ANSWER_MAX:
            chunk = resp.read(ANSWER_MAX + 1 - len(data))
            if not chunk:  # the end of the body
                resp.release_conn()
                return bytes(data)
            data += chunk
    except BaseException:
        resp.close()
        raise
    resp.close()
    return None


def _errcode(data: bytes) -> tuple[int | None, str]:
    try:
        body = json.loads(data)
    except ValueError:
        return None, ""
    if not isinstance(body, dict) or not isinstance(body.get("errcode"), int):
        return None, ""
    return int(body["errcode"]), str(body.get("errmsg", ""))
