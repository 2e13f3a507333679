"""The bound on what the daemon's MQTT client reads: one packet of at most MAX_PACKET_BYTES.

Everything the daemon is sent is a command (≤ 64 KiB payload, `commands.schema.Limits`); a
payload just past that still reaches it and gets its `too_large` reply. Two layers keep a larger
publish on a command topic out of the daemon's memory (a 150 MB one took it from 34 to 539 MB):

- MQTT 5: CONNECT carries Maximum Packet Size; the broker then never sends a larger packet (it
  drops the message for this client; the sender's PUBACK does not say so).
- MQTT 3.1.1 has no such property: the broker cannot be told. `BoundedClient` reads a packet's
  fixed header, and when the length it announces is over the bound it drops the connection
  without reading the rest (MQTT 5 calls a packet over the client's maximum a protocol error
  too); paho then reconnects with a clean session, so the message is gone. The broker's own
  limit (`max_packet_size` in docs/mosquitto/mosquitto.conf, checked by `edge-agent doctor`)
  keeps such a publish from ever reaching the daemon and costing it that reconnect.

paho has no public hook for a read limit: the guard sits at its lowest seam, `_sock_recv`.
"""

from __future__ import annotations

from typing import Any

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.log import get_logger

_log = get_logger(__name__)

# 256 KiB: a 64 KiB command (+ up to 64 KiB topic, properties) with room to answer `too_large`
# for what the documented broker limit (max_packet_size 262144) lets through.
MAX_PACKET_BYTES = 256 * 1024


class BoundedClient(paho.Client):
    """A paho client that refuses (drops the connection on) a packet over `max_packet` bytes."""

    max_packet = MAX_PACKET_BYTES
    refused_packets = 0  # packets refused (a counter per client once one is refused)

    def _sock_recv(self, bufsize: int) -> bytes:
        # .get: a paho whose packet state differs loses the guard, never the connection
        # (tests/test_bounded_reads_daemon.py's 3.1.1 case then fails)
        pkt: dict[str, Any] = getattr(self, "_in_packet", None) or {}
        if pkt.get("have_remaining"):
            size = 1 + len(pkt.get("remaining_count", ())) + int(pkt.get("remaining_length", 0))
            if size > self.max_packet:
                self.refused_packets += 1
                _log.error("mqtt_packet_too_large", bytes=size, limit=self.max_packet,
                           packet_type=int(pkt.get("command", 0)) >> 4,
                           action="connection dropped unread; the broker's max_packet_size "
                                  "would have refused it (docs/INSTALL.md)")
                raise OSError(f"MQTT packet of {size} bytes over the limit {self.max_packet}")
        return super()._sock_recv(bufsize)


def connect_kwargs(v5: bool, max_packet: int = MAX_PACKET_BYTES) -> dict[str, Any]:
    """`connect_async` keywords: MQTT 5 clean start with Maximum Packet Size; none for 3.1.1.

    No SessionExpiryInterval: the session ends with the connection, nothing is queued for us."""
    if not v5:
        return {}
    props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
    props.MaximumPacketSize = max_packet
    return {"clean_start": True, "properties": props}
