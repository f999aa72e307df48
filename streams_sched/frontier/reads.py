"""The frontier's reads and clean-up for the daemons and the command line.

Read-only snapshots of sites and shards (status.lua as EVALSHA_RO, so a read-only ACL
user can run them), the sites with expired leases, the crawl registry, node records and
events, dead letters, and purging a crawl or a site. :class:`CrawlReads` is a part of
:class:`~streams_sched.frontier.client.Frontier`; it uses the client, keys and scripts
the Frontier holds.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError

from streams_sched.connect.clients import TRANSIENT, Pipeline, RedisClient, refresh_topology
from streams_sched.frontier.clock import RedisClock
from streams_sched.frontier.keys import CrawlKeys, ShardKeys, SiteKeys
from streams_sched.frontier.records import BloomParams, SiteStatus
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts import Call, Scripts
from streams_sched.frontier.scripts import status as status_script

__all__ = ["COUNTS_PER_SHARD", "CrawlReads", "fold_shard_counts", "queue_shard_counts"]

logger = logging.getLogger(__name__)

R = TypeVar("R")


#: commands :func:`queue_shard_counts` queues per shard
COUNTS_PER_SHARD = 6


def queue_shard_counts(pipe: Pipeline, shard: ShardKeys) -> None:
    """Queue the reads of one shard's :func:`fold_shard_counts` on ``pipe``."""
    for ready in shard.readies:
        pipe.zcard(ready)
    for fresh in shard.freshes:
        pipe.llen(fresh)
    pipe.zcard(shard.leased)
    pipe.hget(shard.stats, "enqueued")


def fold_shard_counts(part: Sequence[Any]) -> tuple[int, int, int, int]:
    """(sites ready for http, for browser, sites with leases, enqueued) from the replies of
    :func:`queue_shard_counts`. A shard's new sites not yet in its ready index count as
    ready (a site in both counts twice until a lease call pops it from the list)."""
    http, browser, fresh_http, fresh_browser, leased, enqueued = part
    return int(http) + int(fresh_http), int(browser) + int(fresh_browser), int(leased), int(enqueued or 0)


def _chunked(items: Sequence[Any], n: int) -> Iterable[list[Any]]:
    for i in range(0, len(items), n):
        yield list(items[i : i + n])


def _status_pipeline(client: RedisClient, calls: Mapping[str, Call[Any]]) -> dict[str, Any]:
    """The replies of read-only calls (EVALSHA_RO), by site, sent in one plain pipeline."""
    pipe = client.pipeline(transaction=False)
    for call in calls.values():
        call.queue(pipe)
    return dict(zip(calls, pipe.execute(raise_on_error=False), strict=True))


def _is_moved(exc: Exception) -> bool:
    """A cluster redirection: the slot moved (resharding) since the client read the map."""
    text = str(exc)
    return text.startswith(("MOVED", "ASK")) or type(exc).__name__ in ("MovedError", "AskError")


class CrawlReads:
    """Reads and clean-up of a crawl (a part of Frontier)."""

    client: RedisClient
    crawl: str
    keys: CrawlKeys
    group: str
    scripts: Scripts
    cluster: bool
    bloom: BloomParams
    clock: RedisClock
    default_task: str
    default_policy: tuple[str, ...]
    politeness: str
    revisit_budget_share: float
    revisit_rule: str

    @property
    def shards(self) -> int:
        raise NotImplementedError

    def site(self, site: str) -> SiteKeys:
        raise NotImplementedError

    def shard(self, n: int) -> ShardKeys:
        raise NotImplementedError

    def shard_keys(self) -> list[ShardKeys]:
        raise NotImplementedError

    def sites(self) -> list[str]:
        raise NotImplementedError

    @staticmethod
    def crawls(client: RedisClient) -> list[str]:
        return sorted(
            c.decode() if isinstance(c, bytes) else c for c in client.smembers(CrawlKeys.registry())
        )

    def subscribe_events(self) -> Any:
        """A pub/sub object subscribed to the crawl's node events (SSUBSCRIBE on a cluster).

        Read it with ``get_sharded_message()`` on a cluster, ``get_message()`` otherwise.
        """
        pubsub = self.client.pubsub()
        if self.cluster:
            pubsub.ssubscribe(self.keys.events)
        else:
            pubsub.subscribe(self.keys.events)
        return pubsub

    def nodes(self) -> dict[str, dict[str, Any]]:
        raw = self.client.hgetall(self.keys.nodes)
        out = {}
        for k, v in raw.items():
            try:
                out[k.decode() if isinstance(k, bytes) else k] = json.loads(v)
            except ValueError:
                continue
        return out

    def filters(self, site: str, now: float | None = None) -> list[str]:
        """Bloom filter keys (filter, meta, ...) for enqueue: current filter first. With
        revisits, the buckets are those of Redis time ``now`` (default: the clock's now), so
        every writer puts a fingerprint in the same bucket whatever its own clock says."""
        k = self.site(site)
        b = self.bloom
        if not b.revisit_s:
            return [k.seen, k.seen_meta]
        keys: list[str] = []
        for bucket in b.buckets(self.clock.now() if now is None else now):
            keys += k.seen_bucket(bucket)
        return keys

    def status(self, site: str, client: RedisClient | None = None) -> SiteStatus:
        """Read-only snapshot of a site (works for a read-only ACL user)."""
        return status_script.call(self, site).run(client)

    def status_many(self, sites: Sequence[str]) -> list[SiteStatus]:
        """Snapshots of many sites in one round trip (EVALSHA_RO in a pipeline; on a
        cluster, one pipeline per node). Works for a read-only ACL user."""
        if not sites:
            return []
        replies = self.run_many({s: status_script.call(self, s) for s in sites})
        return [replies[s] for s in sites]

    def run_many(self, calls: Mapping[str, Call[R]]) -> dict[str, R]:
        """Run read-only calls of many sites (keyed by site) in one round trip per server: a
        plain pipeline of EVALSHA_RO, one per node on a cluster. A call the server refuses
        for a script it does not have, or a slot that moved, runs again on its own (EVAL_RO
        loads nothing; the cluster client follows MOVED). Works for a read-only ACL user."""
        if not calls:
            return {}
        replies: dict[str, Any] = {}
        if self.cluster:
            # redis-py's cluster pipeline routes EVALSHA_RO with a COMMAND GETKEYS round
            # trip per call: send each node its own sites in a plain pipeline instead.
            by_node: dict[str, tuple[Any, list[str]]] = {}
            assert isinstance(self.client, RedisCluster)
            for s in calls:
                node = self.client.get_node_from_key(self.site(s).tag)  # type: ignore[no-untyped-call]
                by_node.setdefault(node.name, (node.redis_connection, []))[1].append(s)
            for connection, node_sites in by_node.values():
                try:
                    replies.update(_status_pipeline(connection, {s: calls[s] for s in node_sites}))
                except TRANSIENT:
                    refresh_topology(self.client)  # so the caller's retry asks the node's successor
                    raise
        else:
            replies = _status_pipeline(self.client, calls)
        out: dict[str, R] = {}
        for s, call in calls.items():
            reply = replies[s]
            if isinstance(reply, NoScriptError) or (isinstance(reply, Exception) and _is_moved(reply)):
                out[s] = call.run()  # EVAL_RO loads nothing; the cluster client follows MOVED
            elif isinstance(reply, Exception):
                raise reply
            else:
                out[s] = call.parse(reply)
        return out

    def shard_counts(self) -> list[tuple[int, int, int, int]]:
        """:func:`fold_shard_counts` of every shard, in one pipeline: what the drain check
        reads, whatever the number of idle sites (an idle site is in none of the indexes)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.shard_keys():
            queue_shard_counts(pipe, shard)
        out = []
        for part in _chunked(pipe.execute(raise_on_error=False), COUNTS_PER_SHARD):
            for v in part:
                if isinstance(v, Exception):
                    raise v
            out.append(fold_shard_counts(part))
        return out

    def expired_sites(self, older_than_ms: int, per_shard: int) -> list[str]:
        """Sites whose oldest lease was granted more than ``older_than_ms`` ago (Redis
        time), up to ``per_shard`` per shard: where a takeover may find expired leases.
        One round trip per shard's server, whatever the number of idle sites."""
        now_s, now_us = self.client.time()
        cutoff = now_s * 1000 + now_us // 1000 - older_than_ms
        pipe = self.client.pipeline(transaction=False)
        for shard in self.shard_keys():
            pipe.zrangebyscore(shard.leased, "-inf", cutoff, start=0, num=per_shard)
        return [text(s) for part in pipe.execute() for s in part]

    def leased_sites(self, per_shard: int = 10_000) -> list[str]:
        """Sites that hold leased entries (at most ``per_shard`` per shard)."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.shard_keys():
            pipe.zrange(shard.leased, 0, per_shard - 1)
        return [text(s) for part in pipe.execute() for s in part]

    def dead_letters(self, site: str, count: int = 100, start: str = "-") -> list[dict[str, Any]]:
        out = []
        for entry_id, fields in self.client.xrange(self.site(site).dlq, start, "+", count=count) or []:
            d: dict[str, Any] = {text(k): v for k, v in (fields or {}).items()}
            d["dlq_id"] = text(entry_id)
            d["site"] = site
            out.append(d)
        return out

    def purge_site(self, site: str, pipe: Pipeline | None = None) -> Any:
        """Delete every key of a site (one DEL: all keys share the site's hash slot).
        Revisit buckets older than the window expire on their own."""
        k = self.site(site)
        keys = list(k.all)
        if self.bloom.revisit_s:
            keys += self.filters(site)
        target = pipe if pipe is not None else self.client.pipeline(transaction=False)
        target.execute_command("DEL", *keys)  # one slot; a cluster pipeline refuses a multi-key delete()
        ix = k.index
        for ready in ix.readies:
            target.zrem(ready, site)
        target.zrem(ix.leased, site)
        target.hdel(ix.inbox, site)
        target.srem(ix.sites, site)
        if pipe is not None:
            return None
        return int(target.execute()[0])

    def purge(self) -> int:
        """Delete the whole crawl: every site's keys, the shards' indexes, nodes, meta, the
        feed lock, a migrated scrapy-redis dupefilter (never the scrapy-redis keys themselves),
        and the ledgers of the files loaded into it."""
        sites = self.sites()
        deleted = 0
        pipe = self.client.pipeline(transaction=False)
        for i, s in enumerate(sites):
            # the site's own keys only: the shards' indexes go whole below
            keys = list(self.site(s).all) + (self.filters(s) if self.bloom.revisit_s else [])
            pipe.execute_command("DEL", *keys)
            if i % 1000 == 999:
                deleted += sum(int(n) for n in pipe.execute())
        deleted += sum(int(n) for n in pipe.execute())
        k = self.keys
        loads = [text(f) for f in self.client.hkeys(k.loads)]
        for shard in self.shard_keys():
            deleted += int(self.client.delete(*shard.all))
            for file_id in loads:  # the ledgers of the files loaded into the crawl
                deleted += int(self.client.delete(shard.ledger(file_id)))
        deleted += int(self.client.delete(k.nodes, k.meta, k.feed_lock, k.legacy_seen, k.sync, k.dump_lock, k.loads))
        self.client.srem(CrawlKeys.registry(), self.crawl)
        return deleted
