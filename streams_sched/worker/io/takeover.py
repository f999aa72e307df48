"""Taking over expired leases: the requests of a worker that died.

When a worker has nothing else to do (and now and then even when busy), it asks the
shards' leased indexes for sites with expired leases and takes over ONE lease at a time
(claim.lua: XAUTOCLAIM). One at a time: an expired lease may be the request that killed
its worker, and a worker holding two such requests could take an innocent one down with
the poison one. While there are more, the next is taken as soon as this one is finished.
An entry delivered STREAMS_MAX_DELIVERIES times goes to the dead-letter stream instead.
"""

from __future__ import annotations

import logging
import time

from redis.exceptions import NoScriptError

from streams_sched.config import StreamsConfig
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import stream_mask
from streams_sched.frontier.records import LeasedEntry
from streams_sched.worker.exchange import Exchange

__all__ = ["CLAIM_SITES_PER_PASS", "Takeover", "claim_mask"]

logger = logging.getLogger(__name__)

#: sites tried per takeover pass (XAUTOCLAIM of one expired lease)
CLAIM_SITES_PER_PASS = 8


class Takeover:
    """When to look for expired leases, and taking one over."""

    def __init__(self, frontier: Frontier, config: StreamsConfig, x: Exchange, node_id: str) -> None:
        self.frontier = frontier
        self.config = config
        self.exchange = x
        self.node_id = node_id
        now = time.monotonic()
        #: when an idle worker looks next, and when a busy one does
        self.next_idle = now + min(config.lease_seconds, 5.0)
        self.next_busy = now + config.lease_seconds
        self.cursor = 0
        #: a lease was taken over: take the next as soon as this one is done
        self.recovering = False

    def suspect_done(self) -> None:
        """A request taken over is done: the next expired lease may be taken over."""
        self.next_idle = time.monotonic()

    def wanted(self, now: float, leased_now: bool) -> bool:
        """Whether to look now: idle (no lease call this cycle) and due, due even though
        busy, or recovering from a takeover."""
        return (not leased_now and now >= self.next_idle) or now >= self.next_busy or self.recovering

    def take_one(self, now: float, mask: str) -> list[LeasedEntry]:
        """Take over at most one expired lease from the streams of ``mask``; return it
        (empty if none was found)."""
        cfg = self.config
        self.next_idle = now + min(cfg.lease_seconds / 4, 2.0)
        self.next_busy = now + cfg.lease_seconds
        self.recovering = False
        if not mask:
            return []
        sites = self.frontier.expired_sites(cfg.lease_ms, CLAIM_SITES_PER_PASS)
        stats = self.exchange.stats
        for i in range(min(len(sites), CLAIM_SITES_PER_PASS)):
            site = sites[(self.cursor + i) % len(sites)]
            try:
                taken, dead, entries = self.frontier.claim(
                    site, self.node_id, cfg.lease_ms, 1, cfg.max_deliveries, "claim", mask,
                )
            except NoScriptError:
                self.frontier.load_scripts()
                return []
            if dead:
                logger.warning(
                    "moved %d entries of site %s to the dead-letter stream (STREAMS_MAX_DELIVERIES=%d)",
                    dead, site, cfg.max_deliveries,
                )
                stats.append(("streams/dead_lettered", dead))
            if taken:
                self.cursor = (self.cursor + i) % len(sites)
                logger.info("took over an expired lease of site %s (%s)", site, entries[0].id.decode())
                stats.append(("streams/reclaimed", taken))
                self.recovering = True
                return entries
            if dead:
                self.recovering = True
                return []
        return []


def claim_mask(capabilities: tuple[str, ...] | list[str], http: bool, browser_full: bool) -> str:
    """The streams a takeover may take from: http only while this worker holds its cap
    of browser leases (a browser lease taken over counts against the cap)."""
    if browser_full:
        return stream_mask(["http"]) if http else ""
    return stream_mask(capabilities)
