"""One I/O cycle at a time (tests/harness.py): what a cycle sends, in which order, and what it decides."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
import scrapy
from harness import InProcessWorker
from scrapy.http import HtmlResponse

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import GROUP
from streams_sched.worker.ops import Ack


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


def test_a_429_with_retry_after_pauses_its_site_for_every_worker_in_the_next_cycle(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """Retry-After routing: the answer delays the retry (meta not_before, Redis time) and the next cycle pauses the site in Redis, not waiting for the feedback interval."""
    s = worker.scheduler
    for i in range(2):
        s.enqueue_request(scrapy.Request(f"http://slow.test/{i}"))
    request = worker.next_request()
    response = HtmlResponse(request.url, status=429, headers={"Retry-After": "30"}, request=request)
    s.answers.on_response_downloaded(response, request, s.spider)
    redis_now = worker.io.frontier.clock.now()
    assert 29 <= request.meta["not_before"] - redis_now <= 31
    worker.run_cycle()
    policy = Frontier(r, crawl).site("slow.test").policy
    until_ms = int(r.hget(policy, "a_until") or 0)
    assert 29_000 <= until_ms - redis_now * 1000 <= 31_000


@pytest.mark.targets("bitmap")  # ACL SETUSER on one server; the refusal path does not depend on the target
def test_a_refused_heartbeat_does_not_hold_up_leases_or_acks(redis_url: str, dedupe: str, crawl: str, r: redis.Redis) -> None:
    """A NOPERM refusal of one command (the heartbeat's PUBLISH) is noted once, and the cycle still enqueues, leases and acks."""
    user = f"nopublish-{crawl}"
    r.acl_setuser(user, enabled=True, passwords=[f"+{user}"], keys=["*"], channels=["*"], commands=["+@all"])
    url = redis_url.replace("redis://", f"redis://{user}:{user}@", 1)
    w = InProcessWorker(url, crawl, dedupe=dedupe)
    # revoked after the start's rights probe passed: as when an operator tightens the ACL
    r.acl_setuser(user, commands=["-publish", "-spublish"])
    try:
        s = w.scheduler
        s.enqueue_request(scrapy.Request("http://a.test/1"))
        request = w.next_request()
        s.request_done(request)
        w.settle()
        refused = [what for what, _ in w.io.trouble.refusals.counts]
        assert refused == ["heartbeat"], refused
        assert Frontier(r, crawl).status("a.test").is_empty
    finally:
        w.close()
        r.acl_deluser(user)


@pytest.mark.targets("bitmap", "redisbloom")  # wraps a plain client's pipeline
def test_a_lost_pipeline_reply_loses_nothing_and_leaves_no_orphan_lease(worker: InProcessWorker, r: redis.Redis, crawl: str) -> None:
    """Redis runs a cycle whose reply is lost: the enqueues are sent again (dedupe drops them) and the leases it granted are handed back, so each request is crawled once."""
    s = worker.scheduler
    for i in range(3):
        s.enqueue_request(scrapy.Request(f"http://lost.test/{i}"))
    client = worker.io.frontier.client
    real_pipeline = client.pipeline

    def losing_pipeline(*args: object, **kwargs: object) -> object:
        pipe = real_pipeline(*args, **kwargs)
        execute = pipe.execute

        def execute_then_lose(*a: object, **k: object) -> object:
            execute(*a, **k)  # Redis ran every command
            raise redis.ConnectionError("reply lost")

        pipe.execute = execute_then_lose
        return pipe

    client.pipeline = losing_pipeline
    worker.run_cycle()  # enqueued and leased in Redis; the worker saw neither
    client.pipeline = real_pipeline
    assert len(worker.io.gate.unconfirmed) == 3 and worker.io.leases.total == 0
    assert worker.crawl(3) == {f"http://lost.test/{i}" for i in range(3)}
    status = Frontier(r, crawl).status("lost.test")
    assert (status.backlog, status.pending) == (0, 0)
    assert (status.stats.get("enqueued"), status.stats.get("acked")) == (3, 3), status.stats


def _move_slot(cluster: redis.RedisCluster, slot: int) -> tuple[str, str]:
    """Move ``slot`` and its keys to another master, as redis-cli --cluster reshard does; return (from, to)."""
    src = cluster.nodes_manager.get_node_from_slot(slot)
    dst = next(n for n in cluster.get_primaries() if n.name != src.name)
    ids = {n.name: cluster.execute_command("CLUSTER MYID", target_nodes=n) for n in (src, dst)}
    ids = {k: v.decode() if isinstance(v, bytes) else v for k, v in ids.items()}
    cluster.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[src.name], target_nodes=dst)
    cluster.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[dst.name], target_nodes=src)
    while True:
        keys = cluster.execute_command("CLUSTER GETKEYSINSLOT", slot, 100, target_nodes=src)
        if not keys:
            break
        cluster.execute_command("MIGRATE", dst.host, dst.port, "", 0, 5000, "KEYS", *keys, target_nodes=src)
    for node in cluster.get_primaries():
        cluster.execute_command("CLUSTER SETSLOT", slot, "NODE", ids[dst.name], target_nodes=node)
    return src.name, dst.name


@pytest.mark.cluster
@pytest.mark.targets("cluster")
def test_a_shard_moved_to_another_master_between_cycles_loses_nothing(worker: InProcessWorker, redis_url: str, crawl: str) -> None:
    """MOVED: the slot of a site's shard moves to another master after its enqueue; the next cycles follow it (lease, ack) and the crawl drains with nothing lost."""
    from streams_sched.connect.clients import connect

    s = worker.scheduler
    for i in range(3):
        s.enqueue_request(scrapy.Request(f"http://moved.test/{i}"))
    worker.run_cycle()  # enqueued (and maybe leased) on the slot's first master
    cluster = connect(redis_url)
    f = worker.io.frontier
    slot = cluster.keyslot(f.site("moved.test").stats)
    before, after = _move_slot(cluster, slot)
    assert before != after
    assert worker.crawl(3) == {f"http://moved.test/{i}" for i in range(3)}
    status = f.status("moved.test")
    assert (status.backlog, status.pending, status.stats.get("acked")) == (0, 0, 3), status
    worker.until(lambda: worker.exchange.drained, cycles=100, what="drained")
    # the worker's client followed the MOVED replies to the slot's new master, refusing nothing
    assert f.client.nodes_manager.get_node_from_slot(slot).name == after and not worker.io.trouble.refusals


@pytest.mark.targets("bitmap")  # CONFIG SET on the one server; the refusal path does not depend on the target
def test_oom_refusals_keep_the_enqueue_and_its_parents_ack_until_redis_has_room(worker: InProcessWorker, r: redis.Redis, crawl: str) -> None:
    """At maxmemory (noeviction), Redis refuses the child's enqueue with OOM: it stays queued with the parent's ack behind it, each cycle tries again, and both go through once there is room."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://parent.test/"))
    parent = worker.next_request()
    s.enqueue_request(scrapy.Request("http://child.test/"))
    s.request_done(parent)
    r.config_set("maxmemory", 1)
    try:
        for _ in range(3):
            worker.run_cycle()
            assert len(worker.io.gate.unconfirmed) == 1 and [type(op) for op in worker.io.gate.behind] == [Ack]
        assert any("OOM" in str(error) for _, error in worker.io.trouble.refusals.counts), worker.io.trouble.refusals.counts
    finally:
        r.config_set("maxmemory", 0)
    worker.settle()
    f = Frontier(r, crawl)
    assert r.exists(f.site("parent.test").stream("http", "default")) == 0  # acked
    child = f.status("child.test")
    assert child.backlog + child.pending == 1
