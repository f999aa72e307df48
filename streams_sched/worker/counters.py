"""The scheduler's hot-path counters, moved into Scrapy's crawl stats in batches.

Scrapy's stats calls are not cheap, so the reactor thread counts enqueues, dequeues and
duplicates in plain ints and moves them into the crawl stats every so many dequeues and
at close, together with the counters the I/O thread queued on the Exchange.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streams_sched.worker.exchange import Exchange

if TYPE_CHECKING:
    from scrapy.statscollectors import StatsCollector

__all__ = ["Counters"]


class Counters:
    """Plain-int counters of the reactor thread, and the crawl stats they go to."""

    def __init__(self, stats: StatsCollector | None) -> None:
        self.stats = stats
        self.enqueued = self.dequeued = self.filtered = 0
        #: requests that cannot travel, taken in and handed out (unserializable.py)
        self.local_in = self.local_out = 0
        self._applied: dict[str, int] = {}

    def inc(self, key: str, n: int = 1) -> None:
        if self.stats is not None:
            self.stats.inc_value(key, n)

    def apply(self, x: Exchange | None) -> None:
        """Move the counters, and the I/O thread's, into the crawl stats."""
        for key, n in (
            ("scheduler/enqueued/redis", self.enqueued),
            ("scheduler/enqueued/memory", self.local_in),
            ("scheduler/enqueued", self.enqueued + self.local_in),
            ("scheduler/dequeued/redis", self.dequeued),
            ("scheduler/dequeued/memory", self.local_out),
            ("scheduler/dequeued", self.dequeued + self.local_out),
            ("dupefilter/filtered", self.filtered),
        ):
            done = self._applied.get(key, 0)
            if n > done:
                self.inc(key, n - done)
                self._applied[key] = n
        if x is None:
            return
        stats = x.stats
        while stats:
            key, n = stats.popleft()
            self.inc(key, n)
