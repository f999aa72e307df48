"""Rate over the last minute, from the ack buckets kept in a site's stats hash (pure).

``ack.lua`` counts acks in six 10-second buckets: field ``ack<slot>`` with
``slot = bucket % 6`` and ``ack_b`` = the newest bucket written, where
``bucket = floor(Redis TIME in ms / 10000)``. The buckets of the last minute are
the five full ones before the current bucket plus the current, partial one, so
the window is 50 to 60 seconds long; the rate is the acks in it divided by its
length. Buckets older than the window are ignored, so a site that stopped
acking shows 0 within a minute.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["BUCKET_MS", "SLOTS", "acks_last_minute", "ack_rate_per_s"]

#: Width of one ack bucket.
BUCKET_MS = 10_000
#: Buckets kept (one minute).
SLOTS = 6


def acks_last_minute(stats: Mapping[str, int], now_ms: int) -> tuple[int, float]:
    """-> (acks in the window, window length in seconds) at Redis time ``now_ms``."""
    now_b, into = divmod(now_ms, BUCKET_MS)
    window_s = (SLOTS - 1) * BUCKET_MS / 1000 + into / 1000
    last = stats.get("ack_b")
    if last is None:
        return 0, window_s
    # the slots hold buckets last-5..last; the window is now_b-5..now_b
    first = max(int(last), now_b) - (SLOTS - 1)
    count = sum(int(stats.get(f"ack{b % SLOTS}", 0)) for b in range(first, min(int(last), now_b) + 1))
    return count, window_s


def ack_rate_per_s(stats: Mapping[str, int], now_ms: int) -> float:
    """Acks per second over the last minute (0.0 when none)."""
    count, window_s = acks_last_minute(stats, now_ms)
    return count / window_s if window_s > 0 else 0.0
