"""Reading one crawl's state from Redis into plain data (read-only commands only).

Per crawl and read: SMEMBERS of the site registry, the read-only status
script for every site (EVALSHA_RO, pipelined ``chunk`` sites per round trip),
HGETALL of the nodes and meta hashes, TIME, and one command per site for the
seen-filter size (BF.CARD with RedisBloom, HMGET of the layer state with the
bitmap filter).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from streams_sched.frontier import BloomParams, Frontier, SiteStatus
from streams_sched.replies import text

__all__ = ["CrawlSnapshot", "bitmap_items", "read_crawl"]

logger = logging.getLogger(__name__)


@dataclass
class CrawlSnapshot:
    crawl: str
    #: Redis TIME, epoch seconds
    now_s: float
    sites: list[SiteStatus] = field(default_factory=list)
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: fingerprints in the seen filters of every site (None: the back-end or the ACL cannot tell)
    seen_estimate: int | None = None
    #: the crawl's default rate (policy "*"; 0 = none), for the sites' effective rates
    default_rate: float = 0.0

    @property
    def dead_letters(self) -> int:
        return sum(s.dead_letters for s in self.sites)

    def stat(self, name: str) -> int:
        return sum(s.stats.get(name, 0) for s in self.sites)


def bitmap_items(layers: int, count: int, capacity: int, expansion: int) -> int:
    """Items in a bitmap Bloom filter: every full layer holds its capacity
    (a layer is added when the newest reaches it), plus ``count`` in the newest."""
    if layers <= 0:
        return 0
    return sum(int(capacity * expansion**i) for i in range(layers - 1)) + max(count, 0)



def read_statuses(frontier: Frontier, sites: list[str], chunk: int = 500) -> list[SiteStatus]:
    """Status of every site, ``chunk`` sites per round trip."""
    out: list[SiteStatus] = []
    if not sites:
        return out
    for i in range(0, len(sites), chunk):
        part = sites[i : i + chunk]
        try:
            out += frontier.status_many(part)
        except NoScriptError:
            frontier.status(part[0])  # EVAL_RO caches the script for the EVALSHA_RO calls
            out += frontier.status_many(part)
    return out


def seen_keys(frontier: Frontier, site: str, meta: dict[str, str], now_s: float) -> list[tuple[str, str]]:
    """(filter, layer state) keys of a site's seen filters: one, or one per live revisit bucket."""
    keys = frontier.site(site)
    revisit_s = float(meta.get("revisit_seconds", 0) or 0)
    if revisit_s <= 0:
        return [(keys.seen, keys.seen_meta)]
    params = BloomParams(revisit_seconds=revisit_s, revisit_buckets=int(float(meta.get("revisit_buckets", 4))))
    return [keys.seen_bucket(b) for b in params.buckets(now_s)]


def read_seen(
    frontier: Frontier, sites: list[str], meta: dict[str, str], now_s: float = 0.0, chunk: int = 500
) -> int | None:
    """Fingerprints recorded in the crawl's seen filters (summed over the live revisit
    buckets, if any), or None if this user or back-end cannot tell."""
    mode = meta.get("dedupe")
    if mode not in ("bf", "bitmap"):
        return None
    total = 0
    capacity = int(float(meta.get("bloom_capacity", 100_000)))
    expansion = int(float(meta.get("bloom_expansion", 2)))
    for i in range(0, len(sites), chunk):
        pipe = frontier.client.pipeline(transaction=False)
        for site in sites[i : i + chunk]:
            for seen, seen_meta in seen_keys(frontier, site, meta, now_s):
                # a small site's filter is an exact set of 8-byte prefixes (a string):
                # STRLEN / 8; a Bloom filter answers BF.CARD or its layer state
                pipe.strlen(seen)
                if mode == "bf":
                    pipe.execute_command("BF.CARD", seen)
                else:
                    pipe.hmget(seen_meta, ["layers", "count"])
        replies = pipe.execute(raise_on_error=False)
        for exact, reply in zip(replies[::2], replies[1::2], strict=True):
            for r in (exact, reply):
                if isinstance(r, ResponseError):
                    text = str(r)
                    if "NOPERM" in text or "no permissions" in text or "unknown command" in text.lower():
                        raise PermissionError(text)
                elif isinstance(r, Exception):
                    raise r
            if mode == "bf" and not isinstance(reply, Exception):
                total += int(reply)
            elif mode == "bitmap" and not isinstance(reply, Exception) and reply[0] is not None:
                layers, count = (int(v) if v is not None else 0 for v in reply)
                total += bitmap_items(layers, count, capacity, expansion)
            elif not isinstance(exact, Exception):
                total += int(exact) // 8  # else a key of another type: skip that site
    return total


def read_crawl(frontier: Frontier, *, seen: bool = True, chunk: int = 500) -> CrawlSnapshot:
    """One crawl's state. ``seen=False`` skips the seen-filter sizes."""
    client = frontier.client
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.smembers(frontier.keys.sites)
    pipe.hgetall(frontier.keys.nodes)
    pipe.hgetall(frontier.keys.meta)
    (sec, usec), raw_sites, raw_nodes, raw_meta = pipe.execute()
    sites = sorted(text(s) for s in raw_sites)
    nodes: dict[str, dict[str, Any]] = {}
    for k, v in raw_nodes.items():
        try:
            info = json.loads(v)
        except ValueError:
            continue
        if isinstance(info, dict):
            nodes[text(k)] = info
    meta = {text(k): text(v) for k, v in raw_meta.items()}
    snap = CrawlSnapshot(frontier.crawl, int(sec) + int(usec) / 1e6, read_statuses(frontier, sites, chunk), nodes)
    try:
        snap.default_rate = float(meta.get("default_rate") or 0)
    except ValueError:
        snap.default_rate = 0.0
    if seen:
        snap.seen_estimate = read_seen(frontier, sites, meta, snap.now_s, chunk)
    return snap
