"""The reclaimer loop: keeps every crawl's frontier healthy without a worker's help.

Every pass, for every crawl (``ss:crawls``, or the ``--prefix`` ones), it looks only
at the sites its shards' indexes name (keys.py), never at the whole site registry:

1. expired leases: the sites of each shard's ``#leased`` index whose oldest lease is
   older than the lease time (``Frontier.expired_sites``) go through ``claim.lua`` in
   ``requeue`` mode (XAUTOCLAIM, then XADD + XACK + XDEL in one atomic call); entries
   past the delivery limit go to the dead-letter stream with the reason;
2. due delayed requests: the sites of each ``#ready:<task>`` index whose score has come
   (a site with delayed requests is scored by its next due time) and that have a due
   delayed request get ``promote.lua``. Workers promote a site's due requests
   themselves when they lease it, so this only keeps the backlog in view for sites no
   worker leases yet; a site that is rate-limited or paused (scored later) waits for
   its lease;
3. every ``--prune-interval``: consumers that own no pending entries and whose node is
   gone are removed (``prune.lua`` checks "owns nothing" atomically) from the streams
   of the sites in the leased index and the first ``sites_per_shard`` of each ready
   index (an idle site has no stream left: an empty stream is deleted with its group),
   and records of nodes dead or offline for ``--node-retention`` are deleted, unless a
   leased index was too long to read whole (then who owns leases is not known)
   (:mod:`.prune`).

What a pass costs, per crawl: TIME, HGETALL of the nodes, one pipeline of one
ZRANGEBYSCORE per shard and index (at most ``sites_per_shard`` sites each), one
ZRANGEBYSCORE per ready site found to see whether a delayed request is due, then one
script call per site with expired leases or due requests, ``sites_per_round_trip``
sites per round trip; a prune pass adds EXISTS of the six streams of each site it looks
at and XINFO CONSUMERS of those that exist. None of it grows with the number of idle sites.

Several reclaimers can run at once: every move is one atomic script, so an entry is
never moved twice or lost (an entry requeued by one is no longer pending for the
others).

Implementation detail: the reclaimer writes ``ss:health:reclaimer:<name>``
(JSON of its last pass) with a TTL of three intervals after each pass, which
``streams-reclaimer --check`` reads.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

import structlog
from redis.exceptions import NoScriptError

from streams_sched.connect.cluster_health import cluster_down_line
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.clock import RedisClock
from streams_sched.frontier.indexes import due_delays, ready_sites, server_ms
from streams_sched.frontier.keys import health_key
from streams_sched.frontier.scripts import Call, claim, promote
from streams_sched.frontier.scripts.claim import NO_MASK, ClaimReply
from streams_sched.service.daemon import (
    TRANSIENT,
    MetricsServer,
    StopFlag,
    check_server,
    connect_at_start,
    run_passes,
)
from streams_sched.service.moves import MovedCrawls
from streams_sched.service.liveness import ALIVE, NodeState, node_states

from .logic import crawl_limits
from .metrics import ReclaimerMetrics
from .prune import prune as prune_consumers
from .results import CrawlPass, PassResult
from .settings import DEFAULT_LEASE_S, DEFAULT_MAX_DELIVERIES, ReclaimerSettings

R = TypeVar("R")

__all__ = ["Reclaimer"]

log = structlog.get_logger("reclaimer")


class Reclaimer:
    """Runs reclaim passes every ``settings.interval_s`` until stopped (or once, in burst mode).

    ``run()`` connects (one clear error and exit code 3 if Redis does not
    answer within ``connect_timeout_s``), then loops; SIGTERM/SIGINT stop it
    between passes. When Redis goes away later it retries with back-off and
    says so. ``run_pass()`` is one pass, for tests and burst mode.
    """

    def __init__(self, settings: ReclaimerSettings, client: Any = None) -> None:
        self.settings = settings
        self.client = client
        self.stop_flag = StopFlag()
        self.metrics = ReclaimerMetrics()
        self.metrics_server: MetricsServer | None = None
        self._frontiers: dict[str, Frontier] = {}
        self._next_prune = 0.0
        self._warned_missing: set[str] = set()
        self._moved = MovedCrawls(log)
        self.passes = 0
        #: Redis time for the health key and the last-pass metric (frontier/clock.py)
        self.clock: RedisClock | None = None

    # -- lifecycle ------------------------------------------------------------

    def connect(self) -> None:
        """Connect, then check the server's eviction policy (EvictionPolicyError on allkeys-*)."""
        if self.client is None:
            self.client = connect_at_start(self.settings.redis_url, self.settings.connect_timeout_s)
            check_server(self.client, self.settings.redis_url, allowed=self.settings.allow_eviction, log=log,
                         stop_flag=self.stop_flag)

    def start_metrics(self) -> None:
        s = self.settings
        if s.metrics_port is not None and self.metrics_server is None:
            self.metrics_server = MetricsServer(self.metrics.registry, s.metrics_port, s.metrics_addr).start()
            log.info("metrics", url=f"http://{s.metrics_addr}:{self.metrics_server.port}/metrics")

    def stop(self) -> None:
        """Ask the loop to stop after the current pass (thread-safe)."""
        self.stop_flag.set()

    def close(self) -> None:
        if self.metrics_server is not None:
            self.metrics_server.stop()
            self.metrics_server = None
        if self.client is not None:
            try:
                self.client.delete(health_key("reclaimer", self.settings.name))
            except Exception:
                pass
            self.client.close()

    def run(self) -> int:
        """Loop until stopped. Returns the process exit code."""
        s = self.settings
        self.connect()
        self.start_metrics()
        log.info(
            "started",
            crawls=list(s.crawls) or "all",
            interval_s=s.interval_s,
            lease_s=s.lease_s if s.lease_s is not None else "from workers",
            max_deliveries=s.max_deliveries if s.max_deliveries is not None else "from workers",
            burst=s.burst,
            pid=os.getpid(),
        )
        code = run_passes(
            lambda: self._record(self.run_pass()),
            interval_s=s.interval_s,
            burst=s.burst,
            stop_flag=self.stop_flag,
            max_backoff_s=s.max_backoff_s,
            log=log,
            role="reclaimer",
            hint="retrying with back-off; nothing is lost meanwhile",
            on_error=self.metrics.errors.inc,
            diagnose=lambda: cluster_down_line(self.client),
        )
        if code != 0:
            return code
        log.info("stopped", passes=self.passes, signal=self.stop_flag.signal)
        return 0

    def _record(self, result: PassResult) -> None:
        self.passes += 1
        self.metrics.record(result)
        summary = result.summary()
        log.info("pass", **summary)
        try:
            ttl = max(int(self.settings.interval_s * 3), 10)
            self.client.set(
                health_key("reclaimer", self.settings.name),
                json.dumps({**summary, "ts": result.ended_s, "pid": os.getpid()}),
                ex=ttl,
            )
        except TRANSIENT:
            pass  # the next pass says so if Redis is gone
        # a refusal (OOM, MISCONF, a replica's READONLY) fails the pass: run_passes says it
        # once with the fix and backs off, and `--check` fails until the key is written

    # -- one pass ---------------------------------------------------------------

    def crawls(self) -> list[str]:
        """The crawls to look after, without those that moved (CrawlMoved once all have)."""
        registered = Frontier.crawls(self.client)
        if not self.settings.crawls:
            return self._moved.keep(self.client, registered)
        for crawl in self.settings.crawls:
            if crawl not in registered and crawl not in self._warned_missing:
                self._warned_missing.add(crawl)
                log.warning("crawl_not_registered", crawl=crawl, hint="handled once a worker registers it")
        return self._moved.keep(self.client, [c for c in self.settings.crawls if c in registered])

    def _clock(self) -> RedisClock:
        if self.clock is None:
            self.clock = RedisClock(self.client)
        return self.clock

    def _frontier(self, crawl: str) -> Frontier:
        f = self._frontiers.get(crawl)
        if f is None:
            f = self._frontiers[crawl] = Frontier(self.client, crawl)
        return f

    def run_pass(self) -> PassResult:
        started = time.monotonic()
        prune = started >= self._next_prune
        result = PassResult(pruned=prune)
        for crawl in self.crawls():
            result.crawls.append(self._crawl_pass(crawl, prune))
        if prune:
            self._next_prune = started + self.settings.prune_interval_s
        result.duration_s = time.monotonic() - started
        # Redis time, as every time another process reads: a reclaimer whose own clock is
        # off must not look stalled, or busy, to whoever compares the time with theirs
        result.ended_s = self._clock().now()
        return result

    def _crawl_pass(self, crawl: str, prune: bool) -> CrawlPass:
        s = self.settings
        f = self._frontier(crawl)
        records = f.nodes()
        states = self.node_states(f, records)
        lease_s, max_deliveries = crawl_limits(
            records, s.lease_s, s.max_deliveries, DEFAULT_LEASE_S, DEFAULT_MAX_DELIVERIES,
            alive=[n for n, st in states.items() if st.state == ALIVE],
        )
        out = CrawlPass(crawl, lease_s=lease_s, max_deliveries=max_deliveries)
        lease_ms = int(lease_s * 1000)
        expired = f.expired_sites(lease_ms, s.sites_per_shard)
        now_ms = server_ms(f.client)
        due = due_delays(f, ready_sites(f, s.sites_per_shard, until_ms=now_ms), now_ms)
        out.sites = len(set(expired) | set(due))
        for i in range(0, len(expired), s.sites_per_round_trip):
            self._reclaim(f, expired[i : i + s.sites_per_round_trip], lease_ms, max_deliveries, out)
        for i in range(0, len(due), s.sites_per_round_trip):
            self._promote(f, due[i : i + s.sites_per_round_trip], out)
        if prune:
            prune_consumers(f, states, s, out)
        return out

    def node_states(self, f: Frontier, records: dict[str, dict[str, Any]]) -> dict[str, NodeState]:
        """The crawl's nodes alive, dead or offline: their records' last_seen (the Redis time
        their heartbeat arrived) against Redis TIME now (service/liveness.py)."""
        return node_states(records, _server_time(f.client), dead_after_heartbeats=self.settings.dead_after_heartbeats)

    def _reclaim(self, f: Frontier, sites: list[str], lease_ms: int, max_deliveries: int, out: CrawlPass) -> None:
        """Requeue the expired leases of these sites (again while a call fills its batch)."""
        s = self.settings

        def build(site: str) -> Call[ClaimReply]:
            return claim.call(f, site, s.consumer, lease_ms, s.batch, max_deliveries, "requeue", NO_MASK)

        def done(site: str, reply: ClaimReply) -> bool:
            out.requeued += reply.taken
            out.dead_lettered += reply.dead
            if reply.taken or reply.dead:
                log.info(
                    "reclaimed", crawl=f.crawl, site=site, requeued=reply.taken, dead_lettered=reply.dead,
                    lease_s=lease_ms / 1000, max_deliveries=max_deliveries,
                )
            return reply.taken + reply.dead >= s.batch

        self._calls(f, sites, build, done)

    def _promote(self, f: Frontier, sites: list[str], out: CrawlPass) -> None:
        """Move the due delayed requests of these sites into their streams."""
        s = self.settings

        def done(site: str, moved: int) -> bool:
            out.promoted += moved
            return moved >= s.batch

        self._calls(f, sites, lambda site: promote.call(f, site, s.batch), done)

    def _calls(
        self, f: Frontier, sites: list[str], build: Callable[[str], Call[R]], done: Callable[[str, R], bool]
    ) -> None:
        """One script call per site (``build`` makes it) in one pipeline; again for the sites
        whose call filled its batch (``done`` says so, from the parsed reply), at most
        ``max_calls_per_site`` times."""
        todo = sites
        calls = 0
        reloaded = False
        while todo and calls < self.settings.max_calls_per_site:
            pipe = f.client.pipeline(transaction=False)
            built = [build(site) for site in todo]
            for call in built:
                call.queue(pipe)
            replies = pipe.execute(raise_on_error=False)
            if any(isinstance(r, NoScriptError) for r in replies) and not reloaded:
                f.load_scripts()
                reloaded = True
                continue
            for reply in replies:
                if isinstance(reply, Exception):
                    raise reply
            todo = [
                site for site, call, reply in zip(todo, built, replies, strict=True) if done(site, call.parse(reply))
            ]
            calls += 1


def _server_time(client: Any) -> float:
    sec, usec = client.time()
    return int(sec) + int(usec) / 1e6


