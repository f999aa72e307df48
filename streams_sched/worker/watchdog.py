"""The reactor thread's watch on the I/O thread: a cycle that never returns is said aloud.

An outage (Redis refusing connections, timing out) makes cycles fail and retry, and the
I/O thread says so itself (io/trouble.py). A cycle that does not return at all (a call
stuck past every socket timeout, a lock that is never released) cannot speak for
itself: the worker would stop leasing and acking in silence. The scheduler calls
:meth:`Watchdog.check` whenever Scrapy asks it for work (at least every few seconds),
and once a cycle has run longer than ``stuck_after_s`` it logs one ERROR with where the
I/O thread is, then a one-line summary every minute, and a line when it returns.
Its age is also a metric (``streams_sched_worker_io_stuck_seconds``).
"""

from __future__ import annotations

import logging
import sys
import time
import traceback

from streams_sched.worker.exchange import Exchange

__all__ = ["SUMMARY_S", "Watchdog"]

logger = logging.getLogger(__name__)

#: how often a stuck cycle repeats its one-line summary
SUMMARY_S = 60.0


class Watchdog:
    """Notices an I/O cycle that has not returned for ``stuck_after_s`` seconds."""

    def __init__(self, x: Exchange, stuck_after_s: float, summary_s: float = SUMMARY_S) -> None:
        self.exchange = x
        self.stuck_after_s = stuck_after_s
        self.summary_s = summary_s
        #: the start of the stuck cycle it told of, and when it last told
        self._cycle: float = 0.0
        self._told: float = 0.0

    def stuck_s(self, now: float | None = None) -> float:
        """How long the cycle under way has run (0.0 between cycles)."""
        started = self.exchange.cycle_started
        if not started:
            return 0.0
        return max(0.0, (time.monotonic() if now is None else now) - started)

    def check(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        started = self.exchange.cycle_started
        if self._cycle and started != self._cycle:
            logger.error("streams-sched I/O thread is moving again after %.0fs", now - self._cycle)
            self._cycle = 0.0
        if not started or now - started < self.stuck_after_s:
            return
        if not self._cycle:
            self._cycle, self._told = started, now
            logger.error(
                "streams-sched I/O thread has been in one Redis cycle for %.0fs (longer than %.0fs): this"
                " worker leases and acks nothing meanwhile, and Redis did not report an error. It is at:\n%s",
                now - started, self.stuck_after_s, self._where(),
            )
        elif now - self._told >= self.summary_s:
            self._told = now
            logger.error("streams-sched I/O thread still in one Redis cycle after %.0fs", now - started)

    def _where(self) -> str:
        frame = sys._current_frames().get(self.exchange.io_thread or -1)
        if frame is None:
            return "  (the thread is gone)"
        return "".join(traceback.format_stack(frame)[-12:]).rstrip()
