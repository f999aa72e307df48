"""A worker's own Prometheus metrics, served over HTTP by the worker process.

Turned on by one setting: ``STREAMS_METRICS_PORT`` (a port like ``9410``, or a
range like ``9410-9419``: the first free port of the range is used, so several
workers on one host can share one setting). ``STREAMS_METRICS_ADDR`` is the
address to bind (default ``0.0.0.0``). The scheduler attaches the exporter in
``from_crawler``; no EXTENSIONS entry is needed.

Metrics (labels ``crawl`` and ``node``, the worker's consumer name)::

    streams_sched_worker_leased_total            requests leased from the frontier
    streams_sched_worker_acked_total             leases acked (requests finished)
    streams_sched_worker_reclaimed_total         expired leases of other workers taken over
    streams_sched_worker_dedupe_hits_total       requests dropped as duplicates
    streams_sched_worker_enqueued_total          new requests added to the frontier
    streams_sched_worker_dead_lettered_total     entries this worker moved to dead letters
    streams_sched_worker_released_total          unstarted leases handed back at close
    streams_sched_worker_redis_errors_total      failed Redis round trips and refused commands (retried)
    streams_sched_worker_replica_waits_total     barriers that found a primary's replicas behind (acks held)
    streams_sched_worker_replica_resends_total   enqueues sent again: their primary was gone or replaced
    streams_sched_worker_replica_resends_skipped_total  of those, left out: crawled by this worker since
    streams_sched_worker_unserializable_local_total  requests that cannot travel, crawled by this worker
    streams_sched_worker_browser_leased_total    browser tasks leased or taken over
    streams_sched_worker_render_failed_total     browser tasks whose download failed (a failed delivery each)
    streams_sched_worker_delivery_failed_total   failed deliveries put back in the frontier for another
    streams_sched_worker_rolled_back_bytes_total  bytes of replica-acknowledged writes a failover threw away
    streams_sched_worker_primary_restarted_empty_total  primaries found restarted empty (no AOF, nothing loaded)
    streams_sched_worker_prefetched              leased requests waiting in the worker
    streams_sched_worker_local_requests          requests only this worker holds (waiting or in progress)
    streams_sched_worker_browser_leases          browser leases held (prefetched or rendering)
    streams_sched_worker_browser_max             STREAMS_BROWSER_MAX (0 without the browser capability)
    streams_sched_worker_redis_unreachable_seconds  how long no Redis server has answered (0 while one does)
    streams_sched_worker_io_stuck_seconds        how long the I/O thread's current cycle has run
    streams_sched_worker_lease_to_ack_seconds    histogram: lease to ack, per request
    streams_sched_worker_render_seconds          histogram: a browser task's time in the downloader

The counters are the crawl stats Scrapy already keeps (``streams/leased``,
``dupefilter/filtered``, ...), read at scrape time; the histograms are fed by
the scheduler's ``ack_listeners`` and ``render_listeners``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from streams_sched.errors import ConfigError

__all__ = ["WORKER_COUNTERS", "WorkerMetrics", "attach_worker_metrics", "parse_ports"]

logger = logging.getLogger(__name__)

#: metric name (without ``_total``) -> (crawl stats key, help)
WORKER_COUNTERS: dict[str, tuple[str, str]] = {
    "streams_sched_worker_leased": ("streams/leased", "Requests leased from the frontier by this worker."),
    "streams_sched_worker_acked": ("streams/acked", "Leases acked by this worker (requests finished)."),
    "streams_sched_worker_reclaimed": (
        "streams/reclaimed", "Expired leases of other workers taken over by this worker."
    ),
    "streams_sched_worker_dedupe_hits": (
        "dupefilter/filtered", "Requests dropped as duplicates (local cache or the Redis filter)."
    ),
    "streams_sched_worker_enqueued": ("streams/enqueued", "New requests this worker added to the frontier."),
    "streams_sched_worker_dead_lettered": (
        "streams/dead_lettered", "Entries this worker moved to the dead-letter stream."
    ),
    "streams_sched_worker_released": ("streams/released", "Unstarted leases handed back when stopping."),
    "streams_sched_worker_redis_errors": ("streams/redis_errors", "Redis round trips that failed and commands Redis refused (both retried with back-off)."),
    "streams_sched_worker_replica_waits": (
        "streams/replica_waits", "Replica waits that fell short: the acks after them were held and the wait tried again."
    ),
    "streams_sched_worker_replica_resends": (
        "streams/replica_resends", "Enqueues sent again because the primary that confirmed them was gone or replaced."
    ),
    "streams_sched_worker_replica_resends_skipped": (
        "streams/replica_resends_skipped",
        "Enqueues not sent again after their primary was replaced: this worker had crawled them since.",
    ),
    "streams_sched_worker_unserializable_local": (
        "streams/unserializable_local",
        "Requests that cannot travel through the shared queue, kept and crawled by this worker"
        " (lost if it dies).",
    ),
    "streams_sched_worker_browser_leased": (
        "streams/leased_browser", "Browser tasks this worker leased or took over."
    ),
    "streams_sched_worker_render_failed": (
        "streams/render_failed",
        "Browser tasks whose download failed on this worker (a render that timed out, a crashed tab):"
        " each a failed delivery, retried by the frontier or dead-lettered after STREAMS_MAX_DELIVERIES.",
    ),
    "streams_sched_worker_delivery_failed": (
        "streams/delivery_failed", "Failed deliveries this worker put back in the frontier for another delivery."
    ),
    "streams_sched_worker_rolled_back_bytes": (
        "streams/rolled_back_bytes",
        "Bytes of writes a replica had acknowledged that a failover threw away (Redis promoted a replica"
        " without them): their acks and leases come back, and requests queued only in them are lost.",
    ),
    "streams_sched_worker_primary_restarted_empty": (
        "streams/primary_restarted_empty",
        "Redis primaries this worker found restarted empty (no AOF, nothing loaded): the queued requests,"
        " leases and seen filters they held are gone. Each worker counts a restart once.",
    ),
}

#: Buckets of the lease-to-ack histogram, in seconds (up to the default lease of 300 s and past it).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)
#: Buckets of the render-time histogram, in seconds (scrapy-playwright's navigation timeout is 30 s).
RENDER_BUCKETS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0)


def parse_ports(value: Any, setting: str = "STREAMS_METRICS_PORT") -> list[int]:
    """``9410`` or ``"9410-9419"`` -> the ports to try, in order. Empty/None -> []."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    problem = 'expected a port like 9410 or a range like "9410-9419"'
    if isinstance(value, bool):
        raise ConfigError(setting, value, problem)
    try:
        if isinstance(value, int):
            lo = hi = value
        else:
            text = str(value).strip()
            lo_s, _, hi_s = text.partition("-")
            lo = int(lo_s)
            hi = int(hi_s) if hi_s else lo
    except ValueError:
        raise ConfigError(setting, value, problem) from None
    if not (0 <= lo <= hi <= 65535):
        raise ConfigError(setting, value, problem + " (0-65535, low end first)")
    return list(range(lo, hi + 1))


class _StatsCollector:
    """Turns the crawl stats into counters at scrape time."""

    def __init__(self, owner: WorkerMetrics) -> None:
        self.owner = owner

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        o = self.owner
        labels = ["crawl", "node"]
        values = [o.crawl, o.node]
        stats = o.stats
        for name, (key, doc) in WORKER_COUNTERS.items():
            fam = CounterMetricFamily(name, doc, labels=labels)
            fam.add_metric(values, float(stats.get_value(key, 0) or 0) if stats is not None else 0.0)
            yield fam
        sched = o.scheduler
        waiting_local = int(getattr(sched, "local_waiting", 0))
        for name, doc, value in (
            ("streams_sched_worker_prefetched", "Leased requests waiting in this worker.",
             max(0, len(sched) - waiting_local)),
            ("streams_sched_worker_local_requests",
             "Requests only this worker holds because they cannot travel (waiting or in progress).",
             getattr(sched, "local_held", 0)),
            ("streams_sched_worker_browser_leases",
             "Browser leases this worker holds (prefetched or rendering), against streams_sched_worker_browser_max.",
             getattr(sched, "browser_leases", 0)),
            ("streams_sched_worker_redis_unreachable_seconds",
             "Seconds this worker has reached no Redis server of its crawl (0 while it does): past a lease,"
             " its leases go to other workers.",
             getattr(sched, "redis_unreachable_s", 0.0)),
            ("streams_sched_worker_io_stuck_seconds",
             "Seconds the I/O thread's current Redis cycle has run (0 between cycles); a large value with no"
             " Redis error is a stuck call.",
             getattr(sched, "io_stuck_s", 0.0)),
            ("streams_sched_worker_browser_max",
             "Most browser leases this worker holds at once (STREAMS_BROWSER_MAX; 0 without the browser capability).",
             getattr(sched, "browser_max", 0)),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=labels)
            gauge.add_metric(values, float(value))
            yield gauge


class WorkerMetrics:
    """Serves one worker's metrics on ``ports[0]`` (or the next free port of the list)."""

    def __init__(self, crawler: Any, scheduler: Any, ports: list[int], addr: str = "0.0.0.0") -> None:
        from prometheus_client import CollectorRegistry, Histogram, ProcessCollector

        self.crawler = crawler
        self.scheduler = scheduler
        self.stats = getattr(crawler, "stats", None)
        self.ports = ports
        self.addr = addr
        self.crawl = scheduler.config.crawl
        self.node = scheduler.node_id
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        self.registry.register(_StatsCollector(self))
        self.latency = Histogram(
            "streams_sched_worker_lease_to_ack_seconds",
            "Seconds from a request's lease to its ack, in this worker.",
            ["crawl", "node"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        ).labels(self.crawl, self.node)
        self.render = Histogram(
            "streams_sched_worker_render_seconds",
            "Seconds a browser task spent in this worker's downloader (the browser's navigation and"
            " page methods), rendered or failed.",
            ["crawl", "node"],
            buckets=RENDER_BUCKETS,
            registry=self.registry,
        ).labels(self.crawl, self.node)
        self.server: Any = None
        self.port: int | None = None
        scheduler.ack_listeners.append(self.on_ack)
        scheduler.render_listeners.append(self.on_render)

    def on_ack(self, entry: Any, latency_s: float) -> None:
        self.latency.observe(max(0.0, latency_s))

    def on_render(self, request: Any, seconds: float) -> None:
        self.render.observe(max(0.0, seconds))

    def start(self) -> None:
        from streams_sched.service.metrics_server import MetricsServer

        last: OSError | None = None
        for port in self.ports:
            try:
                self.server = MetricsServer(self.registry, port, self.addr).start()
            except OSError as exc:
                last = exc
                continue
            self.port = self.server.port
            logger.info(
                "streams-sched worker metrics on http://%s:%d/metrics (crawl=%s node=%s)",
                self.addr, self.port, self.crawl, self.node,
            )
            return
        logger.error(
            "streams-sched worker metrics are off: no free port in STREAMS_METRICS_PORT=%s (%s);"
            " give a range like 9410-9419 for several workers on one host",
            f"{self.ports[0]}-{self.ports[-1]}" if len(self.ports) > 1 else self.ports[0], last,
        )

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def spider_opened(self, spider: Any = None) -> None:
        self.start()

    def spider_closed(self, spider: Any = None, reason: str = "") -> None:
        self.stop()


def attach_worker_metrics(crawler: Any, scheduler: Any) -> WorkerMetrics | None:
    """Attach the exporter to a scheduler if ``STREAMS_METRICS_PORT`` is set."""
    config = scheduler.config  # STREAMS_METRICS_PORT and STREAMS_METRICS_ADDR, parsed and checked
    ports = list(config.metrics_ports)
    if not ports:
        return None
    from scrapy import signals

    metrics = WorkerMetrics(crawler, scheduler, ports, config.metrics_addr)
    crawler.signals.connect(metrics.spider_opened, signal=signals.spider_opened)
    crawler.signals.connect(metrics.spider_closed, signal=signals.spider_closed)
    return metrics
