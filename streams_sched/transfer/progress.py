"""A progress bar on standard error, only when it is a terminal (pure, but for the writing)."""

from __future__ import annotations

import sys
import time
from typing import IO

__all__ = ["Progress", "bar_line"]


def bar_line(done: float, total: float | None, what: str, rate: float, width: int = 28) -> str:
    """``[#####-----]  42%  12,345 requests  3,456/s`` (no bar when the total is unknown)."""
    tail = f"{what}  {rate:,.0f}/s"
    if not total:
        return tail
    frac = min(1.0, max(0.0, done / total))
    filled = int(frac * width)
    return f"[{'#' * filled}{'-' * (width - filled)}] {frac * 100:5.1f}%  {tail}"


class Progress:
    """Draws :func:`bar_line` over itself, at most ``every_s`` apart; nothing when ``stream``
    (standard error) is not a terminal, so logs and pipes stay clean."""

    def __init__(self, stream: IO[str] | None = None, every_s: float = 0.2, force: bool = False) -> None:
        self.stream = stream or sys.stderr
        self.on = force or (hasattr(self.stream, "isatty") and self.stream.isatty())
        self.every_s = every_s
        self.started = time.monotonic()
        self._last = 0.0
        self._drawn = False

    def update(self, done: float, total: float | None, count: int, noun: str, final: bool = False) -> None:
        if not self.on:
            return
        now = time.monotonic()
        if not final and now - self._last < self.every_s:
            return
        self._last = now
        rate = count / max(1e-6, now - self.started)
        self.stream.write("\r\x1b[K" + bar_line(done, total, f"{count:,} {noun}", rate))
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
