"""The flight recorder's ring: the tap's last seconds, bounded in time and in estimated bytes.

Most of what it holds is received link frames (`/link/status` at 1 kHz): ~20,000 of the ~23,000
messages of a 15 s ring (+ the recorder's margin). Each was one Python tuple of (topic, time,
packed wire body) — about 350 bytes of heap for 100 bytes of frame. Here they go into blocks
instead: up to BLOCK_N frames of one topic within BLOCK_SPAN_NS as one `array('q')` of times and
one lz4-compressed bytes object of their bodies (each length-prefixed). A block is compressed
when it is full or its span is over (one `lz4.block.compress` of ~25 KB every quarter second
at 1 kHz) and expanded only when a capture writes it: a capture's backlog (`backlog`) holds one
`Frames` item per block, which the recorder unpacks when it reaches it, so a capture beginning
does not double the ring's memory.
The recorder packs the control loop's ticks the same way and encodes the sensor snapshots as
they enter (observe/capture.py PACKED, ENCODED): their bytes go into blocks as well. Anything
else (events, decisions, health, log lines) is kept as the tap published it.

Order: `backlog` sorts by time, a block by its first frame taken: the other topics'
items of its quarter second come after its frames in a file (MCAP readers order by log time).
Trimming goes by each entry's newest time (a block leaves when its last frame is too old).

Single-threaded: the recorder's thread only (its `status()` reads `messages` and `bytes`, two
ints).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections import deque
from collections.abc import Iterator
from operator import itemgetter

from edge_agent.observe.tap import Item

BLOCK_N = 256  # frames per block: a quarter second of 1 kHz STATUS
# ... and at most this span: a block is one ring entry placed at its first frame, so a topic
# that sends rarely must not keep one open (trimming stops at the first entry still recent)
BLOCK_SPAN_NS = 250_000_000
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
        self.seal()
        return True

    def seal(self) -> None:
        """Compress it; nothing more can be added."""
        import lz4.block  # the recorder imported mcap (and lz4) at its start

        self.data = lz4.block.compress(bytes(self.data), store_size=True)
        self.sealed = True

    def frozen(self) -> Block:
        """This block as it is now (a filling one goes on growing; a capture takes a copy)."""
        if self.sealed:
            return self
        copy = Block(self.topic)
        copy.times = array("q", self.times)
        copy.data = bytes(self.data)
        copy.est = self.est
        return copy

    def items(self, since_ns: int = 0) -> Iterator[Item]:
        """Its frames at or after `since_ns`, in order."""
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
            if t >= since_ns:
                yield (topic, t, bytes(view[pos:pos + n]))
            pos += n


class Frames:
    """A capture's backlog item standing for a block's frames from `since_ns` on: expanded when
    the capture writes it (`items()`), so a capture beginning does not unpack the whole ring."""

    __slots__ = ("block", "since_ns")

    def __init__(self, block: Block, since_ns: int) -> None:
        self.block = block
        self.since_ns = since_ns

    def items(self) -> list[Item]:
        return list(self.block.items(self.since_ns))


class Ring:
    def __init__(self, packed: frozenset[str]) -> None:
        self._packed = packed
        # a block (its bytes: `Block.est`) or (an item, its bytes)
        self._entries: deque[Block | tuple[Item, int]] = deque()
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
            if block is not None and t - block.times[0] > BLOCK_SPAN_NS:
                block.seal()
                del self._filling[topic]
                block = None
            if block is None:
                block = self._filling[topic] = Block(topic)
                self._entries.append(block)
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
            head = entries[0]
            if isinstance(head, Block):
                newest, n, est = head.times[-1], len(head.times), head.est
            else:
                newest, n, est = head[0][1], 1, head[1]
            if newest >= oldest_ns and self.bytes <= max_bytes:
                return
            entries.popleft()
            if isinstance(head, Block) and self._filling.get(head.topic) is head:
                del self._filling[head.topic]
            self.messages -= n
            self.bytes -= est

    def backlog(self, start_ns: int) -> list[Item]:
        """Every message at or after `start_ns`, sorted by time, a block's frames still packed:
        one item (topic, time of its first frame taken, `Frames`) per block."""
        out: list[Item] = []
        for entry in self._entries:
            if isinstance(entry, Block):
                times = entry.times
                if times[-1] >= start_ns:
                    first = times[bisect_left(times, start_ns)]
                    out.append((entry.topic, first, Frames(entry.frozen(), start_ns)))
            elif entry[0][1] >= start_ns:
                out.append(entry[0])
        out.sort(key=itemgetter(1))
        return out
