"""How many workers a crawl can use now: the signal an autoscaler scales the workers on.

Not the backlog. A polite crawl's speed is set by its sites' rates, not by how much is
queued: 1,000,000 requests on 10 sites held to 1 request/s each keep one worker busy at
10 requests/s, and a hundred workers would only wait on the same token buckets. So the
monitor exports what the sites allow and have work for:

- **demand** (requests/s), summed over the sites with work ready: a site paused (by an
  operator or a Retry-After) asks for nothing; a site with a rate (its policy, the crawl
  default, robots.txt Crawl-delay or the adaptive back-off, as lease.lua applies it) asks
  for that rate, but no more than its backlog spread over ``horizon_s``; an unlimited site
  asks for its backlog spread over ``horizon_s``;
- **workers wanted** = ``ceil(demand / worker rate)``, at least 1 while a request is leased
  (the workers finish what they hold), and 0 when nothing is ready or leased: delayed
  requests ask for nothing until the reclaimer promotes them as they fall due, and seeds
  or promoted requests ask again at once;
- **the worker rate** is what one worker does: ``--worker-rate``, or measured from the
  workers' heartbeats (each carries the acks it has sent), the best rate a live worker
  reached over the last ``RATE_MEMORY_S``, falling back to ``DEFAULT_WORKER_RATE`` before
  any worker has run.

It reads only what the monitor reads anyway (the sites the shards' ready indexes name, and
their sizes): where an index names more sites than the monitor reads (``--index-sites``),
the demand of the sites read is scaled up by the shards' count of ready sites. Nothing here
grows with the number of idle sites. Browser tasks are left out: browser workers are a
deployment of their own, scaled by their browser caps.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streams_sched.frontier.records import SiteStatus
from streams_sched.politeness.adaptive import effective_rate

from .snapshot import CrawlSnapshot

__all__ = ["DEFAULT_WORKER_RATE", "Demand", "Scaling", "WorkerRates", "crawl_demand", "site_demand", "workers_wanted"]

#: requests/s one worker is assumed to do before any worker's heartbeat has measured it
DEFAULT_WORKER_RATE = 20.0
#: how long a measured worker rate is remembered
RATE_MEMORY_S = 3600.0


@dataclass(frozen=True)
class Demand:
    """What a crawl's sites allow and have work for, now."""

    #: requests per second, summed over the sites with work ready
    requests_per_s: float
    #: sites with http work ready (the shards' ready indexes), and how many of them were read
    sites_ready: int
    sites_read: int
    #: some request is leased (a worker is crawling it)
    leased: bool


@dataclass(frozen=True)
class Scaling:
    """One crawl's scaling signal, as the monitor exports it."""

    demand: Demand
    #: one worker's requests/s the demand is divided by
    worker_rate: float
    workers_wanted: int


def site_demand(st: SiteStatus, *, default_rate: float, horizon_s: float) -> float:
    """Requests/s one site allows and has http work for."""
    backlog = sum(s.backlog for (task, _band), s in st.streams.items() if task == "http")
    if backlog <= 0:
        return 0.0
    eff = effective_rate(st.policy, st.now_ms, default_rate=default_rate)
    if eff.reason in ("paused", "retry-after"):
        return 0.0
    spread = backlog / horizon_s
    return min(eff.rate, spread) if eff.rate > 0 else spread


def crawl_demand(snap: CrawlSnapshot, *, horizon_s: float) -> Demand:
    """The demand of one crawl, from the monitor's read of it."""
    total = 0.0
    read = 0
    for st in snap.sites:
        d = site_demand(st, default_rate=snap.default_rate, horizon_s=horizon_s)
        if d > 0:
            total += d
            read += 1
    ready = snap.shards.ready_http if snap.shards is not None else read
    if read and ready > read:
        total *= ready / read  # the index named more sites than were read
    return Demand(total, ready, read, snap.leased)


def workers_wanted(demand: Demand, worker_rate: float, max_workers: int = 0) -> int:
    """Workers the crawl can use now (``max_workers`` > 0 caps it)."""
    wanted = math.ceil(demand.requests_per_s / worker_rate - 1e-9) if demand.requests_per_s > 0 else 0
    if demand.leased:
        wanted = max(wanted, 1)
    return min(wanted, max_workers) if max_workers > 0 else wanted


@dataclass
class WorkerRates:
    """One worker's rate, measured from the ``acked`` count in its heartbeats."""

    #: node -> (acked, Redis time of the record) as last seen
    last: dict[str, tuple[int, float]] = field(default_factory=dict)
    #: the best rate measured, and the Redis time it was measured at
    best: float = 0.0
    best_at: float = 0.0

    def observe(self, nodes: Mapping[str, Mapping[str, Any]], alive: Iterable[str]) -> None:
        """Read the live workers' records (``nodes``: node -> its record)."""
        seen = {}
        for node in alive:
            info = nodes.get(node, {})
            acked, at = info.get("acked"), info.get("last_seen")
            if not isinstance(acked, int) or not isinstance(at, (int, float)):
                continue  # an older worker, or a record without its time
            seen[node] = (acked, float(at))
            prev = self.last.get(node)
            if prev is not None and at > prev[1] and acked >= prev[0]:
                rate = (acked - prev[0]) / (at - prev[1])
                if rate >= self.best or at - self.best_at > RATE_MEMORY_S:
                    self.best, self.best_at = rate, float(at)
        self.last = seen

    def rate(self, configured: float) -> float:
        """``configured`` (> 0), else the measured rate, else DEFAULT_WORKER_RATE."""
        if configured > 0:
            return configured
        return self.best if self.best > 0 else DEFAULT_WORKER_RATE
