"""A minimal Foxglove WebSocket protocol client (websockets' sync client).

Speaks the protocol the Foxglove app speaks (ws-protocol spec v1): offers the subprotocols
`foxglove.sdk.v1` (foxglove-sdk's servers accept only this name) and `foxglove.websocket.v1`
(the same protocol, its older name); reads `serverInfo` and `advertise`, sends `subscribe`,
decodes binary `messageData` frames (opcode 1: u32 subscription id, u64 log time ns, payload).
"""

from __future__ import annotations

import json
import struct
import time
from dataclasses import dataclass, field
from typing import Any

from websockets.sync.client import ClientConnection, connect

SUBPROTOCOLS = ["foxglove.sdk.v1", "foxglove.websocket.v1"]
MESSAGE_DATA = 0x01


@dataclass
class Received:
    topic: str
    log_time_ns: int
    payload: dict[str, Any]


@dataclass
class FoxgloveClient:
    url: str
    conn: ClientConnection | None = None
    server_info: dict[str, Any] = field(default_factory=dict)
    channels: dict[str, dict[str, Any]] = field(default_factory=dict)  # by topic
    _by_sub: dict[int, str] = field(default_factory=dict)

    def open(self, timeout: float = 20.0) -> FoxgloveClient:
        self.conn = connect(self.url, subprotocols=SUBPROTOCOLS,  # type: ignore[arg-type]
                            open_timeout=timeout, max_size=16 << 20, proxy=None,
                            legacy=True)
        end = time.monotonic() + timeout
        while not (self.server_info and self.channels) and time.monotonic() < end:
            msg = self.conn.recv(timeout=max(0.1, end - time.monotonic()))
            if isinstance(msg, str):
                self._control(json.loads(msg))
        return self

    @property
    def subprotocol(self) -> str | None:
        return self.conn.subprotocol if self.conn is not None else None

    def _control(self, m: dict[str, Any]) -> None:
        if m.get("op") == "serverInfo":
            self.server_info = m
        elif m.get("op") == "advertise":
            for c in m["channels"]:
                self.channels[c["topic"]] = c

    def subscribe(self, topics: list[str]) -> None:
        assert self.conn is not None
        subs = []
        for i, t in enumerate(topics, start=len(self._by_sub) + 1):
            subs.append({"id": i, "channelId": self.channels[t]["id"]})
            self._by_sub[i] = t
        self.conn.send(json.dumps({"op": "subscribe", "subscriptions": subs}))

    def receive(self, seconds: float) -> list[Received]:
        """Every message that arrives within `seconds` (control messages are kept too)."""
        assert self.conn is not None
        out: list[Received] = []
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            try:
                msg = self.conn.recv(timeout=left)
            except TimeoutError:
                break
            if isinstance(msg, str):
                self._control(json.loads(msg))
                continue
            if msg[0] != MESSAGE_DATA:
                continue
            sub, t_ns = struct.unpack_from("<IQ", msg, 1)
            out.append(Received(self._by_sub[sub], t_ns, json.loads(msg[13:])))
        return out

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
