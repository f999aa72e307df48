"""Parse an HTTP Retry-After header into a delay (pure, no I/O)."""

from __future__ import annotations

from email.utils import parsedate_to_datetime

__all__ = ["retry_after_s"]


def retry_after_s(value: bytes | str | None, now: float, cap: float) -> float | None:
    """Seconds to wait from ``now`` (epoch seconds), capped at ``cap``; None if absent or invalid.

    Accepts delta-seconds ("120") and HTTP dates ("Wed, 21 Oct 2026 07:28:00 GMT").
    """
    if value is None:
        return None
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        delay = float(text)
    else:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        delay = when.timestamp() - now
    if delay <= 0:
        return None
    return min(delay, cap)
