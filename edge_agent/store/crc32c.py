"""CRC-32C (Castagnoli), table-driven slicing-by-8: the journal's record checksum (pure Python)."""

from __future__ import annotations

import struct


def _tables() -> tuple[tuple[int, ...], ...]:
    t0 = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1  # Castagnoli, reflected
        t0.append(c)
    tabs = [t0]
    for _ in range(7):
        prev = tabs[-1]
        tabs.append([(prev[i] >> 8) ^ t0[prev[i] & 0xFF] for i in range(256)])
    return tuple(tuple(t) for t in tabs)


_T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7 = _tables()
_U32X2 = struct.Struct("<II")


def crc32c(data: bytes | bytearray | memoryview, crc: int = 0) -> int:
    """CRC-32C (Castagnoli) of `data`, continuing from `crc` like `zlib.crc32` (slicing-by-8)."""
    mv = memoryview(data).cast("B")
    crc ^= 0xFFFFFFFF
    n8 = len(mv) - len(mv) % 8
    t0, t1, t2, t3, t4, t5, t6, t7 = _T0, _T1, _T2, _T3, _T4, _T5, _T6, _T7
    for lo, hi in _U32X2.iter_unpack(mv[:n8]):
        lo ^= crc
        crc = (t7[lo & 0xFF] ^ t6[(lo >> 8) & 0xFF] ^ t5[(lo >> 16) & 0xFF] ^ t4[lo >> 24]
               ^ t3[hi & 0xFF] ^ t2[(hi >> 8) & 0xFF] ^ t1[(hi >> 16) & 0xFF] ^ t0[hi >> 24])
    for b in mv[n8:]:
        crc = t0[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF
