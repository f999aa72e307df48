"""Requests that cannot travel through the shared queue (STREAMS_UNSERIALIZABLE), driven
directly on the scheduler against a real Redis; tests/test_zoo.py has the crawls."""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import scrapy
from scrapy.utils.request import RequestFingerprinter

from streams_sched.config import StreamsConfig
from streams_sched.worker.scheduler import Limits, StreamsScheduler

from helpers import wait_for


class Spider(scrapy.Spider):
    name = "unit"

    def parse_item(self, response):  # pragma: no cover - never called
        pass


class Stats:
    """The part of Scrapy's stats collector the scheduler uses."""

    def __init__(self) -> None:
        self.values: Counter[str] = Counter()

    def inc_value(self, key: str, count: int = 1, start: int = 0) -> None:
        self.values[key] += count

    def get_value(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)


def make(redis_url: str, dedupe: str, crawl: str, **settings: object) -> StreamsScheduler:
    config = StreamsConfig.from_settings(
        {"REDIS_URL": redis_url, "STREAMS_PREFIX": crawl, "STREAMS_DEDUPE": dedupe,
         "STREAMS_IDLE_POLL_SECONDS": 0.02, "STREAMS_FLUSH_INTERVAL_SECONDS": 0.005,  # drain checks every few tens of ms
         "STREAMS_EMPTY_CRAWL_WAIT_SECONDS": 0, **settings},
        "unit",
    )
    s = StreamsScheduler(config, fingerprinter=RequestFingerprinter(), stats=Stats(), limits=Limits(4, 4))  # type: ignore[arg-type]
    s.open(Spider())
    return s


@pytest.fixture
def sched(redis_url: str, dedupe: str, crawl: str) -> Iterator[StreamsScheduler]:
    s = make(redis_url, dedupe, crawl)
    yield s
    s.close("test")


def stats(s: StreamsScheduler) -> Counter[str]:
    s.counts.apply(s._x)
    return s.counts.stats.values  # type: ignore[union-attr]


def lambda_request(url: str, **kwargs: Any) -> scrapy.Request:
    return scrapy.Request(url, callback=lambda response: None, **kwargs)


def next_request(s: StreamsScheduler) -> scrapy.Request:
    return wait_for(s.next_request, timeout=10, what="a request")


def drained(s: StreamsScheduler) -> bool:
    return s._x is not None and s._x.drained


def test_request_that_cannot_travel_is_crawled_by_this_worker(sched: StreamsScheduler) -> None:
    """A request with a lambda callback is accepted, handed out as the same object with no
    lease, and counted in streams/unserializable_local; the worker stays open until it is done,
    even though the crawl in Redis is drained."""
    assert sched.enqueue_request(scrapy.Request("http://a.test/plain"))
    plain = next_request(sched)
    sched.request_done(plain)
    wait_for(lambda: drained(sched) and not sched.has_pending_requests(), timeout=10, what="the crawl to drain")
    local = lambda_request("http://a.test/local")
    assert sched.enqueue_request(local)
    assert sched.has_pending_requests() and len(sched) == 1 and sched.local_held == 1
    assert sched._io is not None and sched._io.presence.record("online")["local"] == 1  # heartbeats show it
    got = sched.next_request()
    assert got is local and sched.lease_of(got) is None
    assert sched.has_pending_requests()  # in progress
    sched.request_done(got)
    assert not sched.has_pending_requests()
    counts = stats(sched)
    assert counts["streams/unserializable_local"] == 1 and counts["streams/unserializable"] == 1
    assert counts["scheduler/unserializable"] == 1  # as Scrapy's disk queues count them
    assert counts["scheduler/enqueued/memory"] == 1 and counts["scheduler/dequeued/memory"] == 1
    assert counts["scheduler/enqueued/redis"] == 1 and counts["scheduler/enqueued"] == 2


@pytest.mark.targets("bitmap")  # the drain bookkeeping, not the dedupe back-end
def test_follow_ups_of_a_local_request_keep_a_drained_worker_open_until_they_are_in_redis(
    sched: StreamsScheduler, r: redis.Redis
) -> None:
    """A local request's follow-up is still on its way to Redis (Redis paused) when the local
    request finishes: the drained worker does not report "nothing pending" in that window."""
    assert sched.enqueue_request(scrapy.Request("http://a.test/plain"))
    sched.request_done(next_request(sched))
    wait_for(lambda: drained(sched) and not sched.has_pending_requests(), timeout=10, what="the crawl to drain")
    assert sched.enqueue_request(lambda_request("http://a.test/local"))
    local = sched.next_request()
    assert local is not None
    pump = sched._io
    assert pump is not None
    r.execute_command("CLIENT", "PAUSE", 1500, "WRITE")
    try:
        assert sched.enqueue_request(scrapy.Request("http://a.test/child"))
        sched.request_done(local)
        wait_for(lambda: not pump.exchange.outbox, timeout=10, what="the I/O thread to take the enqueue")
        deadline = time.monotonic() + 0.25  # a dozen drain checks at the 0.02 s idle poll
        while time.monotonic() < deadline:
            assert sched.has_pending_requests()
            time.sleep(0.01)
    finally:
        r.execute_command("CLIENT", "UNPAUSE")
    child = next_request(sched)
    assert child.url == "http://a.test/child" and sched.lease_of(child) is not None
    sched.request_done(child)
    wait_for(lambda: not sched.has_pending_requests(), timeout=10, what="the crawl to drain again")


def test_worker_whose_every_request_is_local_closes_when_done(redis_url: str, dedupe: str, crawl: str) -> None:
    """A crawl whose only requests never reached Redis is not "waiting for seeds": once its
    local requests are done the worker reports nothing pending, without the empty-crawl wait."""
    s = make(redis_url, dedupe, crawl, STREAMS_EMPTY_CRAWL_WAIT_SECONDS=60)
    try:
        assert s.enqueue_request(lambda_request("http://a.test/only"))
        request = s.next_request()
        assert request is not None
        s.request_done(request)
        wait_for(lambda: not s.has_pending_requests(), timeout=10, what="the worker to be done")
    finally:
        s.close("test")


def test_local_requests_are_deduplicated_by_this_worker(sched: StreamsScheduler) -> None:
    """A second local request with the same fingerprint is a duplicate; dont_filter is not."""
    assert sched.enqueue_request(lambda_request("http://a.test/1"))
    assert not sched.enqueue_request(lambda_request("http://a.test/1"))
    assert sched.enqueue_request(lambda_request("http://a.test/1", dont_filter=True))
    assert stats(sched)["dupefilter/filtered"] == 1 and sched.local_held == 2


def test_local_requests_are_served_fairly_with_leased_ones(sched: StreamsScheduler) -> None:
    """Leased requests of one site and local requests of another are served in turn."""
    for i in range(4):
        assert sched.enqueue_request(scrapy.Request(f"http://leased.test/{i}"))
    pump = sched._io
    assert pump is not None
    wait_for(lambda: pump.leases.total == 4 and len(sched) == 4, timeout=10, what="4 prefetched requests")
    for i in range(4):
        assert sched.enqueue_request(lambda_request(f"http://local.test/{i}"))
    order = [next_request(sched) for _ in range(8)]
    hosts = ["local" if sched.lease_of(r) is None else "leased" for r in order]
    assert all(hosts[i] != hosts[i + 1] for i in range(7)), hosts
    for request in order:
        sched.request_done(request)


def test_one_warning_per_reason_that_says_how_to_fix_it(sched: StreamsScheduler, caplog: pytest.LogCaptureFixture) -> None:
    """Many requests refused for two reasons log two warnings, each naming the fix; all are counted."""
    caplog.set_level(logging.WARNING, logger="streams_sched")
    for i in range(3):
        assert sched.enqueue_request(lambda_request(f"http://a.test/cb{i}"))
    for i in range(2):
        assert sched.enqueue_request(scrapy.Request(f"http://a.test/obj{i}", meta={"obj": object()}))
    warnings = [rec.getMessage() for rec in caplog.records if rec.name == "streams_sched.worker.unserializable"]
    assert len(warnings) == 2, warnings
    assert "callback" in warnings[0] and "method of the spider" in warnings[0] and "lost if this worker dies" in warnings[0]
    assert "meta['obj']" in warnings[1] and "STREAMS_META_CLASSES" in warnings[1]
    assert stats(sched)["streams/unserializable_local"] == 5


def test_oversize_request_is_crawled_locally(redis_url: str, dedupe: str, crawl: str) -> None:
    """A request over STREAMS_MAX_REQUEST_BYTES stays with this worker too, counted as oversize."""
    s = make(redis_url, dedupe, crawl, STREAMS_MAX_REQUEST_BYTES=1000)
    try:
        big = scrapy.Request("http://a.test/big", method="POST", body=b"x" * 5000)
        assert s.enqueue_request(big)
        assert s.next_request() is big
        counts = stats(s)
        assert counts["streams/oversize"] == 1 and counts["streams/unserializable_local"] == 1
    finally:
        s.close("test")


def test_error_mode_refuses_loudly_and_fails_the_crawl(redis_url: str, dedupe: str, crawl: str, caplog: pytest.LogCaptureFixture) -> None:
    """With STREAMS_UNSERIALIZABLE="error" the request is refused with an ERROR naming the reason,
    counted, and the scheduler reports the crawl as failed."""
    s = make(redis_url, dedupe, crawl, STREAMS_UNSERIALIZABLE="error")
    try:
        assert not s.enqueue_request(lambda_request("http://a.test/x"))
        assert not s.enqueue_request(scrapy.Request("http://a.test/y", meta={"obj": object()}))
        errors = [rec.getMessage() for rec in caplog.records if rec.levelno == logging.ERROR]
        assert any("<GET http://a.test/x>: callback" in e and "STREAMS_UNSERIALIZABLE='error'" in e for e in errors), errors
        assert any("meta['obj']" in e for e in errors), errors
        counts = stats(s)
        assert counts["streams/unserializable_refused"] == 2 and counts["streams/unserializable_local"] == 0
        failure = s.unserializable.failure()
        assert failure is not None and "refused 2 requests" in failure
        assert s.local_held == 0
    finally:
        s.close("test")


def test_closing_counts_local_requests_never_crawled(redis_url: str, dedupe: str, crawl: str, caplog: pytest.LogCaptureFixture) -> None:
    """A worker closing (SIGTERM) with local requests not started logs and counts them as lost."""
    s = make(redis_url, dedupe, crawl)
    assert s.enqueue_request(lambda_request("http://a.test/x"))
    s.close("shutdown")
    assert s.counts.stats.values["streams/unserializable_lost"] == 1  # type: ignore[union-attr]
    assert "closing with 1 local requests not crawled" in caplog.text


def test_worker_metrics_count_local_requests(sched: StreamsScheduler) -> None:
    """The worker exporter shows requests kept locally: a counter, and a gauge of those held now
    (not counted among the prefetched leases)."""
    from types import SimpleNamespace

    from streams_sched.worker.metrics import WorkerMetrics

    for i in range(2):
        assert sched.enqueue_request(lambda_request(f"http://a.test/{i}"))
    started = sched.next_request()
    assert started is not None
    stats(sched)
    metrics = WorkerMetrics(SimpleNamespace(stats=sched.counts.stats), sched, [0])
    samples = {s.name: s.value for fam in metrics.registry.collect() for s in fam.samples}
    assert samples["streams_sched_worker_unserializable_local_total"] == 2
    assert samples["streams_sched_worker_local_requests"] == 2  # one waiting, one in progress
    assert samples["streams_sched_worker_prefetched"] == 0
    sched.request_done(started)
