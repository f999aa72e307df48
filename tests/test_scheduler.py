"""The scheduler and its I/O thread, driven directly (no crawler) against a real Redis."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
import redis
import scrapy
from scrapy.http import HtmlResponse
from scrapy.utils.request import RequestFingerprinter

from streams_sched.config import StreamsConfig
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import GROUP
from streams_sched.worker.io import trouble
from streams_sched.worker.scheduler import Limits, StreamsScheduler

from helpers import wait_for

#: the longest idle wait of the I/O thread: its drain checks and empty-lease back-offs come
#: every few tens of ms, so a test waiting for a drain or a few cycles does not wait seconds
IDLE_POLL_S = 0.02
#: the first wait before a refused command is tried again, a fifth of the worker's: the
#: back-off still doubles, and a test that waits through four tries takes 0.3 s, not 1.5 s
RETRY_S = trouble.RETRY_INITIAL_S / 5


class Spider(scrapy.Spider):
    name = "unit"

    def parse_item(self, response):  # pragma: no cover - never called
        pass


@pytest.fixture
def sched(redis_url: str, dedupe: str, crawl: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[StreamsScheduler]:
    monkeypatch.setattr(trouble, "RETRY_INITIAL_S", RETRY_S)
    config = StreamsConfig.from_settings(
        {"REDIS_URL": redis_url, "STREAMS_PREFIX": crawl, "STREAMS_DEDUPE": dedupe,
         "STREAMS_IDLE_POLL_SECONDS": IDLE_POLL_S, "STREAMS_FLUSH_INTERVAL_SECONDS": 0.005},
        "unit",
    )
    s = StreamsScheduler(config, fingerprinter=RequestFingerprinter(), limits=Limits(4, 4))
    s.open(Spider())
    yield s
    s.close("test")


def next_request(s: StreamsScheduler) -> scrapy.Request:
    return wait_for(s.next_request, timeout=10, what="a leased request")


def test_request_round_trips_through_redis(sched: StreamsScheduler) -> None:
    """A request enqueued comes back from next_request with its callback bound to the spider."""
    assert sched.enqueue_request(scrapy.Request("http://a.test/1", callback=sched.spider.parse_item, meta={"k": 1}))
    got = next_request(sched)
    assert got.url == "http://a.test/1" and got.callback == sched.spider.parse_item and got.meta["k"] == 1
    assert sched.lease_of(got) is not None


def test_local_duplicate_is_refused_at_once(sched: StreamsScheduler) -> None:
    """A fingerprint this worker already sent is refused without a Redis round trip."""
    assert sched.enqueue_request(scrapy.Request("http://a.test/1"))
    assert not sched.enqueue_request(scrapy.Request("http://a.test/1"))
    assert sched.enqueue_request(scrapy.Request("http://a.test/1", dont_filter=True))


@pytest.mark.targets("bitmap")  # the I/O thread's waits and order, not the dedupe back-end
def test_ack_waits_until_follow_ups_are_in_redis(sched: StreamsScheduler, r: redis.Redis, crawl: str) -> None:
    """While a follow-up request cannot be enqueued, its parent stays leased; once it can, child then ack."""
    sched.enqueue_request(scrapy.Request("http://parent.test/"))
    parent = next_request(sched)
    f = Frontier(r, crawl)
    parent_stream = f.site("parent.test").stream("http", "default")
    child_keys = f.site("child.test")
    r.hset(child_keys.seen, "x", "wrong type")  # the child's enqueue script now fails
    sched.enqueue_request(scrapy.Request("http://child.test/"))
    sched.request_done(parent)
    pump = sched._io
    cycles = pump.cycles
    wait_for(lambda: pump.cycles > cycles + 3, timeout=30, what="a few I/O cycles")
    assert r.xpending(parent_stream, GROUP)["pending"] == 1  # not acked
    child = f.status("child.test")
    assert (child.backlog, child.pending) == (0, 0)
    r.delete(child_keys.seen)  # the failure clears
    # acked: its stream, now empty, is retired with its group
    wait_for(lambda: r.exists(parent_stream) == 0, timeout=30, what="the parent's ack")
    child = f.status("child.test")  # in its inbox or stream, or already leased by this worker
    assert child.backlog + child.pending == 1


@pytest.mark.targets("bitmap")  # the I/O thread's waits and order, not the dedupe back-end
def test_a_refused_command_is_logged_once_and_retried_with_back_off(
    sched: StreamsScheduler, r: redis.Redis, crawl: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A WRONGTYPE refusal is logged once however often it is retried, the retries back off, and its end is logged with the count."""
    f = Frontier(r, crawl)
    child_keys = f.site("child.test")
    r.hset(child_keys.seen, "x", "wrong type")  # enqueue.lua now fails with WRONGTYPE, every time
    pump = sched._io
    assert pump is not None
    with caplog.at_level(logging.INFO, logger="streams_sched.worker.io.cycle"):
        sched.enqueue_request(scrapy.Request("http://child.test/"))
        wait_for(
            lambda: sum(n for (what, _), n in pump.trouble.refusals.counts.items() if what == "enqueue to site child.test") >= 4,
            timeout=30, what="four refused tries",
        )
        assert pump.trouble.retry.current_s >= 4 * RETRY_S  # 1, 2, 4 times RETRY_S: the tries back off
        errors = [rec for rec in caplog.records if rec.levelno >= logging.ERROR]
        assert len(errors) == 1 and "refused the enqueue to site child.test" in errors[0].getMessage(), [e.getMessage() for e in errors]
        r.delete(child_keys.seen)
        wait_for(lambda: f.status("child.test").stats.get("enqueued") == 1, timeout=30, what="the enqueue")

        def ended_lines() -> list[str]:
            return [rec.getMessage() for rec in caplog.records if "accepts the enqueue to site child.test again" in rec.getMessage()]

        # the I/O thread forgets the refusal, then logs its end: wait for the line
        wait_for(ended_lines, timeout=30, what="the refusal's end to be logged")
        assert not pump.trouble.refusals
    ended = ended_lines()
    assert len(ended) == 1 and "after refusing it" in ended[0], ended
    assert int(ended[0].split("after refusing it ")[1].split()[0]) >= 4
    assert len([rec for rec in caplog.records if rec.levelno >= logging.ERROR]) == 1


def test_close_hands_back_prefetched_requests(sched: StreamsScheduler, r: redis.Redis, crawl: str) -> None:
    """Requests leased ahead but never started go back to the backlog when the worker closes."""
    for i in range(3):
        sched.enqueue_request(scrapy.Request(f"http://a.test/{i}"))
    stream = Frontier(r, crawl).site("a.test").stream("http", "default")
    wait_for(lambda: sched._io.leases.total == 3 and r.xpending(stream, GROUP)["pending"] == 3, timeout=10)
    started = next_request(sched)
    sched.request_done(started)
    sched.close("test")
    assert r.xpending(stream, GROUP)["pending"] == 0
    assert r.xlen(stream) == 2  # two unstarted, back in the backlog


@pytest.mark.targets("bitmap")  # the I/O thread's waits and order, not the dedupe back-end
def test_has_pending_requests_until_the_crawl_is_drained(sched: StreamsScheduler) -> None:
    """The scheduler reports pending work while anything is leased, and stops once drained."""
    sched.enqueue_request(scrapy.Request("http://a.test/only"))
    assert sched.has_pending_requests()
    req = next_request(sched)
    pump_cycles(sched, 5)  # I/O cycles with the lease held and the stream empty
    assert sched.has_pending_requests()  # leased, not acked
    sched.request_done(req)
    wait_for(lambda: not sched.has_pending_requests(), timeout=10, what="drain")


def test_served_and_weights_follow_the_sites_held(sched: StreamsScheduler) -> None:
    """With the real I/O thread, a site's policy weight is there while the worker holds its request, and Exchange.served / weights keep nothing of the sites once they are done."""
    from streams_sched.politeness.policy import set_policy

    assert sched.frontier is not None and sched._x is not None
    sites = [f"w{i}.test" for i in range(30)]
    for site in sites[::2]:
        set_policy(sched.frontier, site, {"weight": 2})
    for site in sites:
        assert sched.enqueue_request(scrapy.Request(f"http://{site}/"))
    weights: dict[str, float] = {}
    while len(weights) < len(sites):
        request = next_request(sched)
        entry = sched.lease_of(request)
        assert entry is not None
        weights[entry.site] = sched._x.weight(entry.site)
        sched.request_done(request)
    assert weights == {site: 2.0 if i % 2 == 0 else 1.0 for i, site in enumerate(sites)}
    x = sched._x
    wait_for(lambda: sched.next_request() is None and not x.served and len(x.weights) <= 1, timeout=10,
             what="served and weights to let go of the sites done")
    assert not sched.ready.busy and len(sched.ready.fair) == 0


def pump_cycles(s: StreamsScheduler, n: int) -> None:
    """Wait until the scheduler's I/O thread has run ``n`` more cycles."""
    assert s._io is not None
    start = s._io.cycles
    wait_for(lambda: s._io is not None and s._io.cycles >= start + n, timeout=30, what=f"{n} I/O cycles")


def make(redis_url: str, dedupe: str, crawl: str, **settings: object) -> StreamsScheduler:
    config = StreamsConfig.from_settings(
        {"REDIS_URL": redis_url, "STREAMS_PREFIX": crawl, "STREAMS_DEDUPE": dedupe,
         "STREAMS_IDLE_POLL_SECONDS": IDLE_POLL_S, **settings},
        "unit",
    )
    s = StreamsScheduler(config, fingerprinter=RequestFingerprinter(), limits=Limits(4, 4))
    s.open(Spider())
    return s


@pytest.mark.targets("bitmap")  # the I/O thread's waits and order, not the dedupe back-end
def test_empty_crawl_waits_for_seeds_before_counting_as_drained(redis_url: str, dedupe: str, crawl: str) -> None:
    """A worker on a crawl that never had a request keeps waiting for seeds, up to the setting."""
    wait_s = 0.6  # ample for the 5 cycles below, which take about 5 * IDLE_POLL_S
    s = make(redis_url, dedupe, crawl, STREAMS_EMPTY_CRAWL_WAIT_SECONDS=wait_s)
    try:
        started = time.monotonic()
        wait_for(lambda: s._io.drain.waiting_for_seeds_logged, timeout=10, what="a drain check on the empty crawl")
        pump_cycles(s, 5)
        assert s.has_pending_requests()  # not drained: nothing was ever enqueued
        wait_for(lambda: not s.has_pending_requests(), timeout=10, what="drain after the wait")
        assert time.monotonic() - started >= wait_s
    finally:
        s.close("test")


def test_restarted_node_hands_back_its_previous_leases_at_start(redis_url: str, dedupe: str, crawl: str, r: redis.Redis) -> None:
    """With a stable STREAMS_NODE_ID, a restarted worker releases what its previous run held."""
    from streams_sched.frontier.records import Entry

    from helpers import frontier

    f = frontier(redis_url, crawl, dedupe)
    f.register_sites(["a.test"])
    f.enqueue("a.test", [Entry(bytes([i]) * 20, 1, 0, b"x") for i in range(3)])
    f.lease("a.test", "node-a", 3, (1, 1, 1))  # the previous run died holding these
    stream = f.site("a.test").stream("http", "default")
    old_leases = {p["message_id"] for p in r.xpending_range(stream, GROUP, "-", "+", 10, "node-a")}
    assert len(old_leases) == 3
    s = make(redis_url, dedupe, crawl, STREAMS_NODE_ID="node-a", STREAMS_MAX_DELIVERIES=5, STREAMS_LEASE_SECONDS=300)
    try:
        # handed back at open (release.lua re-adds each entry and deletes the leased one),
        # long before the 300 s lease would expire
        wait_for(lambda: not any(r.xrange(stream, i, i) for i in old_leases), timeout=10, what="the old leases to be handed back")
        assert int(r.hget(f.site("a.test").stats, "released") or 0) == 3
        assert r.xlen(stream) == 3  # the same three requests, as new entries
    finally:
        s.close("test")
    # nothing pending; a stream emptied meanwhile (dead-lettered payloads) is retired
    assert not r.exists(stream) or r.xpending(stream, GROUP)["pending"] == 0


@pytest.mark.targets("bitmap")  # the I/O thread's waits and order, not the dedupe back-end
def test_extend_lease_resets_the_lease_clock(sched: StreamsScheduler, r: redis.Redis, crawl: str) -> None:
    """A long-running request can extend its own lease: its idle time in Redis starts over."""
    sched.enqueue_request(scrapy.Request("http://slow.test/"))
    req = next_request(sched)
    stream = Frontier(r, crawl).site("slow.test").stream("http", "default")
    wait_for(lambda: r.xpending_range(stream, GROUP, "-", "+", 1)[0]["time_since_delivered"] >= 300, timeout=10)
    assert sched.extend_lease(req)
    wait_for(lambda: r.xpending_range(stream, GROUP, "-", "+", 1)[0]["time_since_delivered"] < 300, timeout=10, what="the lease to be extended")
    assert not sched.extend_lease(scrapy.Request("http://never-leased.test/"))


@pytest.mark.targets("bitmap")  # the I/O thread's waits and order, not the dedupe back-end
def test_healthy_answers_of_a_site_go_with_its_ack_not_a_feedback_call(
    redis_url: str, dedupe: str, crawl: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An answer whose site's ack waits a cycle in the AckGate rides that ack: no feedback.lua call of its own."""
    s = make(redis_url, dedupe, crawl, STREAMS_FLUSH_INTERVAL_SECONDS=0.005, STREAMS_FEEDBACK_INTERVAL_SECONDS=0.001)
    try:
        assert s._io is not None
        calls: list[str] = []
        writes = s._io
        feedback = writes.frontier.feedback
        monkeypatch.setattr(writes.frontier, "feedback", lambda site, *a, **k: calls.append(site) or feedback(site, *a, **k))
        sites = [f"a{i}.test" for i in range(6)]
        for site in sites:
            assert s.enqueue_request(scrapy.Request(f"http://{site}/"))
        for _ in sites:
            request = next_request(s)
            # an answer first, then the end of the request, a few I/O cycles apart
            s.answers.on_response_downloaded(HtmlResponse(request.url, status=200, request=request), request, s.spider)
            pump_cycles(s, 2)
            s.request_done(request)
            pump_cycles(s, 3)
        f = Frontier(r, crawl)
        wait_for(lambda: all(f.status(site).pending == 0 for site in sites) and not s._io.gate, timeout=10,
                 what="every site's ack")
        assert all(f.status(site).is_empty for site in sites)
        assert calls == []
    finally:
        s.close("test")


def test_a_site_whose_lease_took_its_last_request_keeps_no_hint(sched: StreamsScheduler) -> None:
    """A lease reply that leaves a site with nothing makes no SiteHint; a site with more queued gets one."""
    assert sched._io is not None
    leasing = sched._io.leasing
    many = 4 * leasing.per_site_cap  # more than one worker may hold of a site
    assert sched.enqueue_request(scrapy.Request("http://one.test/"))
    for i in range(many):
        assert sched.enqueue_request(scrapy.Request(f"http://two.test/{i}"))
    wait_for(lambda: "one.test" in leasing.emptied and "two.test" in leasing.hints, timeout=10,
             what="both sites leased")
    assert "one.test" not in leasing.hints and leasing.finished("one.test")
    assert not leasing.finished("two.test")
