"""The flight recorder's ring: the tap's last seconds, bounded in time and in estimated bytes.

Most of what it holds is received link frames (`/link/status` at 1 kHz): ~20,000 of the ~23,000
messages of a 15 s ring (+ the recorder's margin). Each was one Python tuple of (topic, time,
packed wire body) — about 350 bytes of heap for 100 bytes of frame. Here they go into blocks
instead: BLOCK_N frames of one topic as one `array('q')` of times and one lz4-compressed bytes
object of their bodies (each length-prefixed). A block is compressed when it is full (one
`lz4.block.compress` of ~25 KB every quarter second at 1 kHz) and expanded only when a capture
begins and takes the ring (`since`). Anything else (events, decisions, snapshots) is kept as the
tap published it.

Order: `since` returns items sorted by time; a block is one ring entry placed where its first
frame arrived, so the other topics' items of the same quarter second sit after it in the ring.
Trimming goes by each entry's newest time (a block leaves when its last frame is too old).

Single-threaded: the recorder's thread only (its `status()` reads `messages` and `bytes`, two
ints).
"""

from __future__ import annotations

from array import array
from collections import deque
from collections.abc import Iterator
from operator import itemgetter

from edge_agent.observe.tap import Item

BLOCK_N = 256  # frames per block: a quarter second of 1 kHz STATUS
_LEN = 2  # bytes of the length prefix of each body (a frame body is < 64 KiB: docs/PROTOCOL.md)


class Block:
    """Up to BLOCK_N packed frames of one topic: times and length-prefixed bodies."""

    __slots__ = ("data", "est", "sealed", "times", "topic")

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.times = array("q")
        self.data: bytearray | bytes = bytearray()
        self.sealed = False
        self.est = 0  # the ring bytes it is counted as (the sum of its frames' estimates)

    def add(self, t_ns: int, body: bytes) -> bool:
        """Append one frame; True when the block is full (and now compressed)."""
        self.times.append(t_ns)
        data = self.data
        assert isinstance(data, bytearray)
        data += len(body).to_bytes(_LEN, "little")
        data += body
        if len(self.times) < BLOCK_N:
            return False
        import lz4.block  # the recorder imported mcap (and lz4) at its start

        self.data = lz4.block.compress(bytes(data), store_size=True)
        self.sealed = True
        return True

    def items(self) -> Iterator[Item]:
        data = self.data
        if self.sealed:
            import lz4.block

            data = lz4.block.decompress(data)
        view = memoryview(data)
        pos = 0
        topic = self.topic
        for t in self.times:
            n = int.from_bytes(view[pos:pos + _LEN], "little")
            pos += _LEN
            yield (topic, t, bytes(view[pos:pos + n]))
            pos += n


class Ring:
    def __init__(self, packed: frozenset[str]) -> None:
        self._packed = packed
        self._entries: deque[tuple[Item | Block, int]] = deque()  # (item or block, its bytes)
        self._filling: dict[str, Block] = {}  # per packed topic: the block not full yet
        self.messages = 0
        self.bytes = 0

    def add(self, item: Item, est: int) -> None:
        """One tap item, counted as `est` bytes; packed frames (bytes payloads of a PACKED
        topic, see capture.pack) go into their topic's block."""
        topic, t, payload = item
        self.messages += 1
        self.bytes += est
        if topic in self._packed and type(payload) is bytes and len(payload) < 1 << 16:
            block = self._filling.get(topic)
            if block is None:
                block = self._filling[topic] = Block(topic)
                self._entries.append((block, 0))
            block.est += est
            if block.add(t, payload):
                del self._filling[topic]
            return
        self._entries.append((item, est))

    def trim(self, oldest_ns: int, max_bytes: int) -> None:
        """Drop the oldest entries while their newest message is before `oldest_ns` or the ring
        is over `max_bytes`."""
        entries = self._entries
        while entries:
            head, est = entries[0]
            if isinstance(head, Block):
                newest, n, est = head.times[-1], len(head.times), head.est
            else:
                newest, n = head[1], 1
            if newest >= oldest_ns and self.bytes <= max_bytes:
                return
            entries.popleft()
            if isinstance(head, Block) and self._filling.get(head.topic) is head:
                del self._filling[head.topic]
            self.messages -= n
            self.bytes -= est

    def since(self, start_ns: int) -> list[Item]:
        """Every message at or after `start_ns`, blocks expanded, sorted by time."""
        out: list[Item] = []
        for entry, _ in self._entries:
            if isinstance(entry, Block):
                if entry.times[-1] >= start_ns:
                    out.extend(x for x in entry.items() if x[1] >= start_ns)
            elif entry[1] >= start_ns:
                out.append(entry)
        out.sort(key=itemgetter(1))
        return out
