"""What a worker does once as it opens: reach Redis, check it, and announce itself.

It connects and waits for Redis (:func:`connect_worker`), checks the ACL user's rights
and the eviction policy (:func:`check_server`, reads only); then it sets up the crawl's dedupe filter, key
layout and scripts, registers the crawl, records STREAMS_SITE_KEY and writes
STREAMS_SITES (:func:`set_up_crawl`), and announces the node, and a worker with a stable
node id hands back the leases its previous run left (:func:`announce`). Those write, and
are safe to repeat: while Redis refuses writes the worker runs them again until it takes
them (start_wait.py). Every other failure stops the start with one line naming the
setting or Redis option and the fix.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from typing import Any

from scrapy import Spider
from scrapy.utils.request import RequestFingerprinter

from streams_sched import __version__
from streams_sched.admin.rights import check_rights
from streams_sched.config import StreamsConfig
from streams_sched.connect.clients import redact
from streams_sched.connect.persistence import check_persistence
from streams_sched.connect.server_checks import check_eviction
from streams_sched.connect.writable import connect_answering
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.io.recovery import release_orphans

__all__ = ["announce", "check_server", "connect_worker", "feed_mover", "node_info", "set_up_crawl"]

logger = logging.getLogger(__name__)


def connect_worker(cfg: StreamsConfig) -> Any:
    """A client whose Redis answered within STREAMS_CONNECT_TIMEOUT_SECONDS (a Redis that
    refuses writes answers too)."""
    return connect_answering(
        cfg.redis_url,
        cfg.connect_timeout_seconds,
        socket_timeout=cfg.socket_timeout_seconds,
        connect_timeout=min(5.0, cfg.socket_timeout_seconds),
    )


def check_server(client: Any, cfg: StreamsConfig) -> None:
    """Check the ACL user's rights and the eviction policy (reads only; Redis refuses them
    too while a snapshot fails, since a new connection starts with PING)."""
    where = f"Redis at {redact(cfg.redis_url)}"
    check_rights(client, cfg.crawl, where)
    check_eviction(client, where, allowed=cfg.allow_eviction, allow_hint="set STREAMS_ALLOW_EVICTION = True")
    check_persistence(client)


def set_up_crawl(client: Any, cfg: StreamsConfig, robots_obey: bool) -> Frontier:
    """Set the crawl up in Redis: every step writes, and is safe to repeat when Redis
    refused one (start_wait.py)."""
    bloom = crawl_bloom(
        client, cfg.crawl, cfg.dedupe, cfg.bloom_error_rate, cfg.bloom_capacity, cfg.bloom_expansion,
        cfg.revisit_after_seconds, cfg.revisit_buckets,
    )
    frontier = Frontier(client, cfg.crawl, bloom)
    frontier.ensure_layout(cfg.shards)
    frontier.load_scripts()
    frontier.register()
    frontier.politeness = ("a" if cfg.adaptive else "") + ("r" if robots_obey else "")
    frontier.revisit_budget_share = cfg.revisit_budget_share
    frontier.revisit_rule = cfg.revisit_rule
    _record_site_key(frontier, cfg)
    if cfg.sites:
        from streams_sched.politeness.policy import apply_site_policies

        apply_site_policies(frontier, cfg.sites)
    return frontier


def _record_site_key(frontier: Frontier, cfg: StreamsConfig) -> None:
    """The first worker records STREAMS_SITE_KEY in the crawl meta (push reads it);
    a worker with another one would split the crawl's sites two ways: say so."""
    client = frontier.client
    client.hsetnx(frontier.keys.meta, "site_key", cfg.site_key)
    recorded = client.hget(frontier.keys.meta, "site_key")
    recorded = recorded.decode() if isinstance(recorded, bytes) else recorded
    if recorded != cfg.site_key:
        logger.warning(
            "crawl %s was started with STREAMS_SITE_KEY=%r but this worker has %r: requests it"
            " enqueues are grouped by %s, the others' by %s",
            cfg.crawl, recorded, cfg.site_key, cfg.site_key, recorded,
        )


def node_info(cfg: StreamsConfig, started_s: float) -> dict[str, Any]:
    """What the node record says of this worker for as long as it runs (``started_s``:
    Redis time, like every time in the record)."""
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": started_s,
        "capabilities": list(cfg.capabilities),
        "version": __version__,
        # the reclaimer requeues a lease only after the longest lease of the live workers
        "lease_s": cfg.lease_seconds,
        "max_deliveries": cfg.max_deliveries,
    }


def announce(frontier: Frontier, cfg: StreamsConfig, node_id: str, info: dict[str, Any]) -> None:
    """Record and publish the node; a restarted worker with a stable node id hands back
    the leases of its previous run, which nobody holding them will ever finish. The record's
    last_seen is when Redis received it (heartbeat.lua), which also reads the crawl's clock."""
    record = {**info, "node": node_id, "state": "online", "crawl": cfg.crawl, "heartbeat_s": cfg.heartbeat_seconds}
    sent = time.monotonic()
    frontier.clock.observe(frontier.heartbeat(node_id, record), sent, time.monotonic())
    frontier.publish({"event": "node_online", "node": node_id, "crawl": cfg.crawl, **info})
    if cfg.node_id:
        release_orphans(frontier, node_id, frontier.leased_sites(), set(), why="left by a previous run of this node")


def feed_mover(
    cfg: StreamsConfig, spider: Spider, frontier: Frontier, codec: RequestCodec, fingerprinter: Any,
    crawler: Any, node_id: str, site_of: Any,
) -> Any:
    """The scrapy-redis feed mover of this worker (None without STREAMS_FEED_KEY).

    A spider that still subclasses scrapy-redis's RedisSpider / RedisCrawlSpider
    keeps working: its own feed reading (LRANGE + LTRIM on the reactor, lost if
    the worker dies) is turned off, its ``redis_key`` becomes the feed, and an
    overridden ``make_request_from_data`` is used to read entries.
    """
    from streams_sched.scrapy_redis.feed import FeedMover
    from streams_sched.scrapy_redis.spiders import adopt_redis_spider

    key, make_requests = adopt_redis_spider(spider, cfg.feed_key)
    if not key:
        return None
    if type(fingerprinter) is RequestFingerprinter:
        # its cache is not meant for two threads; the same class gives the same fingerprints
        fingerprinter = RequestFingerprinter(crawler)
    logger.info("streams-sched moves the scrapy-redis feed %s (%s) into crawl %s", key, cfg.feed_kind, cfg.crawl)
    return FeedMover(
        frontier, key, codec, fingerprinter, node_id, kind=cfg.feed_kind, batch=cfg.feed_batch,
        encoding=cfg.feed_encoding, high_min=cfg.high_priority_min, low_max=cfg.low_priority_max,
        make_requests=make_requests, site_of=site_of,
    )
