"""From entries to enqueue.lua calls: the migrated dupefilter first, then by shard and site.

What every producer does with a batch of :class:`~streams_sched.frontier.records.Entry`
(the worker's I/O thread, the Seeder, the scrapy-redis feed):

1. :func:`drop_legacy_seen`: drop what a migrated scrapy-redis dupefilter saw (one
   SMISMEMBER for the batch; scrapy_redis/legacy.py);
2. :func:`enqueue_calls`: group the rest by shard, then by site, into enqueue.lua calls
   of at most ``limit`` entries (one call takes several sites of one shard);
3. send them: :func:`queue_enqueues` puts the calls on a redis-py pipeline (the worker's
   I/O thread and the feed). The Seeder packs the same calls as Redis protocol itself
   and writes them on one connection per primary, a batch ahead of its replies
   (seeding/packing.py): for a million one-URL sites that is what keeps it fast, and a
   pipeline cannot leave replies unread across batches.

Registering needs nothing here: enqueue.lua adds each site it adds to to the crawl's
site index. The Seeder also adds the crawl to the crawl registry (a seeded crawl may
have no worker yet); the feed registers its dead-letter site.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TypeVar

from streams_sched.connect.clients import Pipeline, RedisClient
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import shard_of
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import enqueue
from streams_sched.scrapy_redis.legacy import legacy_seen

__all__ = ["CALL_LIMIT", "CallParts", "drop_legacy_seen", "enqueue_calls", "queue_enqueues"]

T = TypeVar("T")

#: Entries per enqueue.lua call of a worker or the feed: a call blocks Redis while it runs.
CALL_LIMIT = 256

#: The parts of one enqueue.lua call: (site, its entries) of sites of one shard, in call order.
CallParts = list[tuple[str, list[Entry]]]


def drop_legacy_seen(client: RedisClient, legacy: str | None, entries: list[Entry]) -> tuple[list[Entry], list[Entry]]:
    """(to enqueue, dropped): the entries scrapy-redis's migrated dupefilter ``legacy`` (a SET
    key; None: the crawl has none) holds the ``legacy_fp`` of are dropped. The ones checked
    and kept lose their ``legacy_fp``: an entry sent again is not looked up again."""
    if legacy is None:
        return entries, []
    checked = [e for e in entries if e.legacy_fp]
    if not checked:
        return entries, []
    seen = legacy_seen(client, legacy, [e.legacy_fp for e in checked])
    dropped: list[Entry] = []
    for entry, hit in zip(checked, seen, strict=True):
        entry.legacy_fp = b""
        if hit:
            dropped.append(entry)
    if not dropped:
        return entries, []
    gone = {id(e) for e in dropped}
    return [e for e in entries if id(e) not in gone], dropped


def enqueue_calls(
    entries: Iterable[T], shards: int, limit: int | None = CALL_LIMIT, site_of: Callable[[T], str] | None = None,
) -> list[list[tuple[str, list[T]]]]:
    """``entries`` as enqueue.lua calls: by shard, each with the sites of that shard (in the
    order they first appear, their entries in order), split so that no call has more
    than ``limit`` entries (None: one call per shard). ``site_of``: an item's site, for
    items that are not entries (a load's, which carry one); default ``item.site``."""
    by_shard: dict[int, dict[str, list[T]]] = {}
    for e in entries:
        site = site_of(e) if site_of is not None else e.site  # type: ignore[attr-defined]
        by_shard.setdefault(shard_of(site, shards), {}).setdefault(site, []).append(e)
    calls: list[list[tuple[str, list[T]]]] = []
    for by_site in by_shard.values():
        if limit is None:
            calls.append(list(by_site.items()))
            continue
        parts: list[tuple[str, list[T]]] = []
        size = 0
        for site, items in by_site.items():
            for i in range(0, len(items), limit):
                chunk = items[i : i + limit]
                if parts and size + len(chunk) > limit:
                    calls.append(parts)
                    parts, size = [], 0
                parts.append((site, chunk))
                size += len(chunk)
        if parts:
            calls.append(parts)
    return calls


def queue_enqueues(
    frontier: Frontier, pipe: Pipeline, entries: Iterable[Entry], limit: int = CALL_LIMIT
) -> list[CallParts]:
    """Queue ``entries`` on ``pipe`` as enqueue.lua calls (:func:`enqueue_calls`); returns
    the calls' parts in order, one reply each (one part per site: read it with
    ``scripts.enqueue.parse_site``)."""
    calls = enqueue_calls(entries, frontier.shards, limit)
    for parts in calls:
        enqueue.call(frontier, parts).queue(pipe)
    return calls
