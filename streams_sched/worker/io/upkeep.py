"""The I/O thread's idle-time work: policy, takeover of expired leases, the drain check.

None of it runs per site of the crawl. Takeover asks the shards' leased indexes for
sites with expired leases and takes over ONE lease at a time; the drain check reads one
line per shard (its indexes' sizes and its enqueue count); the crawl's default policy is
one hash. Moving a scrapy-redis feed is :mod:`streams_sched.worker.io.feeding`.
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import NoScriptError

from streams_sched.config import StreamsConfig
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import stream_mask
from streams_sched.scrapy_redis.legacy import LEGACY_FIELD
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.io.feeding import FeedStage
from streams_sched.worker.io.leasing import Leasing
from streams_sched.worker.leasebook import LeaseBook
from streams_sched.worker.ops import AckGate
from streams_sched.worker.selection import DrainDetector

__all__ = ["CLAIM_SITES_PER_PASS", "DRAIN_CHECK_FIRST_S", "Upkeep"]

logger = logging.getLogger(__name__)

#: the first and the fastest interval of drain checks while the crawl looks empty
DRAIN_CHECK_FIRST_S = 0.05
#: sites tried per takeover pass (XAUTOCLAIM of one expired lease)
CLAIM_SITES_PER_PASS = 8


class Upkeep:
    """Takeover of expired leases, the drain check and the crawl's default policy."""

    def __init__(
        self, frontier: Frontier, config: StreamsConfig, x: Exchange, book: LeaseBook, gate: AckGate,
        leasing: Leasing, feed: FeedStage, node_id: str,
    ) -> None:
        self.frontier = frontier
        self.config = config
        self.exchange = x
        self.book = book
        self.gate = gate
        self.leasing = leasing
        self.feed = feed
        self.node_id = node_id
        self.drain = DrainDetector()
        now = time.monotonic()
        self.started = now
        self.waiting_for_seeds_logged = False
        self.next_policy = now
        self.next_claim = now + min(config.lease_seconds, 5.0)
        self.next_busy_claim = now + config.lease_seconds
        self.next_drain_check = now
        self.drain_interval = DRAIN_CHECK_FIRST_S
        self.claim_cursor = 0
        #: a lease was taken over: take the next as soon as this one is done
        self.recovering = False

    def claim_now(self) -> None:
        """A suspect request is done: the next expired lease may be taken over."""
        self.next_claim = time.monotonic()

    def refresh_policy(self, now: float) -> None:
        """Re-read the crawl's default policy ("*"), so a live change reaches this worker."""
        self.next_policy = now + self.config.policy_refresh_seconds
        meta = self.frontier.crawl_meta()
        self.frontier.use_crawl_defaults(meta)
        self.exchange.legacy = meta.get(LEGACY_FIELD) or None

    def run(self, now: float, planned: bool, arrived: int) -> None:
        """Take over expired leases when there is nothing else to do (and now and then
        even when busy), and check whether the crawl is drained when idle."""
        room = self.leasing.capacity - self.book.total
        wants_claim = (not planned and now >= self.next_claim) or now >= self.next_busy_claim or self.recovering
        if room > 0 and self.book.suspects == 0 and wants_claim:
            self._claim_expired(now)
        local_idle = self.book.total == 0 and not self.exchange.outbox and not self.gate
        if not local_idle or arrived:
            self.drain.reset()
            self.drain_interval = DRAIN_CHECK_FIRST_S
            self.next_drain_check = now
        elif not planned and now >= self.next_drain_check:
            self._check_drain(now)

    def _claim_mask(self) -> str:
        """The streams a takeover may take from: http only while this worker holds its cap
        of browser leases (a browser lease taken over counts against the cap)."""
        cfg = self.config
        leasing = self.leasing
        if leasing.browser_cap and self.book.browser >= leasing.browser_cap:
            return stream_mask(["http"]) if leasing.http else ""
        return stream_mask(cfg.capabilities)

    def _claim_expired(self, now: float) -> None:
        """Take over ONE expired lease (XAUTOCLAIM), trying the sites with pending entries in turn.

        One at a time: an expired lease may be the request that killed its
        worker, and a worker holding two such requests could take an innocent
        one down with the poison one. While there are more, the next is taken
        as soon as this one is finished.
        """
        cfg = self.config
        self.next_claim = now + min(cfg.lease_seconds / 4, 2.0)
        self.next_busy_claim = now + cfg.lease_seconds
        self.recovering = False
        mask = self._claim_mask()
        if not mask:
            return
        sites = self.frontier.expired_sites(cfg.lease_ms, CLAIM_SITES_PER_PASS)
        for i in range(min(len(sites), CLAIM_SITES_PER_PASS)):
            site = sites[(self.claim_cursor + i) % len(sites)]
            try:
                reply = self.frontier.claim(site, self.node_id, cfg.lease_ms, 1, cfg.max_deliveries, "claim", mask)
            except NoScriptError:
                self.frontier.load_scripts()
                return
            taken, dead, entries = reply
            if dead:
                logger.warning(
                    "moved %d entries of site %s to the dead-letter stream (STREAMS_MAX_DELIVERIES=%d)",
                    dead, site, cfg.max_deliveries,
                )
                self.exchange.stats.append(("streams/dead_lettered", dead))
            if taken:
                self.claim_cursor = (self.claim_cursor + i) % len(sites)
                logger.info("took over an expired lease of site %s (%s)", site, entries[0].id.decode())
                self.exchange.stats.append(("streams/reclaimed", taken))
                self.recovering = True
                if self.leasing.accept(entries):
                    self.exchange.drained = False
                    self.exchange.wake_if_starved()
                return
            if dead:
                self.recovering = True
                return

    def _check_drain(self, now: float) -> None:
        if self.feed.pending():
            # the feed still has entries: not drained, and move them now
            self.drain.reset()
            self.feed.due_now(now)
            self.next_drain_check = now + self.config.feed_poll_seconds
            return
        counts = self.frontier.shard_counts()
        if not any(c[3] for c in counts) and self._waiting_for_seeds(now):
            return
        # one entry per shard: a site with work is in its shard's ready or leased index
        snapshot = {
            str(n): (ready_http == 0 and ready_browser == 0 and leased == 0, enqueued)
            for n, (ready_http, ready_browser, leased, enqueued) in enumerate(counts)
        }
        self.leasing.shards_with_work(counts, now)
        drained = self.drain.observe(snapshot)
        if drained != self.exchange.drained:
            self.exchange.drained = drained
            if drained:
                logger.info("crawl %s is drained: no backlog, lease or delayed request left", self.frontier.crawl)
            self.exchange.wake()
        # Confirm an empty-looking crawl quickly; otherwise look less and less often.
        if not drained and all(empty for empty, _ in snapshot.values()):
            self.drain_interval = DRAIN_CHECK_FIRST_S
        else:
            self.drain_interval = min(max(self.drain_interval * 2, 0.1), self.config.idle_poll_seconds)
        self.next_drain_check = time.monotonic() + self.drain_interval

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
        self.drain.reset()
        self.next_drain_check = now + min(0.5, cfg.idle_poll_seconds)
        return True
