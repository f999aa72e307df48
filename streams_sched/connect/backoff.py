"""Growing delays while something keeps failing (Redis unreachable), for the worker's
I/O thread and the daemons alike."""

from __future__ import annotations

import time
from dataclasses import dataclass

__all__ = ["Backoff"]


@dataclass
class Backoff:
    """Delays that double from ``initial_s`` up to ``max_s``; :meth:`reset` after a success."""

    initial_s: float = 0.5
    max_s: float = 30.0
    current_s: float = 0.0
    since: float | None = None  # time.monotonic() of the first failure

    def next(self) -> float:
        if self.since is None:
            self.since = time.monotonic()
        self.current_s = min(self.max_s, max(self.initial_s, self.current_s * 2))
        return self.current_s

    @property
    def failing_s(self) -> float:
        return 0.0 if self.since is None else time.monotonic() - self.since

    def reset(self) -> float:
        """Forget the failures; return how long they lasted."""
        lasted = self.failing_s
        self.current_s = 0.0
        self.since = None
        return lasted
