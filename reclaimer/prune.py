"""The prune step of a reclaim pass: gone consumers and long-gone node records.

Consumers that own no pending entries and whose node is gone are removed from the
streams of the sites in the leased index and the first ``sites_per_shard`` of each ready
index (``prune.lua`` checks "owns nothing" atomically); records of nodes dead or offline
for ``node_retention_s`` are deleted, unless a leased index was too long to read whole
(then who owns leases is not known). Which consumers and which nodes is decided by the
pure :mod:`.logic`; this module reads and writes Redis for it.
"""

from __future__ import annotations

from typing import Any

import structlog
from redis.exceptions import NoScriptError, ResponseError

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.indexes import ready_sites
from streams_sched.frontier.keys import GROUP, STREAMS
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts import prune as prune_script
from streams_sched.service.liveness import DEFAULT_HEARTBEAT_S, NodeState

from .logic import nodes_to_forget, prune_candidates
from .results import CrawlPass
from .settings import ReclaimerSettings

__all__ = ["LEASED_PER_SHARD", "prune"]

log = structlog.get_logger("reclaimer")

#: sites of one shard's leased index a prune pass reads (they are bounded by the leases
#: in flight, not by the number of sites)
LEASED_PER_SHARD = 10_000

#: (stream index, consumer, pending, idle ms) of one site's consumers
Rows = list[tuple[int, str, int, int]]


def prune(f: Frontier, states: dict[str, NodeState], s: ReclaimerSettings, out: CrawlPass) -> None:
    """Remove the gone consumers of the crawl's active sites, then forget long-gone nodes."""
    # sites with pending entries (all of them, so that the owners of leases are known)
    # and with backlog; an idle site has no stream, hence no consumer
    leased = f.leased_sites(LEASED_PER_SHARD)
    sites = list(dict.fromkeys([*leased, *ready_sites(f, s.sites_per_shard)]))
    owners_known = not any(len(part) >= LEASED_PER_SHARD for part in _per_shard(f, leased))
    heartbeat_s = max((st.heartbeat_s for st in states.values()), default=DEFAULT_HEARTBEAT_S)
    gone_after_ms = int(s.dead_after_heartbeats * heartbeat_s * 1000)
    owners: set[str] = set()
    for i in range(0, len(sites), s.sites_per_round_trip):
        chunk = sites[i : i + s.sites_per_round_trip]
        plans: list[tuple[str, list[tuple[int, str]]]] = []
        for site, rows in zip(chunk, _consumers(f, chunk), strict=True):
            owners.update(name for _, name, pending, _ in rows if pending)
            victims = prune_candidates(rows, states, gone_after_ms)
            if victims:
                plans.append((site, victims))
        if plans:
            _remove(f, plans, out)
    if not owners_known:
        log.warning("nodes_kept", crawl=f.crawl, why=f"a shard has {LEASED_PER_SHARD} or more sites with leases:"
                    " the owners of leases are not all known, so no node record is forgotten this time")
        return
    forget = nodes_to_forget(states, owners, s.node_retention_s)
    if forget:
        f.client.hdel(f.keys.nodes, *forget)
        out.nodes_forgotten = len(forget)
        log.info("nodes_forgotten", crawl=f.crawl, nodes=forget, retention_s=s.node_retention_s)


def _consumers(f: Frontier, chunk: list[str]) -> list[Rows]:
    """The consumers of each site's streams, in two round trips."""
    # only streams that exist: XINFO of a missing one is an error reply, and
    # operators watch INFO errorstats
    pipe = f.client.pipeline(transaction=False)
    for site in chunk:
        for stream in f.site(site).streams:
            pipe.exists(stream)
    exists = iter(pipe.execute())
    asked = [[bool(next(exists)) for _ in STREAMS] for _ in chunk]
    pipe = f.client.pipeline(transaction=False)
    for site, there in zip(chunk, asked, strict=True):
        for stream, wanted in zip(f.site(site).streams, there, strict=True):
            if wanted:
                pipe.xinfo_consumers(stream, GROUP)
    answers = iter(pipe.execute(raise_on_error=False))
    out: list[Rows] = []
    for there in asked:
        rows: Rows = []
        for idx in range(len(STREAMS)):
            if not there[idx]:
                continue
            reply = next(answers)
            if isinstance(reply, Exception):
                if isinstance(reply, ResponseError):
                    continue  # no such stream or group: nothing to prune
                raise reply
            for c in reply:
                rows.append((idx, text(c.get("name")), int(c.get("pending", 0)), int(c.get("idle", 0))))
        out.append(rows)
    return out


def _remove(f: Frontier, plans: list[tuple[str, list[tuple[int, str]]]], out: CrawlPass) -> None:
    """prune.lua for each (site, consumers) in one round trip."""
    pipe = f.client.pipeline(transaction=False)
    calls = [prune_script.call(f, site, victims) for site, victims in plans]
    for call in calls:
        call.queue(pipe)
    for (site, victims), call, reply in zip(plans, calls, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(reply, NoScriptError):
            f.load_scripts()
            removed = call.run()
        elif isinstance(reply, Exception):
            raise reply
        else:
            removed = call.parse(reply)
        if removed:
            log.info(
                "consumers_removed", crawl=f.crawl, site=site, removed=removed,
                consumers=sorted({name for _, name in victims}),
            )
        out.consumers_removed += removed


def _per_shard(f: Frontier, sites: Any) -> list[list[str]]:
    by: dict[int, list[str]] = {}
    for site in sites:
        by.setdefault(f.site(site).shard or 0, []).append(site)
    return list(by.values())
