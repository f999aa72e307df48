"""Settings of the reclaimer daemon: one frozen dataclass, validated when built."""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from streams_sched.config import check_port, check_positive, default_of, validate_redis_url
from streams_sched.errors import ConfigError
from streams_sched.frontier.keys import validate_crawl_name

__all__ = ["DEFAULT_LEASE_S", "DEFAULT_MAX_DELIVERIES", "ReclaimerSettings"]

#: Lease time used when no worker of a crawl says its own (STREAMS_LEASE_SECONDS' default).
DEFAULT_LEASE_S: float = default_of("lease_seconds")
#: Delivery limit used when no worker says its own (STREAMS_MAX_DELIVERIES' default).
DEFAULT_MAX_DELIVERIES: int = default_of("max_deliveries")


@dataclass(frozen=True)
class ReclaimerSettings:
    """What the reclaimer does and how often. Units are in the names."""

    #: --redis-url / REDIS_URL: the frontier's Redis.
    redis_url: str = field(default_factory=lambda: os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    #: --interval: seconds between passes.
    interval_s: float = 5.0
    #: --prefix (repeatable): crawls to look after; empty = every registered crawl.
    crawls: tuple[str, ...] = ()
    #: --metrics-port: serve the reclaimer's own metrics there (None = off).
    metrics_port: int | None = None
    #: --metrics-addr: address the metrics server binds.
    metrics_addr: str = "0.0.0.0"
    #: --lease-seconds: requeue leases idle this long. None = the longest lease the
    #: crawl's workers advertise in their node records (else DEFAULT_LEASE_S).
    lease_s: float | None = None
    #: --max-deliveries: dead-letter entries delivered more often. None = the
    #: largest limit the crawl's workers advertise (else DEFAULT_MAX_DELIVERIES).
    max_deliveries: int | None = None
    #: --batch: entries per XAUTOCLAIM / promote call for one site.
    batch: int = 500
    #: calls per site and pass, at most (a huge backlog of expired leases takes several passes).
    max_calls_per_site: int = 20
    #: sites per pipeline (one round trip).
    sites_per_round_trip: int = 200
    #: sites a pass takes from each shard's leased index (expired leases) and each ready
    #: index (due delayed requests, prune): a pass costs no more whatever the crawl's size;
    #: the rest wait for the next pass.
    sites_per_shard: int = 1000
    #: --consumer: consumer name the requeues run under.
    consumer: str = "streams-reclaimer"
    #: a node silent for this many of its heartbeat intervals is dead.
    dead_after_heartbeats: float = 3.0
    #: --prune-interval: seconds between looks for gone consumers (XINFO CONSUMERS per stream).
    prune_interval_s: float = 60.0
    #: --node-retention: seconds a dead or offline node's record is kept (0 = forever).
    node_retention_s: float = 3600.0
    #: --connect-timeout: how long to wait for Redis at start before giving up.
    connect_timeout_s: float = 5.0
    #: --allow-eviction / STREAMS_ALLOW_EVICTION: start even on a Redis whose maxmemory-policy
    #: is allkeys-*, which evicts queued requests silently (with a warning).
    allow_eviction: bool = False
    #: longest wait between retries while Redis is unreachable.
    max_backoff_s: float = 30.0
    #: --name: this reclaimer's name in its health key (ss:health:reclaimer:<name>).
    name: str = field(default_factory=socket.gethostname)
    #: --burst: run one pass and exit.
    burst: bool = False

    def __post_init__(self) -> None:
        validate_redis_url(self.redis_url, "--redis-url")
        for crawl in self.crawls:
            validate_crawl_name(crawl, "--prefix")
        check_positive("--interval", self.interval_s)
        if self.metrics_port is not None:
            check_port("--metrics-port", self.metrics_port)
        if self.lease_s is not None:
            check_positive("--lease-seconds", self.lease_s)
        if self.max_deliveries is not None and self.max_deliveries < 1:
            raise ConfigError("--max-deliveries", self.max_deliveries, "must be at least 1")
        for option, value in (
            ("--batch", self.batch),
            ("max_calls_per_site", self.max_calls_per_site),
            ("sites_per_round_trip", self.sites_per_round_trip),
            ("sites_per_shard", self.sites_per_shard),
        ):
            if value < 1:
                raise ConfigError(option, value, "must be at least 1")
        check_positive("dead_after_heartbeats", self.dead_after_heartbeats)
        check_positive("--prune-interval", self.prune_interval_s)
        check_positive("--node-retention", self.node_retention_s, zero_ok=True)
        check_positive("--connect-timeout", self.connect_timeout_s, zero_ok=True)
        check_positive("max_backoff_s", self.max_backoff_s)
        if not self.consumer or not all(c.isalnum() or c in "._:@-" for c in self.consumer):
            raise ConfigError("--consumer", self.consumer, "use letters, digits and . _ : @ -")
        if not self.name or any(c.isspace() for c in self.name):
            raise ConfigError("--name", self.name, "a non-empty name without spaces")

