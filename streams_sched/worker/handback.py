"""Handing leases back as a worker closes, so other workers get them at once.

A closing worker (SIGTERM, Ctrl-C, CLOSESPIDER_*) leases nothing more and releases
every prefetched request the engine has not started, at once rather than when its
lease expires. Requests in progress may finish within STREAMS_SHUTDOWN_TIMEOUT_SECONDS;
after it, their leases are released too. Requests that cannot travel (held with no
lease) are lost with the worker: they are counted and logged, never dropped silently.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from scrapy import Request

from streams_sched.frontier.records import LeasedEntry
from streams_sched.worker.counters import Counters
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.ops import Op, Release
from streams_sched.worker.ready import ReadyQueues

__all__ = ["hand_back_in_progress", "hand_back_unstarted"]

logger = logging.getLogger(__name__)


def hand_back_unstarted(ready: ReadyQueues, put: Callable[[Op], None], counts: Counters, spider: Any) -> int:
    """Release every prefetched request the engine has not started; return how many."""
    ready.absorb()
    local = ready.local
    leases = ready.take_all()
    for entry in leases:
        put(Release(entry))
    if local:
        counts.inc("streams/unserializable_lost", local)
        logger.warning(
            "streams-sched closing with %d local requests not crawled: they could not travel"
            " through the shared queue (see the warnings above), so no other worker will crawl them",
            local, extra={"spider": spider},
        )
    ready.local = 0
    if ready.exchange is not None:
        ready.exchange.kick()
    return len(leases)


def hand_back_in_progress(
    leases: dict[Request, LeasedEntry], ready: ReadyQueues, put: Callable[[Op], None], x: Exchange | None,
) -> int:
    """Release the leases of requests the engine started but did not finish."""
    n = len(leases)
    for entry in leases.values():
        put(Release(entry))
        ready.release_site(entry.site)
    leases.clear()
    if x is not None:
        x.kick()
    return n
