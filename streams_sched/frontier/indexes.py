"""Reads of the shards' indexes for the daemons and the command line (read-only commands).

A site with work is in its shard's indexes (keys.py): ``#ready:<task>`` while it has
backlog or delayed requests, ``#leased`` while it has leased entries. So what an
operator's tools need to look at follows the work, not the number of sites: each
function here costs one pipeline of one command per shard (per index), and returns at
most ``per_shard`` sites per shard and index, whatever the number of idle sites. A
site the index still names after its work is gone (dropped by the next lease or
takeover that finds it empty) reads as an empty site.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from streams_sched.connect.clients import RedisClient
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import TASK_TYPES
from streams_sched.frontier.reads import COUNTS_PER_SHARD, fold_shard_counts, queue_shard_counts
from streams_sched.frontier.replies import text

__all__ = ["IndexedSites", "ShardSizes", "due_delays", "indexed_sites", "ready_sites", "server_ms", "shard_sizes"]


def server_ms(client: RedisClient) -> int:
    """Redis TIME in ms (the clock the scripts score the indexes with)."""
    sec, usec = client.time()
    return int(sec) * 1000 + int(usec) // 1000


@dataclass
class ShardSizes:
    """One shard's figures: registered sites, sites in each index, requests ever enqueued."""

    sites: int = 0
    ready_http: int = 0
    ready_browser: int = 0
    leased: int = 0
    enqueued: int = 0

    def add(self, other: ShardSizes) -> None:
        self.sites += other.sites
        self.ready_http += other.ready_http
        self.ready_browser += other.ready_browser
        self.leased += other.leased
        self.enqueued += other.enqueued


def shard_sizes(f: Frontier) -> list[ShardSizes]:
    """Every shard's :class:`ShardSizes`, in one pipeline: its registry's SCARD, then the
    drain check's reads (reads.fold_shard_counts: a new site in a fresh list counts as ready)."""
    pipe = f.client.pipeline(transaction=False)
    for shard in f.shard_keys():
        pipe.scard(shard.sites)
        queue_shard_counts(pipe, shard)
    replies = pipe.execute()
    step = 1 + COUNTS_PER_SHARD
    return [ShardSizes(int(replies[i]), *fold_shard_counts(replies[i + 1 : i + step])) for i in range(0, len(replies), step)]


def _unique(names: Iterable[Any]) -> list[str]:
    return list(dict.fromkeys(text(n) for n in names))


def ready_sites(f: Frontier, per_shard: int, until_ms: int | None = None) -> list[str]:
    """Sites in a ready index (any task type), the ``per_shard`` with the lowest scores of each
    shard and index; with ``until_ms``, only those whose score is at most that (due by then)."""
    pipe = f.client.pipeline(transaction=False)
    for shard in f.shard_keys():
        for ready in shard.readies:
            if until_ms is None:
                pipe.zrange(ready, 0, per_shard - 1)
            else:
                pipe.zrangebyscore(ready, "-inf", until_ms, start=0, num=per_shard)
    return _unique(s for part in pipe.execute() for s in part)


def due_delays(f: Frontier, sites: Sequence[str], now_ms: int) -> list[str]:
    """The sites among ``sites`` with a delayed request due by ``now_ms`` (one ZRANGEBYSCORE each)."""
    if not sites:
        return []
    pipe = f.client.pipeline(transaction=False)
    for site in sites:
        pipe.zrangebyscore(f.site(site).delayed, "-inf", now_ms, start=0, num=1)
    return [site for site, due in zip(sites, pipe.execute(), strict=True) if due]


@dataclass
class IndexedSites:
    """The sites the indexes name, with their scores (ms): leased ones by their oldest
    lease, ready ones by when they may be leased."""

    leased: dict[str, float] = field(default_factory=dict)
    ready: dict[str, float] = field(default_factory=dict)
    #: some shard's index held more than ``per_shard`` sites: these are not all of them
    truncated: bool = False

    @property
    def sites(self) -> list[str]:
        """Leased sites (oldest lease first), then the other ready ones (earliest first)."""
        leased = sorted(self.leased, key=lambda s: (self.leased[s], s))
        ready = sorted((s for s in self.ready if s not in self.leased), key=lambda s: (self.ready[s], s))
        return leased + ready


def indexed_sites(f: Frontier, per_shard: int) -> IndexedSites:
    """The ``per_shard`` first sites of each shard's leased and ready indexes and of its lists
    of new sites (one pipeline). A new site has no score yet: it comes after the ready ones."""
    pipe = f.client.pipeline(transaction=False)
    for shard in f.shard_keys():
        pipe.zrange(shard.leased, 0, per_shard - 1, withscores=True)
        for ready, fresh in zip(shard.readies, shard.freshes, strict=True):
            pipe.zrange(ready, 0, per_shard - 1, withscores=True)
            pipe.lrange(fresh, 0, per_shard - 1)
    out = IndexedSites()
    replies = iter(pipe.execute())
    for _ in range(f.shards):
        for into in (out.leased, *([out.ready, None] * len(TASK_TYPES))):
            part = next(replies)
            out.truncated = out.truncated or len(part) >= per_shard
            if into is None:
                part = [(name, float("inf")) for name in part]
                into = out.ready
            for name, score in part:
                site = text(name)
                into[site] = min(float(score), into.get(site, float("inf")))
    return out
