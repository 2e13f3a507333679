"""A real local HTTP receiver (ThreadingHTTPServer) standing in for a chat webhook (tests, benches).

It records every POST (path, headers, JSON body, arrival time), answers as WeCom does
(`{"errcode": 0, "errmsg": "ok"}`; a WeCom message past WeCom's limits — `markdown` content over
4,096 bytes UTF-8, an `image` over 2 MB or whose md5 is not its bytes' — gets errcode 40058,
as WeCom refuses it), and can be told to answer differently (`plan`: a list of
(status, errcode, headers) for the next requests) or to hold a request until released
(`hold`). `unique()` de-duplicates by idempotency key, as a careful receiver would.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wecom_problem(body: Any) -> str | None:
    """Why WeCom would refuse this message body (None: it would take it, or it is not WeCom's)."""
    if not isinstance(body, dict) or "msgtype" not in body:
        return None  # the generic JSON format
    kind = body["msgtype"]
    if kind in ("markdown", "markdown_v2"):
        content = (body.get(kind) or {}).get("content")
        if not isinstance(content, str) or len(content.encode()) > 4096:
            return f"{kind}.content missing or over 4096 bytes"
        return None
    if kind == "image":
        img = body.get("image") or {}
        try:
            data = base64.b64decode(img.get("base64", ""), validate=True)
        except (binascii.Error, ValueError):
            return "image.base64 is not base64"
        if len(data) > 2 * 1024 * 1024 or hashlib.md5(data).hexdigest() != img.get("md5"):
            return "image over 2 MB or its md5 wrong"
        return None
    return f"msgtype {kind!r} not handled here"


class Receiver:
    def __init__(self, port: int | None = None) -> None:
        self.port = port or _free_port()
        self.requests: list[dict[str, Any]] = []
        self.plan: list[tuple[int, int, dict[str, str]]] = []
        self.hold: threading.Event | None = None  # set: answer; None: answer at once
        self.held = threading.Event()  # a request is being held
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    def url(self, token: str) -> str:
        return f"http://127.0.0.1:{self.port}/cgi-bin/webhook/send?key={token}"

    def start(self) -> Receiver:
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(n)
                sent = json.loads(raw)
                with outer._lock:
                    outer.requests.append({"path": self.path, "headers": dict(self.headers),
                                           "body": sent, "at": time.monotonic()})
                    answer = outer.plan.pop(0) if outer.plan else (200, 0, {})
                    hold = outer.hold
                bad = wecom_problem(sent)
                if bad is not None and answer[:2] == (200, 0):
                    answer = (200, 40058, {})
                if hold is not None:
                    outer.held.set()
                    hold.wait(60)
                status, errcode, headers = answer
                errmsg = ("ok" if errcode == 0 else bad if errcode == 40058 and bad
                          else "api freq out of limit")
                body = json.dumps({"errcode": errcode, "errmsg": errmsg})
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self.hold is not None:
            self.hold.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    def unique(self) -> dict[str, dict[str, Any]]:
        """The requests de-duplicated by idempotency key (the first of each)."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.snapshot():
            key = r["headers"].get("Idempotency-Key")
            assert key == r["body"].get("idempotency_key"), "header and body keys differ"
            out.setdefault(key, r)
        return out

    def report_ids(self) -> list[str]:
        """Every report id carried by the de-duplicated markdown messages, with repeats."""
        ids: list[str] = []
        for key, r in self.unique().items():
            if r["body"].get("msgtype") == "markdown":
                ids.extend(r["body"].get("report_ids") or [key])
            elif "ids" in r["body"]:
                ids.extend(r["body"]["ids"])
        return ids
