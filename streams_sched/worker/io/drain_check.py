"""The I/O thread's drain check: is the crawl drained in Redis?

It reads one line per shard (its indexes' sizes and its enqueue counter), never one per
site, and hands the snapshots to the drain decision (:class:`~streams_sched.worker.drain.DrainDetector`).
It is the one writer of ``Exchange.drained``: the cycle tells it when work was seen
(:meth:`DrainCheck.work_seen`) and when the worker is idle (:meth:`DrainCheck.idle`).
A crawl that never had a request is not drained until STREAMS_EMPTY_CRAWL_WAIT_SECONDS
have passed: it has not started yet.
"""

from __future__ import annotations

import logging
import time

from streams_sched.config import StreamsConfig
from streams_sched.frontier.client import Frontier
from streams_sched.worker.drain import DrainDetector
from streams_sched.worker.exchange import Exchange

__all__ = ["DRAIN_CHECK_FIRST_S", "DrainCheck"]

logger = logging.getLogger(__name__)

#: the first and the fastest interval of drain checks while the crawl looks empty
DRAIN_CHECK_FIRST_S = 0.05

#: per shard: (ready http sites, ready browser sites, sites with leases, enqueue counter)
ShardCounts = tuple[int, int, int, int]


class DrainCheck:
    """When to look at the shards, what they say, and ``Exchange.drained``."""

    def __init__(self, frontier: Frontier, config: StreamsConfig, x: Exchange) -> None:
        self.frontier = frontier
        self.config = config
        self.exchange = x
        self.detector = DrainDetector()
        self.started = time.monotonic()
        self.next_check = self.started
        self.interval_s = DRAIN_CHECK_FIRST_S
        self.waiting_for_seeds_logged = False

    def work_seen(self, now: float) -> None:
        """Requests arrived or were added, or this worker holds some: not drained, and
        the next look, once idle, comes soon."""
        self.detector.reset()
        self.interval_s = DRAIN_CHECK_FIRST_S
        self.next_check = now
        if self.exchange.drained:
            self.exchange.drained = False

    def due(self, now: float) -> bool:
        return now >= self.next_check

    def feed_pending(self, now: float) -> None:
        """A scrapy-redis feed still has entries: not drained; look again after a poll."""
        self.detector.reset()
        self.next_check = now + self.config.feed_poll_seconds

    def check(self, now: float, counts: list[ShardCounts]) -> None:
        """Judge one reading of the shards (``Frontier.shard_counts``)."""
        if not any(c[3] for c in counts) and self._waiting_for_seeds(now):
            return
        # one entry per shard: a site with work is in its shard's ready or leased index
        snapshot = {
            str(n): (ready_http == 0 and ready_browser == 0 and leased == 0, enqueued)
            for n, (ready_http, ready_browser, leased, enqueued) in enumerate(counts)
        }
        x = self.exchange
        drained = self.detector.observe(snapshot)
        if drained != x.drained:
            x.drained = drained
            if drained:
                logger.info("crawl %s is drained: no backlog, lease or delayed request left", self.frontier.crawl)
            x.wake()
        # Confirm an empty-looking crawl quickly; otherwise look less and less often.
        if not drained and all(empty for empty, _ in snapshot.values()):
            self.interval_s = DRAIN_CHECK_FIRST_S
        else:
            self.interval_s = min(max(self.interval_s * 2, 0.1), self.config.idle_poll_seconds)
        self.next_check = time.monotonic() + self.interval_s

    def _waiting_for_seeds(self, now: float) -> bool:
        """A crawl that never had a request is not drained: it has not started yet."""
        cfg = self.config
        if self.exchange.started_locally or now - self.started >= cfg.empty_crawl_wait_seconds:
            return False
        if not self.waiting_for_seeds_logged:
            logger.info(
                "crawl %s has no requests yet; waiting up to %gs for seeds"
                " (STREAMS_EMPTY_CRAWL_WAIT_SECONDS; seed with `streams-sched push`)",
                self.frontier.crawl, cfg.empty_crawl_wait_seconds,
            )
            self.waiting_for_seeds_logged = True
        self.detector.reset()
        self.next_check = now + min(0.5, cfg.idle_poll_seconds)
        return True
