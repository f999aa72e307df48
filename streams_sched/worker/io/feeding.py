"""The I/O thread's side of a scrapy-redis feed: move one batch at a time into the crawl.

:mod:`streams_sched.scrapy_redis.feed` says how nothing of the feed is lost; this only
decides when to move the next batch, and what to do when Redis refuses the feed: say so
once and stop moving it, while the crawl goes on. The cycle (cycle.py) tells the sites
that got work to lease from them and that the crawl is not drained.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from redis.exceptions import ResponseError

from streams_sched.config import StreamsConfig
from streams_sched.worker.exchange import Exchange

if TYPE_CHECKING:
    from streams_sched.scrapy_redis.feed import FeedMover

__all__ = ["Feed"]

logger = logging.getLogger(__name__)


class Feed:
    """When to move the next batch of the feed, if the worker has one."""

    def __init__(self, feed: FeedMover | None, config: StreamsConfig, x: Exchange) -> None:
        self.mover = feed
        self.poll_s = config.feed_poll_seconds
        self.exchange = x
        self.next_move = 0.0

    def next_due(self) -> float | None:
        return None if self.mover is None else self.next_move

    def due_now(self, now: float) -> None:
        self.next_move = now

    def pending(self) -> int:
        """Entries left in the feed (0 without one, or once Redis refused it)."""
        if self.mover is None:
            return 0
        try:
            return self.mover.pending()
        except ResponseError as exc:
            self._refused(exc)
            return 0

    def _refused(self, exc: Exception) -> None:
        """Redis refused a feed command (an ACL without the feed key, a key of another
        type): say so once and stop moving the feed; the crawl goes on."""
        assert self.mover is not None
        logger.error(
            "streams-sched stops moving the feed %s: Redis refused (%s). Give the worker's ACL user"
            " the feed key, fix REDIS_START_URLS_AS_SET / REDIS_START_URLS_AS_ZSET, or set"
            " STREAMS_FEED_KEY = \"\" to turn the feed off",
            self.mover.key, exc,
        )
        self.exchange.stats.append(("streams/feed_refused", 1))
        self.mover = None

    def move(self, now: float) -> tuple[str, ...]:
        """Move one batch of the feed into the crawl when it is due; come back at once
        while the batches are full. Return the sites that got requests."""
        feed = self.mover
        if feed is None or now < self.next_move:
            return ()
        self.next_move = now + self.poll_s
        try:
            result = feed.move()
        except ResponseError as exc:
            self._refused(exc)
            return ()
        if result.read >= feed.batch or (result.length and not result.read):
            # more to move, or another worker holds the lock: look again soon
            self.next_move = now + (0.0 if result.read else 0.2)
        stats = self.exchange.stats
        if result.read:
            stats.append(("streams/feed_read", result.read))
        if result.added:
            stats.append(("streams/feed_added", result.added))
            stats.append(("streams/enqueued", result.added))
        if result.duplicates:
            stats.append(("streams/feed_duplicates", result.duplicates))
        if result.dead:
            stats.append(("streams/feed_dead_lettered", result.dead))
        return tuple(result.sites) if result.added else ()
