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


def _replies(client: Any, commands: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``commands`` in one pipeline. A command this user may not run (or RedisBloom
    missing) raises PermissionError; another refusal (a key of another type) gives None."""
    pipe = client.pipeline(transaction=False)
    for command in commands:
        pipe.execute_command(*command)
    out = []
    for reply in pipe.execute(raise_on_error=False):
        if isinstance(reply, ResponseError):
            message = str(reply)
            if "NOPERM" in message or "no permissions" in message or "unknown command" in message.lower():
                raise PermissionError(message)
            reply = None
        elif isinstance(reply, Exception):
            raise reply
        out.append(reply)
    return out


#: TYPE of a RedisBloom filter
BF_TYPE = "MBbloom--"


def read_seen(
    frontier: Frontier, sites: list[str], meta: dict[str, str], now_s: float = 0.0, chunk: int = 500
) -> int | None:
    """Fingerprints recorded in the crawl's seen filters (summed over the live revisit
    buckets, if any), or None if this user or back-end cannot tell.

    A small site's filter is an exact set of 8-byte prefixes (a string: STRLEN / 8); a
    Bloom filter answers BF.CARD, or its layer state in the meta hash (bitmap). No
    command here fails on a key of the other form: each failed call would count in
    INFO errorstats, which operators alert on, so RedisBloom keys are told apart by TYPE.
    """
    mode = meta.get("dedupe")
    if mode not in ("bf", "bitmap"):
        return None
    client = frontier.client
    total = 0
    capacity = int(float(meta.get("bloom_capacity", 100_000)))
    expansion = int(float(meta.get("bloom_expansion", 2)))
    for i in range(0, len(sites), chunk):
        pairs = [pair for site in sites[i : i + chunk] for pair in seen_keys(frontier, site, meta, now_s)]
        if mode == "bf":
            kinds = [text(k) for k in _replies(client, [("TYPE", seen) for seen, _ in pairs])]
            asks = [("STRLEN" if kind == "string" else "BF.CARD", seen)
                    for (seen, _), kind in zip(pairs, kinds, strict=True) if kind in ("string", BF_TYPE)]
            for (command, _), reply in zip(asks, _replies(client, asks), strict=True):
                if reply is not None:
                    total += int(reply) // 8 if command == "STRLEN" else int(reply)
            continue
        commands = [c for seen, seen_meta in pairs for c in (("STRLEN", seen), ("HMGET", seen_meta, "layers", "count"))]
        replies = _replies(client, commands)
        for exact, state in zip(replies[::2], replies[1::2], strict=True):
            if state is not None and state[0] is not None:
                layers, count = (int(v) if v is not None else 0 for v in state)
                total += bitmap_items(layers, count, capacity, expansion)
            elif exact is not None:
                total += int(exact) // 8  # else a key of another type: that site is skipped
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
