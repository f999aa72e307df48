"""Thin Redis I/O for the frontier: one method per script or command.

Every method takes ``pipe=``: pass a pipeline to batch many calls into one
round trip, then turn each reply into data with the matching ``parse_*``
function. Without ``pipe`` the call runs at once and returns the parsed reply.
Workers, daemons and the CLI all go through this class, so the key layout and the scripts have one
face. Records (records.py), reply parsers (replies.py), dedupe (bloom.py), reads and clean-up (reads.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from streams_sched.connect.clients import is_cluster_client
from streams_sched.frontier import script_keys
from streams_sched.frontier.clock import RedisClock
from streams_sched.frontier.keycache import SiteKeyCache
from streams_sched.frontier.keys import (
    DEFAULT_SHARDS,
    GROUP,
    MAX_SHARDS,
    TASK_TYPES,
    CrawlKeys,
    ShardKeys,
    SiteKeys,
    shard_keys_for,
    shard_of,
    stream_code,
    stream_mask,
)
from streams_sched.frontier.reads import CrawlReads
from streams_sched.frontier.records import BloomParams, Entry
from streams_sched.frontier.replies import parse_claim, parse_enqueue, parse_lease, text
from streams_sched.frontier.scripts import Scripts

__all__ = ["DEFAULT_POLICY_FIELDS", "NO_MASK", "Frontier"]

#: claim.lua stream mask that considers every stream
NO_MASK = stream_mask(TASK_TYPES)
#: lease.lua ARGV[8..12]: the crawl's default policy ("*"), kept in the crawl meta hash
#: as ``default_<field>`` (policy.set_policy writes them).
DEFAULT_POLICY_FIELDS: tuple[str, ...] = ("rate", "burst", "paused", "weight", "max_browser")
_DEFAULT_RATE = DEFAULT_POLICY_FIELDS.index("rate")  # feedback.lua ARGV[11]

logger = logging.getLogger(__name__)


class Frontier(CrawlReads):
    """The crawl frontier of one crawl in one Redis (or Redis Cluster)."""

    def __init__(
        self,
        client: Any,
        crawl: str,
        bloom: BloomParams | None = None,
        group: str = GROUP,
        shards: int | None = None,
    ) -> None:
        self.client = client
        self.crawl = crawl
        #: the crawl's number of shards (keys.py), read from its meta hash on first use
        self._shards = shards
        self.keys = CrawlKeys(crawl)
        self.bloom = bloom or BloomParams()
        self.group = group
        self.scripts = Scripts(client)
        #: Redis TIME without a round trip each time (clock.py): the clock of every absolute
        #: time this process writes for another one to read
        self.clock = RedisClock(client)
        #: Redis Cluster: node events use sharded pub/sub (SPUBLISH), so they stay
        #: on the shard of the crawl's slot instead of being broadcast to every node.
        self.cluster = is_cluster_client(client)
        self._sites = SiteKeyCache()
        #: task type of requests that name none, for sites whose policy names none
        self.default_task = "http"
        #: the crawl's default policy ("*"), as lease.lua ARGV: DEFAULT_POLICY_FIELDS in order
        self.default_policy: tuple[str, ...] = ("",) * len(DEFAULT_POLICY_FIELDS)
        #: lease.lua's politeness flags: "a" adaptive back-off, "r" robots.txt obeyed
        self.politeness = ""

    def crawl_meta(self) -> dict[str, str]:
        """The crawl's meta hash, decoded (dedupe parameters, defaults, site key, ...)."""
        return {text(k): text(v) for k, v in self.client.hgetall(self.keys.meta).items()}

    def use_crawl_defaults(self, meta: Mapping[str, str]) -> None:
        """Take the crawl's default policy and default task type from its meta hash (decoded),
        for the scripts that fall back on them (lease, feedback, enqueue)."""
        self.default_policy = tuple(meta.get(f"default_{name}", "") for name in DEFAULT_POLICY_FIELDS)
        self.default_task = meta.get("default_task_type") or "http"

    # -- key layout ----------------------------------------------------------

    @property
    def shards(self) -> int:
        """The crawl's number of shards: recorded in its meta hash by the first writer
        (:meth:`ensure_layout`); a crawl nobody wrote yet reads as the default."""
        if self._shards is None:
            recorded = self.client.hget(self.keys.meta, "shards")
            if recorded is not None:
                self._shards = int(recorded)
                return self._shards
            return DEFAULT_SHARDS
        return self._shards

    def ensure_layout(self, shards: int = DEFAULT_SHARDS) -> int:
        """Record the crawl's number of shards if nobody has (a writer calls this at start);
        returns the number the crawl uses, which may differ from ``shards``."""
        if self._shards is not None:
            return self._shards
        if not 1 <= shards <= MAX_SHARDS:
            raise ValueError(f"a crawl has 1 to {MAX_SHARDS} shards, not {shards}")
        if self.client.hget(self.keys.meta, "shards") is None:
            self.client.hsetnx(self.keys.meta, "shards", shards)
        recorded = int(self.client.hget(self.keys.meta, "shards"))
        if recorded != shards:
            logger.info("crawl %s keeps its %d shards (STREAMS_SHARDS=%d)", self.crawl, recorded, shards)
        self._shards = recorded
        return recorded

    def site(self, site: str) -> SiteKeys:
        # the shard count is looked up on a miss only: a reader's Frontier of a crawl nobody
        # has written yet reads it from Redis each time
        keys = self._sites.get(site)
        if keys is None:
            keys = self._sites.add(SiteKeys(self.crawl, site, shard_of(site, self.shards)))
        return keys

    def shard(self, n: int) -> ShardKeys:
        return shard_keys_for(self.crawl, n)

    def shard_keys(self) -> list[ShardKeys]:
        return [self.shard(n) for n in range(self.shards)]

    def _target(self, pipe: Any) -> Any:
        return self.client if pipe is None else pipe

    # -- crawl-level ------------------------------------------------------

    def register(self, pipe: Any = None) -> Any:
        """Add the crawl to the global registry of crawls."""
        return self._target(pipe).sadd(CrawlKeys.registry(), self.crawl)

    def register_sites(self, sites: Iterable[str], pipe: Any = None) -> Any:
        """Add sites to their shards' registries (enqueue.lua does it for the sites it
        adds to; this is for a site that gets a policy or dead letters first)."""
        by_shard: dict[str, list[str]] = {}
        for site in sites:
            by_shard.setdefault(self.site(site).index.sites, []).append(site)
        target = self._target(pipe)
        return [target.sadd(key, *names) for key, names in by_shard.items()]

    def sites(self) -> list[str]:
        """Every site of the crawl (an operator's listing: it reads every shard's registry)."""
        out: list[str] = []
        for shard in self.shard_keys():
            out += (s.decode() if isinstance(s, bytes) else s for s in self.client.sscan_iter(shard.sites, count=1000))
        return sorted(out)

    def publish(self, event: dict[str, Any], pipe: Any = None) -> Any:
        """Publish a node event on the crawl's channel (SPUBLISH on Redis Cluster)."""
        command = "SPUBLISH" if self.cluster else "PUBLISH"
        return self._target(pipe).execute_command(command, self.keys.events, json.dumps(event, sort_keys=True))

    def record_node(self, node: str, info: dict[str, Any], pipe: Any = None) -> Any:
        """Write a node's record as it is, its ``last_seen`` included (a worker writes its own
        with :meth:`heartbeat`)."""
        return self._target(pipe).hset(self.keys.nodes, node, json.dumps(info, sort_keys=True))

    def heartbeat(self, node: str, info: dict[str, Any], pipe: Any = None) -> Any:
        """Write a live node's record, ``last_seen`` set to when Redis receives it (heartbeat.lua).
        -> Redis TIME [seconds, microseconds], for :meth:`RedisClock.observe`."""
        record = json.dumps({k: v for k, v in info.items() if k != "last_seen"}, sort_keys=True)
        return self.scripts.call(self.scripts.heartbeat, script_keys.heartbeat(self.keys), [node, record], pipe)

    # -- per-site scripts ---------------------------------------------------

    def enqueue(self, site: str, items: Sequence[Entry], pipe: Any = None) -> Any:
        """Dedupe and add requests of one site (their own ``site`` is not read). ``Entry.stream`` is an index into
        STREAMS, or ``SITE_TASK + band`` for the task type from the site's policy."""
        reply = self.enqueue_shard([(site, items)], pipe)
        return reply if pipe is not None else parse_enqueue(reply)

    def enqueue_shard(self, sites: Sequence[tuple[str, Sequence[Entry]]], pipe: Any = None, seed: bool = False) -> Any:
        """Dedupe and add requests of several sites of ONE shard in one call; a reply part per site
        (:func:`parse_enqueue`). ``seed``: a new site's keys only (others get [], send them again)."""
        b = self.bloom
        ttl = b.bucket_ttl if b.revisit_seconds else 0
        now = self.clock.now() if b.revisit_seconds else 0.0
        first = self.site(sites[0][0])
        keyed = [(self.site(site), self.filters(site, now)) for site, _ in sites]
        args: list[Any] = [self.group, b.mode, b.error_rate, b.capacity, b.expansion, ttl, self.default_task,
                           len(keyed[0][1]) // 2, "seed" if seed else "all"]
        for site, items in sites:
            args += (site, len(items))
            for it in items:
                args += (it.fp, stream_code(it.stream), it.delay_ms, it.payload)
        return self.scripts.call(self.scripts.enqueue, script_keys.enqueue(first.index, keyed, seed), args, pipe)

    def lease(
        self,
        site: str,
        consumer: str,
        total: int,
        weights: Sequence[int],
        max_http: int | None = None,
        max_browser: int = 0,
        promote_limit: int = 100,
        max_suspects: int = 1,
        pipe: Any = None,
    ) -> Any:
        """Lease up to ``total`` entries (at most ``max_http`` http, ``max_browser`` browser,
        ``max_suspects`` that failed a delivery before)."""
        max_http = total if max_http is None else max_http
        reply = self.lease_shard(
            self.site(site).shard or 0, consumer, [(site, total, max_http, max_browser)], weights,
            promote_limit=promote_limit, max_suspects=max_suspects, pipe=pipe,
        )
        return reply if pipe is not None else parse_lease(site, reply)

    def lease_shard(
        self,
        shard: int,
        consumer: str,
        plans: Sequence[tuple[str, int, int, int]],
        weights: Sequence[int],
        *,
        name: int = 0,
        spread: int = 0,
        tasks: str = "hb",
        paused_wait_ms: int = 1000,
        promote_limit: int = 100,
        max_suspects: int = 1,
        budget: int | None = None,
        pipe: Any = None,
    ) -> Any:
        """Lease from several sites of ONE shard: ``plans`` = (site, total, max http, max
        browser) each; and name up to ``name`` of the shard's ready sites per task type in
        ``tasks`` ('h', 'b'), from a place that ``spread`` (a random number) picks among the
        oldest ones; lease no more than
        ``budget`` entries in all (default: the plans' sum). Read the reply with
        :func:`parse_shard_lease`."""
        keys = script_keys.lease(self.shard(shard), [self.site(p[0]) for p in plans])
        if budget is None:
            budget = sum(p[1] for p in plans)
        args: list[Any] = [self.group, consumer, *weights, promote_limit, max_suspects,
                           *self.default_policy, self.politeness, name, spread, tasks, paused_wait_ms, budget]
        for site, total, max_http, max_browser in plans:
            args += (site, total, max_http, max_browser)
        return self.scripts.call(self.scripts.lease, keys, args, pipe)

    def feedback(self, site: str, outcome: Sequence[int], robots_delay: str, params: Sequence[Any], pipe: Any = None) -> Any:
        """Report a batch of a site's answers: ``outcome`` = (healthy, 429/503, timeouts,
        longest Retry-After in ms); ``robots_delay`` its Crawl-delay in s ('' not reported);
        ``params`` = (adaptive '1'/'0', decrease, increase, floor, forget ms). See feedback.lua."""
        k = self.site(site)
        return self.scripts.call(
            self.scripts.feedback, script_keys.feedback(k), self._feedback_args(outcome, robots_delay, params), pipe
        )

    def _feedback_args(self, outcome: Sequence[int], robots_delay: str, params: Sequence[Any]) -> list[Any]:
        """feedback.lua's ARGV (also carried by ack.lua)."""
        return [*outcome, robots_delay, *params, self.default_policy[_DEFAULT_RATE]]

    def claim(
        self,
        site: str,
        consumer: str,
        min_idle_ms: int,
        count: int,
        max_deliveries: int,
        mode: str = "claim",
        mask: str = NO_MASK,
        pipe: Any = None,
    ) -> Any:
        k = self.site(site)
        reply = self.scripts.call(
            self.scripts.claim,
            script_keys.claim(k),
            [self.group, consumer, min_idle_ms, count, max_deliveries, mode, mask, site],
            pipe,
        )
        return reply if pipe is not None else parse_claim(site, reply)

    def ack(
        self,
        site: str,
        entries: Iterable[tuple[int, bytes]],
        pipe: Any = None,
        answers: tuple[int, Sequence[Any]] | None = None,
    ) -> Any:
        """Ack and delete finished entries of a site. ``answers`` = (healthy answers,
        feedback params as for :meth:`feedback`) reports the site's healthy answers in
        the same call (what :meth:`feedback` would do with outcome (n, 0, 0, 0))."""
        reply = self.ack_shard([(site, entries, answers)], pipe)
        return reply if pipe is not None else int(reply[0])

    def ack_shard(
        self,
        sites: Sequence[tuple[str, Iterable[tuple[int, bytes]], tuple[int, Sequence[Any]] | None]],
        pipe: Any = None,
    ) -> Any:
        """Ack entries of several sites of ONE shard in one call: (site, entries, answers)
        each, as for :meth:`ack`. The reply has the count acked per site, in order."""
        args: list[Any] = [self.group]
        for site, entries, answers in sites:
            args.append(site)
            if answers is None:
                args.append(0)
            else:
                ok, params = answers
                extra = self._feedback_args((ok, 0, 0, 0), "", params)
                args += (len(extra), *extra)
            pairs: list[Any] = []
            for stream, entry_id in entries:
                pairs += (stream_code(stream), entry_id)
            args += (len(pairs) // 2, *pairs)
        keyed = [self.site(site) for site, _, _ in sites]
        return self.scripts.call(self.scripts.ack, script_keys.ack(keyed[0].index, keyed), args, pipe)

    def dead_letter(
        self, site: str, node: str, items: Iterable[tuple[int, bytes, str]], pipe: Any = None
    ) -> Any:
        k = self.site(site)
        args: list[Any] = [self.group, node, site]
        for stream, entry_id, reason in items:
            args += (stream_code(stream), entry_id, reason)
        return self.scripts.call(self.scripts.dead, script_keys.dead(k), args, pipe)

    def release(
        self, site: str, consumer: str, entries: Iterable[tuple[int, bytes]], pipe: Any = None
    ) -> Any:
        k = self.site(site)
        args: list[Any] = [self.group, consumer, site]
        for stream, entry_id in entries:
            args += (stream_code(stream), entry_id)
        return self.scripts.call(self.scripts.release, script_keys.release(k), args, pipe)

    def fail(
        self,
        site: str,
        consumer: str,
        max_deliveries: int,
        entries: Iterable[tuple[int, bytes, str]],
        pipe: Any = None,
    ) -> Any:
        """Leases whose delivery failed, each with what went wrong: back to their stream
        with the delivery counted, or to the dead-letter stream once they have had
        ``max_deliveries``. -> [requeued, dead-lettered] (the pipeline's reply)."""
        k = self.site(site)
        args: list[Any] = [self.group, consumer, site, max_deliveries]
        for stream, entry_id, what in entries:
            args += (stream_code(stream), entry_id, what)
        return self.scripts.call(self.scripts.fail, script_keys.fail(k), args, pipe)

    def extend(self, site: str, consumer: str, stream: int, entry_id: bytes, pipe: Any = None) -> Any:
        """Reset the idle time of a lease this consumer holds (it lasts a full lease again)."""
        k = self.site(site)
        return self._target(pipe).xclaim(
            k.streams[stream], self.group, consumer, 0, [entry_id], justid=True
        )

    def promote(self, site: str, limit: int = 1000, pipe: Any = None) -> Any:
        k = self.site(site)
        return self.scripts.call(
            self.scripts.promote, script_keys.promote(k), [self.group, limit, site], pipe
        )

    def prune(self, site: str, victims: Iterable[tuple[int, str]], pipe: Any = None) -> Any:
        """Remove consumers (stream index, consumer name) of a site that own no pending
        entries. -> consumers removed (the raw reply with ``pipe``)."""
        args: list[Any] = [self.group]
        for stream, consumer in victims:
            args += (stream_code(stream), consumer)
        reply = self.scripts.call(self.scripts.prune, script_keys.prune(self.site(site)), args, pipe)
        return reply if pipe is not None else int(reply)

    def requeue_dead(self, site: str, ids: Sequence[str], pipe: Any = None) -> Any:
        """Put dead letters of a site back into their streams. -> (requeued, kept, missing)."""
        reply = self.scripts.call(
            self.scripts.requeue_dead, script_keys.requeue_dead(self.site(site)), [self.group, site, *ids], pipe
        )
        return reply if pipe is not None else (int(reply[0]), int(reply[1]), int(reply[2]))

    def reindex(self, site: str, lease_score_ms: int = 0, pipe: Any = None) -> Any:
        """Put a site in its shard's indexes as its keys say (for keys written by anything
        but these scripts). -> (backlog http, backlog browser, pending, delayed)."""
        reply = self.scripts.call(
            self.scripts.reindex, script_keys.reindex(self.site(site)), [self.group, site, lease_score_ms], pipe
        )
        return reply if pipe is not None else tuple(int(v) for v in reply)

    def load_scripts(self, client: Any = None) -> None:
        """SCRIPT LOAD every script (at start, and after a NOSCRIPT reply in a pipeline)."""
        self.scripts.load(client)

