"""Settings of the monitor daemon: one frozen dataclass, validated when built."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import urlparse

from streams_sched.config import check_port, check_positive, validate_redis_url
from streams_sched.errors import ConfigError
from streams_sched.frontier.keys import validate_crawl_name

__all__ = ["WEBHOOK_FORMATS", "MonitorSettings"]

#: "text": {"msgtype": "text", "text": {"content": ...}}, what DingTalk and WeCom
#: group robots take; "json": the alert as a plain JSON object.
WEBHOOK_FORMATS = ("text", "json")


@dataclass(frozen=True)
class MonitorSettings:
    """What the monitor exports and when it alerts. Units are in the names."""

    # One field per command-line option or environment variable, so the options, their
    # defaults and their checks are read in one table.

    #: --redis-url / REDIS_URL (a read-only ACL user is enough).
    redis_url: str = field(default_factory=lambda: os.environ.get("REDIS_URL", "redis://localhost:6379/0"))
    #: --metrics-port: where Prometheus scrapes /metrics.
    metrics_port: int = 9108
    #: --metrics-addr: address the metrics server binds.
    metrics_addr: str = "0.0.0.0"
    #: --prefix (repeatable): crawls to watch; empty = every registered crawl.
    crawls: tuple[str, ...] = ()
    #: --webhook-url: POST alerts there (None = no alerts).
    webhook_url: str | None = None
    #: --webhook-format: "text" (DingTalk / WeCom robots) or "json".
    webhook_format: str = "text"
    #: --webhook-secret: DingTalk signing secret (adds timestamp and sign to the URL).
    webhook_secret: str | None = None
    #: --backlog-threshold: alert when a site's backlog passes it (0 = no backlog alert).
    backlog_threshold: int = 0
    #: --interval: seconds between alert evaluations (each reads Redis once).
    interval_s: float = 10.0
    #: --cache-seconds: a scrape within this long of the last read reuses it.
    cache_s: float = 2.0
    #: --max-sites: sites per crawl with their own `site` label; the rest are summed
    #: into site="_other" (label cardinality stays bounded). 0 = only "_other".
    max_sites: int = 100
    #: --index-sites: sites a read takes from each shard's leased and ready indexes (every
    #: site with work while they are shorter); a read costs no more whatever the crawl's size.
    index_sites: int = 500
    #: --sweep-sites: registered sites a read also looks at, in turn, so that the crawl-wide
    #: sums catch up with sites that went through their work between two reads.
    sweep_sites: int = 2000
    #: a node silent for this many of its heartbeat intervals is dead.
    dead_after_heartbeats: float = 3.0
    #: --dlq-quiet-seconds: a "dead letters growing" alert clears after this long without growth.
    dlq_quiet_s: float = 600.0
    #: --send-resolved: also POST when an alert's condition clears.
    send_resolved: bool = True
    #: --no-events: do not subscribe to node events (liveness from the nodes hash only).
    events: bool = True
    #: --connect-timeout: how long to wait for Redis at start before giving up.
    connect_timeout_s: float = 5.0
    #: --allow-eviction / STREAMS_ALLOW_EVICTION: start even on a Redis whose maxmemory-policy
    #: is allkeys-*, which evicts queued requests silently (with a warning).
    allow_eviction: bool = False
    #: longest wait between retries while Redis is unreachable.
    max_backoff_s: float = 30.0
    #: --burst: read once, send due alerts, print the metrics and exit.
    burst: bool = False
    #: --state-file: keep the alert state here across restarts (None = in memory only).
    state_file: str | None = None
    #: --worker-rate: requests/s one worker does, for streams_sched_workers_wanted (0 =
    #: measured from the workers' heartbeats; monitor/scaling.py).
    worker_rate: float = 0.0
    #: --scale-horizon-seconds: an unlimited site's backlog asks for the rate that takes
    #: this long to crawl it (and a limited site's, no more than that).
    scale_horizon_s: float = 60.0
    #: --max-workers: cap of streams_sched_workers_wanted (0 = none).
    max_workers: int = 0

    def __post_init__(self) -> None:
        validate_redis_url(self.redis_url, "--redis-url")
        for crawl in self.crawls:
            validate_crawl_name(crawl, "--prefix")
        if self.worker_rate < 0:
            raise ConfigError("--worker-rate", self.worker_rate, "must be 0 (measured) or more")
        if self.scale_horizon_s <= 0:
            raise ConfigError("--scale-horizon-seconds", self.scale_horizon_s, "must be more than 0")
        if self.max_workers < 0:
            raise ConfigError("--max-workers", self.max_workers, "must be 0 (no cap) or more")
        check_port("--metrics-port", self.metrics_port)
        if self.webhook_url is not None:
            parts = urlparse(self.webhook_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ConfigError("--webhook-url", self.webhook_url, "expected an http:// or https:// URL")
        if self.webhook_format not in WEBHOOK_FORMATS:
            raise ConfigError("--webhook-format", self.webhook_format, f"expected one of {WEBHOOK_FORMATS}")
        if self.backlog_threshold < 0:
            raise ConfigError("--backlog-threshold", self.backlog_threshold, "must be 0 (off) or more")
        if self.state_file is not None:
            directory = os.path.dirname(os.path.abspath(self.state_file))
            if not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
                raise ConfigError("--state-file", self.state_file, f"directory {directory} does not exist or is not writable")
        if self.max_sites < 0:
            raise ConfigError("--max-sites", self.max_sites, "must be 0 or more")
        for option, count in (("--index-sites", self.index_sites), ("--sweep-sites", self.sweep_sites)):
            if count < 1:
                raise ConfigError(option, count, "must be at least 1")
        for option, value, zero_ok in (
            ("--interval", self.interval_s, False),
            ("--cache-seconds", self.cache_s, True),
            ("dead_after_heartbeats", self.dead_after_heartbeats, False),
            ("--dlq-quiet-seconds", self.dlq_quiet_s, True),
            ("--connect-timeout", self.connect_timeout_s, True),
            ("max_backoff_s", self.max_backoff_s, False),
        ):
            check_positive(option, value, zero_ok)
