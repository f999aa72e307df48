"""Thin Redis I/O for the frontier: one method per script or command.

A script's method runs it at once and returns its typed reply. To batch calls into one
round trip, build them with the ``call`` function of the script's module
(:mod:`streams_sched.frontier.scripts`) and ``queue(pipe)`` each; then read each reply
with the same call's ``parse``. Plain commands take ``pipe=`` (the pipeline's reply is
the command's). Workers, daemons and the CLI all go through this class or those calls,
so the key layout and the scripts have one face. Records (records.py), the scripts
(scripts/), dedupe (bloom.py), reads and clean-up (reads.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from streams_sched.connect.clients import Pipeline, RedisClient, is_cluster_client
from streams_sched.frontier import scripts as lua
from streams_sched.frontier.clock import RedisClock
from streams_sched.frontier.keycache import SiteKeyCache
from streams_sched.frontier.keys import (
    DEFAULT_SHARDS,
    GROUP,
    MAX_SHARDS,
    CrawlKeys,
    ShardKeys,
    SiteKeys,
    shard_keys_for,
    shard_of,
)
from streams_sched.frontier.reads import CrawlReads
from streams_sched.frontier.records import BloomParams, Entry, LeaseReply, ShardLease
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts import Scripts
from streams_sched.frontier.scripts.ack import Revisit, SiteAcks
from streams_sched.frontier.scripts.claim import NO_MASK, ClaimReply
from streams_sched.frontier.scripts.enqueue import EnqueueReply
from streams_sched.frontier.scripts.fail import FailReply
from streams_sched.frontier.scripts.feedback import FeedbackReply
from streams_sched.frontier.scripts.heartbeat import RedisTime
from streams_sched.frontier.scripts.lease import DEFAULT_POLICY_FIELDS, LeaseOptions
from streams_sched.frontier.scripts.reindex import ReindexReply
from streams_sched.frontier.scripts.requeue_dead import RequeueDeadReply

__all__ = ["DEFAULT_POLICY_FIELDS", "NO_MASK", "Frontier"]

logger = logging.getLogger(__name__)


#: the crawl meta field that says the tracking of every page of the crawl was stopped
REVISITS_STOPPED = "revisits_stopped"

class Frontier(CrawlReads):
    """The crawl frontier of one crawl in one Redis (or Redis Cluster)."""

    def __init__(
        self,
        client: RedisClient,
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
        #: ``streams-sched revisits --stop`` stopped the tracking of every page of the crawl
        self.revisits_stopped = False
        #: the share of a site's rate its tracked pages may need before ack.lua stretches
        #: their schedule (STREAMS_REVISIT_BUDGET_SHARE)
        self.revisit_budget_share = 0.9
        #: how adaptive intervals move (STREAMS_REVISIT_RULE): 'freshness' keeps each
        #: site's multiplier in ack.lua
        self.revisit_rule = "freshness"

    def crawl_meta(self) -> dict[str, str]:
        """The crawl's meta hash, decoded (dedupe parameters, defaults, site key, ...)."""
        return {text(k): text(v) for k, v in self.client.hgetall(self.keys.meta).items()}

    def use_crawl_defaults(self, meta: Mapping[str, str]) -> None:
        """Take the crawl's default policy and default task type from its meta hash (decoded),
        for the scripts that fall back on them (lease, feedback, enqueue)."""
        self.default_policy = tuple(meta.get(f"default_{name}", "") for name in DEFAULT_POLICY_FIELDS)
        self.default_task = meta.get("default_task_type") or "http"
        self.revisits_stopped = meta.get(REVISITS_STOPPED) == "1"

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
        recorded = int(text(self.client.hget(self.keys.meta, "shards")))
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

    def _target(self, pipe: Pipeline | None) -> Any:
        return self.client if pipe is None else pipe

    # -- crawl-level ------------------------------------------------------

    def register(self, pipe: Pipeline | None = None) -> Any:
        """Add the crawl to the global registry of crawls."""
        return self._target(pipe).sadd(CrawlKeys.registry(), self.crawl)

    def register_sites(self, sites: Iterable[str], pipe: Pipeline | None = None) -> Any:
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

    def publish(self, event: dict[str, Any], pipe: Pipeline | None = None) -> Any:
        """Publish a node event on the crawl's channel (SPUBLISH on Redis Cluster)."""
        command = "SPUBLISH" if self.cluster else "PUBLISH"
        return self._target(pipe).execute_command(command, self.keys.events, json.dumps(event, sort_keys=True))

    def record_node(self, node: str, info: dict[str, Any], pipe: Pipeline | None = None) -> Any:
        """Write a node's record as it is, its ``last_seen`` included (a worker writes its own
        with :meth:`heartbeat`)."""
        return self._target(pipe).hset(self.keys.nodes, node, json.dumps(info, sort_keys=True))

    def heartbeat(self, node: str, info: dict[str, Any]) -> RedisTime:
        """Write a live node's record, ``last_seen`` set to when Redis receives it (heartbeat.lua).
        -> Redis TIME, for :meth:`RedisClock.observe`. (Pipelined: ``scripts.heartbeat.call``.)"""
        return lua.heartbeat.call(self, node, info).run()

    # -- per-site scripts ---------------------------------------------------

    def enqueue(self, site: str, items: Sequence[Entry]) -> EnqueueReply:
        """Dedupe and add requests of one site (their own ``site`` is not read). ``Entry.stream`` is an index into
        STREAMS, or ``SITE_TASK + band`` for the task type from the site's policy."""
        return lua.enqueue.call(self, [(site, items)]).run()[0]

    def enqueue_shard(self, sites: Sequence[tuple[str, Sequence[Entry]]]) -> list[EnqueueReply]:
        """Dedupe and add requests of several sites of ONE shard in one call; a reply per site.
        (Pipelined: ``scripts.enqueue.call(frontier, sites).queue(pipe)``.)"""
        return lua.enqueue.call(self, sites).run()

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
    ) -> LeaseReply:
        """Lease up to ``total`` (at least 1) entries (at most ``max_http`` http,
        ``max_browser`` browser, ``max_suspects`` that failed a delivery before)."""
        if total < 1:
            raise ValueError(f"a lease takes at least one entry, not {total}")
        max_http = total if max_http is None else max_http
        options = LeaseOptions(promote_limit=promote_limit, max_suspects=max_suspects)
        plan = (site, total, max_http, max_browser)
        part = lua.lease.call(self, self.site(site).shard or 0, consumer, [plan], weights, options).run().sites[0]
        assert part is not None  # lease.lua looks at a site the call's budget reaches
        return part

    def lease_shard(
        self,
        shard: int,
        consumer: str,
        plans: Sequence[tuple[str, int, int, int]],
        weights: Sequence[int],
        **options: Any,
    ) -> ShardLease:
        """Lease from several sites of ONE shard; ``options`` are the fields of
        :class:`~streams_sched.frontier.scripts.lease.LeaseOptions` (name, spread, tasks,
        paused_wait_ms, promote_limit, max_suspects, budget). (Pipelined: ``scripts.lease.call``.)"""
        return lua.lease.call(self, shard, consumer, plans, weights, LeaseOptions(**options)).run()

    def feedback(
        self, site: str, outcome: Sequence[int], robots_delay: str, params: Sequence[Any]
    ) -> FeedbackReply:
        """Report a batch of a site's answers: ``outcome`` = (healthy, 429/503, timeouts,
        longest Retry-After in ms); ``robots_delay`` its Crawl-delay in s ('' not reported);
        ``params`` = (adaptive '1'/'0', decrease, increase, floor, forget ms). See feedback.lua."""
        return lua.feedback.call(self, site, outcome, robots_delay, params).run()

    def claim(
        self,
        site: str,
        consumer: str,
        min_idle_ms: int,
        count: int,
        max_deliveries: int,
        mode: str = "claim",
        mask: str = NO_MASK,
    ) -> ClaimReply:
        """Take over expired leases of a site (see :func:`scripts.claim.call`)."""
        return lua.claim.call(self, site, consumer, min_idle_ms, count, max_deliveries, mode, mask).run()

    def ack(
        self,
        site: str,
        entries: Iterable[tuple[int, bytes]],
        answers: tuple[int, Sequence[Any]] | None = None,
        revisits: Sequence[Revisit] = (),
    ) -> int:
        """Ack and delete finished entries of a site. ``answers`` = (healthy answers,
        feedback params as for :meth:`feedback`) reports the site's healthy answers in
        the same call (what :meth:`feedback` would do with outcome (n, 0, 0, 0));
        ``revisits`` are tracked pages acked and put back for their next visit
        (:data:`scripts.ack.Revisit`)."""
        return lua.ack.call(self, [(site, entries, answers, revisits)]).run()[0]

    def ack_shard(self, sites: Sequence[SiteAcks]) -> list[int]:
        """Ack entries of several sites of ONE shard in one call: (site, entries, answers,
        revisits) each, as for :meth:`ack`. -> the count acked per site, in order."""
        return lua.ack.call(self, sites).run()

    def dead_letter(
        self, site: str, node: str, items: Iterable[tuple[int, bytes, str]]
    ) -> int:
        """Move leased entries (stream, id, reason) to the site's dead letters. -> how many."""
        return lua.dead.call(self, site, node, items).run()

    def release(
        self, site: str, consumer: str, entries: Iterable[tuple[int, bytes]]
    ) -> int:
        """Hand back leases (stream, id) this consumer will not finish. -> how many."""
        return lua.release.call(self, site, consumer, entries).run()

    def fail(
        self,
        site: str,
        consumer: str,
        max_deliveries: int,
        entries: Iterable[tuple[int, bytes, str]],
    ) -> FailReply:
        """Leases whose delivery failed, each with what went wrong: back to their stream
        with the delivery counted, or to the dead-letter stream once they have had
        ``max_deliveries``."""
        return lua.fail.call(self, site, consumer, max_deliveries, entries).run()

    def extend(self, site: str, consumer: str, stream: int, entry_id: bytes, pipe: Pipeline | None = None) -> Any:
        """Reset the idle time of a lease this consumer holds (it lasts a full lease again)."""
        k = self.site(site)
        return self._target(pipe).xclaim(
            k.streams[stream], self.group, consumer, 0, [entry_id], justid=True
        )

    def promote(self, site: str, limit: int = 1000) -> int:
        """Move up to ``limit`` due delayed requests of a site into its streams. -> how many."""
        return lua.promote.call(self, site, limit).run()

    def prune(self, site: str, victims: Iterable[tuple[int, str]]) -> int:
        """Remove consumers (stream index, consumer name) of a site that own no pending
        entries. -> consumers removed."""
        return lua.prune.call(self, site, victims).run()

    def requeue_dead(self, site: str, ids: Sequence[str]) -> RequeueDeadReply:
        """Put dead letters of a site back into their streams."""
        return lua.requeue_dead.call(self, site, ids).run()

    def reindex(self, site: str, lease_score_ms: int = 0) -> ReindexReply:
        """Put a site in its shard's indexes as its keys say (for keys written by anything
        but these scripts)."""
        return lua.reindex.call(self, site, lease_score_ms).run()

    def load_scripts(self, client: RedisClient | None = None) -> None:
        """SCRIPT LOAD every script (at start, and after a NOSCRIPT reply in a pipeline)."""
        self.scripts.load(client)

