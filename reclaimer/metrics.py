"""The reclaimer's own Prometheus metrics (served with --metrics-port)."""

from __future__ import annotations

from .results import PassResult

__all__ = ["ReclaimerMetrics"]


class ReclaimerMetrics:
    """The reclaimer's own Prometheus metrics (served with --metrics-port)."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.passes = Counter("streams_sched_reclaimer_passes", "Passes run.", registry=r)
        self.errors = Counter(
            "streams_sched_reclaimer_redis_errors", "Passes that failed because of Redis.", registry=r
        )
        self.moved = {
            name: Counter(f"streams_sched_reclaimer_{name}", doc, ["crawl"], registry=r)
            for name, doc in (
                ("requeued", "Expired leases put back in their stream."),
                ("dead_lettered", "Entries moved to dead letters (over the delivery limit)."),
                ("promoted", "Delayed requests moved into their stream."),
                ("consumers_removed", "Gone consumers removed (they owned no entries)."),
                ("nodes_forgotten", "Records of long-gone nodes deleted."),
            )
        }
        self.duration = Histogram(
            "streams_sched_reclaimer_pass_duration_seconds",
            "Seconds one pass took.",
            buckets=(0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.last_pass = Gauge(
            "streams_sched_reclaimer_last_pass_timestamp_seconds",
            "Unix time of the last successful pass (Redis TIME).",
            registry=r,
        )

    def record(self, result: PassResult) -> None:
        self.passes.inc()
        self.duration.observe(result.duration_s)
        self.last_pass.set(result.ended_s)
        for c in result.crawls:
            for name, counter in self.moved.items():
                n = int(getattr(c, name))
                counter.labels(c.crawl).inc(n)
