"""One I/O cycle at a time (tests/harness.py): what a cycle sends, in which order, and what it decides."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import scrapy

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import GROUP
from streams_sched.worker.ops import Ack

from harness import InProcessWorker


@pytest.fixture
def worker(redis_url: str, dedupe: str, crawl: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(redis_url, crawl, dedupe=dedupe)
    yield w
    w.close()


def test_an_ack_goes_out_one_cycle_after_the_follow_ups_it_waits_for(worker: InProcessWorker, r: redis.Redis, crawl: str) -> None:
    """A parent's ack is sent in the cycle after the one whose reply confirmed its child, never in the same pipeline."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://parent.test/"))
    parent = worker.next_request()
    f = Frontier(r, crawl)
    parent_stream = f.site("parent.test").stream("http", "default")
    s.enqueue_request(scrapy.Request("http://child.test/"))
    s.request_done(parent)
    worker.run_cycle()  # sends the child; the ack waits behind it
    assert [type(op) for op in worker.io.gate.behind] == [Ack]
    assert r.xpending(parent_stream, GROUP)["pending"] == 1
    child = f.status("child.test")  # in its stream, or leased by the lease call behind it
    assert child.backlog + child.pending == 1
    worker.run_cycle()  # the child was confirmed: now the ack
    assert not worker.io.gate and r.exists(parent_stream) == 0


def test_a_refused_child_holds_its_parents_ack_for_as_many_cycles_as_it_is_refused(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """While Redis refuses a child's enqueue (WRONGTYPE), every cycle sends it again and its parent's ack stays behind it."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://parent.test/"))
    parent = worker.next_request()
    f = Frontier(r, crawl)
    parent_stream = f.site("parent.test").stream("http", "default")
    child_keys = f.site("child.test")
    r.hset(child_keys.seen, "x", "wrong type")  # the child's enqueue script now fails
    s.enqueue_request(scrapy.Request("http://child.test/"))
    s.request_done(parent)
    for _ in range(3):
        worker.run_cycle()
        assert len(worker.io.gate.unconfirmed) == 1 and [type(op) for op in worker.io.gate.behind] == [Ack]
        assert r.xpending(parent_stream, GROUP)["pending"] == 1
    assert worker.io.trouble.refusals  # counted, logged once
    r.delete(child_keys.seen)
    worker.settle()
    assert r.exists(parent_stream) == 0
    child = f.status("child.test")
    assert child.backlog + child.pending == 1


def test_the_crawl_is_drained_after_two_empty_readings_and_not_while_a_lease_is_held(worker: InProcessWorker) -> None:
    """The drain decision: a held lease keeps the crawl open; after the ack two empty shard readings in a row drain it."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://a.test/only"))
    request = worker.next_request()
    for _ in range(5):
        worker.step()
    assert not worker.exchange.drained and s.has_pending_requests()
    s.request_done(request)
    worker.settle()
    assert s.has_pending_requests()  # one empty reading proves nothing
    worker.until(lambda: worker.exchange.drained, cycles=50, what="drained")
    assert not s.has_pending_requests()
    assert worker.io.drain.detector.last is not None  # drained by two equal empty snapshots


def test_an_enqueue_confirmed_after_drained_reopens_the_crawl_before_it_counts_as_done(worker: InProcessWorker) -> None:
    """New work clears ``drained`` in the cycle whose reply confirmed it, before the reactor can see the enqueue done."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://a.test/1"))
    s.request_done(worker.next_request())
    worker.until(lambda: worker.exchange.drained, cycles=100, what="drained")
    s.enqueue_request(scrapy.Request("http://a.test/2"))
    worker.run_cycle()
    x = worker.exchange
    assert x.enqueues_done == s.counts.enqueued and not x.drained and s.has_pending_requests()


def test_a_lease_reply_is_applied_in_the_cycle_that_asked(worker: InProcessWorker) -> None:
    """The cycle that sends a lease call hands its requests to the reactor: arrivals and the lease book agree at once."""
    s = worker.scheduler
    for i in range(3):
        s.enqueue_request(scrapy.Request(f"http://a.test/{i}"))
    worker.run_cycle()  # the enqueues, and a lease call behind them in the same pipeline
    result = worker.until(lambda: worker.exchange.arrivals and worker.io.leases.total, cycles=20, what="a lease")
    assert result == 3 and len(worker.exchange.arrivals) == 3
