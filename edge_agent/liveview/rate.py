"""Per-channel rate limit of the live view: a token bucket per topic.

`rate_hz` messages a second on average, bursts of up to `burst` at once: a 1 kHz STATUS stream
reaches a viewer at `rate_hz`, while a burst of events (a stop: stop, state, report...) passes
whole. Pure: the caller gives the time.
"""

from __future__ import annotations


class RateLimit:
    """Token buckets by topic; `allow(topic, now)` takes a token or says no."""

    def __init__(self, rate_hz: float, burst: float | None = None) -> None:
        if rate_hz <= 0:
            raise ValueError(f"rate_hz must be > 0, not {rate_hz}")
        self.rate = rate_hz
        self.burst = max(1.0, burst if burst is not None else rate_hz / 5)
        self._tokens: dict[str, float] = {}
        self._at: dict[str, float] = {}
        self.limited: dict[str, int] = {}  # messages refused, by topic

    def allow(self, topic: str, now: float) -> bool:
        last = self._at.get(topic)
        tokens = self.burst if last is None else min(
            self.burst, self._tokens[topic] + (now - last) * self.rate)
        self._at[topic] = now
        if tokens >= 1.0:
            self._tokens[topic] = tokens - 1.0
            return True
        self._tokens[topic] = tokens
        self.limited[topic] = self.limited.get(topic, 0) + 1
        return False
