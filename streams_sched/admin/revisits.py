"""Tracked pages waiting for their next visit: list them and stop their tracking.

A tracked page waits in its site's delayed ZSET (member ``<stream>:<seq>:<payload>``)
whose payload's meta has ``_rv`` (worker/revisits.py). A site with a delayed
request is in its shard's ready indexes, and one with a page in flight in its leased
index, so the sites to look at are read from those indexes, never from the registry:
what this costs follows the sites with work, not every site the crawl ever saw.

Stopping is done where it holds whatever the workers know: a site's policy ``revisit``
becomes ``off`` (ack.lua then schedules none of its pages, even from a worker that leased
them before), the crawl's meta gets ``revisits_stopped`` for ``--stop`` of the whole crawl
(each worker reads it with its default policy, every STREAMS_POLICY_REFRESH_SECONDS, and
stops tracking new pages), and the waiting pages leave the delayed ZSETs. Stopping one
URL removes its waiting visit or, when none is waiting (a visit of it is in flight, or
queued in a stream), puts the URL in the site's ``revisit_stops`` set, so that visit's ack
schedules no next one (ack.lua).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from streams_sched.frontier.client import REVISITS_STOPPED, Frontier
from streams_sched.frontier.delayed import waiting_page

__all__ = ["TrackedPage", "demand_of", "resume_tracking", "sites_with_work", "stop_tracking", "tracked_pages"]


@dataclass(frozen=True, slots=True)
class TrackedPage:
    """A tracked page waiting for its next visit."""

    site: str
    url: str
    due_ms: int
    interval_s: float
    member: bytes


def _page(site: str, member: bytes, score: float) -> TrackedPage | None:
    """The tracked page of a delayed member, or None (a delayed request, not a tracked page)."""
    page = waiting_page(member)
    return None if page is None else TrackedPage(site, page.url, int(score), page.interval_s, member)


#: how long a stopped URL waits for its visit in flight or queued: a lease lasts
#: STREAMS_LEASE_SECONDS and an expired one is taken over, so a visit of it is acked, or
#: dead-lettered, well within this
STOPS_TTL_MS = 3_600_000


def demand_of(interval_s: float) -> int:
    """A page's share of its site's revisit demand (``tdemand``), in millionths of a fetch
    per second, rounded as ack.lua rounds it."""
    ms = round(interval_s * 1000)
    return int(1e9 / ms + 0.5) if ms > 0 else 0


def sites_with_work(frontier: Frontier) -> list[str]:
    """Every site in a shard's ready or leased index: the only sites that can hold a tracked page."""
    out: set[str] = set()
    for n in range(frontier.shards):
        shard = frontier.shard(n)
        for key in (*shard.readies, shard.leased):
            out.update(m.decode() for m in frontier.client.zrange(key, 0, -1))
    return sorted(out)


def _pages(frontier: Frontier, site: str, url: str | None, batch: int = 500) -> Iterator[TrackedPage]:
    key = frontier.site(site).delayed
    start = 0
    while True:
        chunk = frontier.client.zrange(key, start, start + batch - 1, withscores=True)
        for member, score in chunk:
            page = _page(site, member, score)
            if page is not None and (url is None or page.url == url):
                yield page
        if len(chunk) < batch:
            return
        start += batch


def tracked_pages(frontier: Frontier, site: str | None = None, url: str | None = None,
                  limit: int = 100) -> list[TrackedPage]:
    """Up to ``limit`` tracked pages waiting for their next visit, soonest first per site."""
    out: list[TrackedPage] = []
    for s in [site] if site is not None else sites_with_work(frontier):
        for page in _pages(frontier, s, url):
            out.append(page)
            if len(out) >= limit:
                return out
    return out


def stop_tracking(frontier: Frontier, site: str | None = None, url: str | None = None) -> int:
    """Stop tracking a URL (of ``site``), a site, or the whole crawl (neither); return the
    waiting visits removed."""
    if url is not None and site is None:
        raise ValueError("a URL is stopped within its site: give the site too")
    if site is None:
        frontier.client.hset(frontier.keys.meta, REVISITS_STOPPED, "1")
        sites = sites_with_work(frontier)
    else:
        sites = [site]
    removed = 0
    for s in sites:
        keys = frontier.site(s)
        if url is None:
            # the site is registered (it has work, or the caller checked): the field the
            # policy of streams-sched site set --revisit would write (politeness/policy.py)
            frontier.client.hset(keys.policy, "revisit", "off")
            # its tracked pages are gone or going: a page in flight or promoted takes its
            # share off a demand that ack.lua keeps from falling below 0
            frontier.client.hdel(keys.stats, "tdemand", "stretch")
        pages = list(_pages(frontier, s, url))
        if not pages:
            if url is not None:
                # no visit of it waiting: one may be in flight or queued in a stream, and
                # ack.lua schedules none for a URL in this set (and takes it out)
                pipe = frontier.client.pipeline(transaction=False)
                pipe.sadd(keys.revisit_stops, url)
                pipe.pexpire(keys.revisit_stops, STOPS_TTL_MS)
                pipe.hset(keys.policy, "revisit_stops", "1")  # ack.lua reads the set only then
                pipe.execute()
            continue
        pipe = frontier.client.pipeline(transaction=False)
        for page in pages:
            pipe.zrem(keys.delayed, page.member)
        gone_each = [int(n) for n in pipe.execute()]
        gone = sum(gone_each)
        if gone:
            frontier.client.hincrby(keys.stats, "tracked", -gone)
            if url is not None:
                share = sum(demand_of(p.interval_s) for p, n in zip(pages, gone_each, strict=True) if n)
                if share:
                    frontier.client.hincrby(keys.stats, "tdemand", -share)
            # the site stays in its ready index at the removed visit's time until a lease
            # looks at it: put it where its keys say now, so a drained crawl reads drained
            frontier.reindex(s)
        removed += gone
    return removed


def resume_tracking(frontier: Frontier, site: str | None = None) -> int:
    """Undo a stop of a site (its policy revisit "off" goes) or of the crawl (its meta flag
    and every "off" of a site with work go): pages tracked by meta or setting are tracked
    again from their next ack; a site's policy revisit, which the stop replaced, is set
    again by ``site set --revisit``, and the visits a stop removed do not come back.
    Returns the sites turned back on."""
    if site is None:
        frontier.client.hdel(frontier.keys.meta, REVISITS_STOPPED)
        sites = sites_with_work(frontier)
    else:
        sites = [site]
    back = 0
    for s in sites:
        policy = frontier.site(s).policy
        if frontier.client.hget(policy, "revisit") == b"off":
            back += int(frontier.client.hdel(policy, "revisit"))
    return back
