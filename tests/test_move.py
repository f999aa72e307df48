"""streams-sched move in-process: the copy is whole, the marks stop leasing and then every writer, and a failed move leaves the crawl as it was."""

from __future__ import annotations

import socket
from typing import Any

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from scrapy import Request

from streams_sched.connect.clients import connect, redact
from streams_sched.errors import CrawlMoved
from streams_sched.frontier.keys import CrawlKeys
from streams_sched.frontier.moves import MOVED_TO, moved_in_error
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import claim, lease
from streams_sched.frontier.seeding import Seeder
from streams_sched.transfer import move as move_module
from streams_sched.transfer.load import Loader
from streams_sched.transfer.move import Mover
from streams_sched.transfer.records import RequestLine
from streams_sched.wire.codec import RequestCodec

from transfer_helpers import build_crawl, cli, comparable, dump_lines, fresh, frontier_of, records


def _halts(url: str, crawl: str) -> list[Any]:
    f = frontier_of(url, crawl)
    return [f.client.get(s.halt) for s in f.shard_keys()]


def _lease_one(url: str, crawl: str, site: str) -> Any:
    """A worker's lease call for ``site`` (the shard's halt comes back with it)."""
    f = frontier_of(url, crawl)
    n = f.site(site).shard
    return lease.call(f, n, "w-test", [(site, 5, 5, 0)], [1, 1, 1]).run()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _seed(url: str, crawl: str, urls: list[str]) -> None:
    with Seeder(url, crawl) as seeder:
        seeder.seed(urls)


@pytest.mark.cluster
@pytest.mark.targets("bitmap", "cluster")
def test_a_move_copies_the_whole_crawl_and_leaves_the_mark(redis_url: str, redis_source: Any, measured: Any) -> None:
    """`move` to a single Redis or a 3-master cluster copies every request, policy, counter, tracked page, dead letter and seen filter (a dump of the copy equals one of the source), says how long leasing stopped, and leaves the mark: the source refuses leases and enqueues, naming the target without its password."""
    source = fresh(redis_source.url("valkey"))
    build_crawl(source, "mv")
    before = comparable(dump_lines(source, "mv", seen=True))
    result = cli("move", "-c", "mv", "--to", redis_url, "--lease-seconds", "0.5", url=source)
    assert result.exit_code == 0, result.output
    assert comparable(dump_lines(redis_url, "mv", seen=True)) == before
    assert "leasing stopped for" in result.output and "copied as queued" in result.output
    src = frontier_of(source, "mv")
    assert src.client.hget(src.keys.meta, MOVED_TO).decode() == redact(redis_url)
    halted = _lease_one(source, "mv", "big.test")
    assert halted.halt == f"moved:{redact(redis_url)}" and all(not p or not p.entries for p in halted.sites)
    with pytest.raises(ResponseError) as refused:
        src.enqueue("new.test", [Entry(b"n" * 20, 1, 0, RequestCodec(None).encode(Request("http://new.test/")))])
    assert moved_in_error(refused.value) == redact(redis_url)
    # the copy is not halted: its workers lease at once
    assert _lease_one(redis_url, "mv", "small0.test").sites[0].entries
    again = cli("move", "-c", "mv", "--to", redis_url, url=source)
    assert again.exit_code == 1 and "has moved already" in again.output
    seconds = result.output.split("leasing stopped for ", 1)[1].split("s", 1)[0]
    measured(f"{sum(before.values())} lines moved to {'a 3-master cluster' if 'cluster' in redis_url else 'one Redis'}:"
             f" leasing stopped {seconds} s (0.5 s of it the wait for the two leases held)")


def test_while_a_move_copies_nothing_is_leased_or_taken_over_and_what_is_added_goes_with_it(
    plain_redis_url: str, redis_source: Any
) -> None:
    """During the copy the source leases nothing (every site answers as paused) and takes no expired lease over, while a request pushed then still reaches the target; after the seal an enqueue is refused."""
    src_url = plain_redis_url
    dst_url = fresh(redis_source.url("valkey"))
    _seed(src_url, "live", [f"http://a{i}.test/" for i in range(30)])
    f = frontier_of(src_url, "live")
    held = f.lease("a0.test", "w1", 1, [1, 1, 1])
    assert held.entries
    seen: dict[str, Any] = {}

    def during(stage: str, done: int, total: int, n: int) -> None:
        if stage != "copy" or seen:
            return
        reply = _lease_one(src_url, "live", "a1.test")
        seen["halt"] = reply.halt
        seen["leased"] = sum(len(p.entries) for p in reply.sites if p)
        seen["claimed"] = claim.call(f, "a0.test", "w2", 0, 10, 5).run().taken
        _seed(src_url, "live", ["http://late.test/added-during-the-copy"])

    target = connect(dst_url)
    mover = Mover(f, target, redact(dst_url), lease_s=0.2, has_bloom=False, progress=during, poll_s=0.01)
    summary = mover.run()
    assert seen["halt"].startswith("pause:") and seen["leased"] == 0 and seen["claimed"] == 0
    assert summary.leased_sites_at_pause == 1 and summary.dump.leased == 1  # copied as queued
    assert summary.wait_s >= 0.2 and summary.paused_s >= summary.wait_s + summary.copy_s
    urls = {r.url for r in records(dump_lines(dst_url, "live")) if isinstance(r, RequestLine)}
    assert "http://late.test/added-during-the-copy" in urls and len(urls) == 31
    with pytest.raises(CrawlMoved, match=f"moved to {redact(dst_url)}"):
        _seed(src_url, "live", ["http://after.test/"])


def test_the_mark_stops_producers_and_daemons_with_exit_code_6(plain_redis_url: str, redis_source: Any) -> None:
    """After a move, `push` exits 6 with one line naming the new place, a Seeder raises CrawlMoved, and the reclaimer and the monitor leave the moved crawl alone and stop (CrawlMoved) once every crawl they look after has moved."""
    from monitor.core import Monitor
    from monitor.settings import MonitorSettings
    from reclaimer.core import Reclaimer
    from reclaimer.settings import ReclaimerSettings

    src_url = plain_redis_url
    dst_url = fresh(redis_source.url("valkey"))
    _seed(src_url, "gone", ["http://g.test/1"])
    _seed(src_url, "stays", ["http://s.test/1"])
    assert cli("move", "-c", "gone", "--to", dst_url, url=src_url).exit_code == 0
    pushed = cli("push", "-c", "gone", "http://g.test/2", url=src_url)
    assert pushed.exit_code == 6, pushed.output
    lines = [line for line in pushed.output.splitlines() if line.strip()]
    assert len(lines) == 1 and f"moved to {redact(dst_url)}" in lines[0] and f"REDIS_URL={redact(dst_url)}" in lines[0]
    client = connect(src_url)
    every = Reclaimer(ReclaimerSettings(redis_url=src_url, burst=True), client)
    assert [c.crawl for c in every.run_pass().crawls] == ["stays"]  # the moved crawl is left alone
    only = Reclaimer(ReclaimerSettings(redis_url=src_url, crawls=("gone",), burst=True), client)
    with pytest.raises(CrawlMoved, match="gone"):
        only.run_pass()
    watcher = Monitor(MonitorSettings(redis_url=src_url, crawls=("gone",), burst=True), client)
    with pytest.raises(CrawlMoved, match=redact(dst_url)):
        watcher.read()
    assert [s.crawl for s in Monitor(MonitorSettings(redis_url=src_url, burst=True), client).read().snaps] == ["stays"]


def test_a_move_that_cannot_start_or_fails_halfway_leaves_the_crawl_leasing(
    plain_redis_url: str, redis_source: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unreachable target (exit 3), a target that holds the crawl (exit 1), a copy that fails halfway and a Ctrl-C (exit 130) each leave the source unhalted and leasing, say what to do, and a move after a purge of the half copy succeeds."""
    src_url = plain_redis_url
    dst_url = fresh(redis_source.url("valkey"))
    _seed(src_url, "c", [f"http://s{i}.test/p" for i in range(50)])
    unreachable = cli("move", "-c", "c", "--to", f"redis://127.0.0.1:{_free_port()}/0", url=src_url)
    assert unreachable.exit_code == 3, unreachable.output
    _seed(dst_url, "c", ["http://there.test/"])
    held = cli("move", "-c", "c", "--to", dst_url, url=src_url)
    assert held.exit_code == 1 and "already holds a crawl named 'c'" in held.output and "purge" in held.output
    fresh(dst_url)
    assert not any(_halts(src_url, "c"))

    real = Loader.take
    taken = [0]

    def failing(self: Loader, number: int, record: Any) -> None:
        taken[0] += 1
        if taken[0] == 20:
            raise RedisConnectionError("the target went away")
        real(self, number, record)

    monkeypatch.setattr(move_module.Loader, "take", failing)
    failed = cli("move", "-c", "c", "--to", dst_url, url=src_url)
    assert failed.exit_code == 3, failed.output
    assert "goes on in" in failed.output and f"streams-sched purge -c c --redis-url {redact(dst_url)}" in failed.output
    assert not any(_halts(src_url, "c")) and _lease_one(src_url, "c", "s1.test").sites[0].entries

    def interrupted(self: Loader, number: int, record: Any) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(move_module.Loader, "take", interrupted)
    stopped = cli("move", "-c", "c", "--to", fresh(dst_url), "--lease-seconds", "0.2", url=src_url)
    assert stopped.exit_code == 130 and "interrupted" in stopped.output, stopped.output
    assert not any(_halts(src_url, "c"))
    monkeypatch.setattr(move_module.Loader, "take", real)
    fresh(dst_url)
    done = cli("move", "-c", "c", "--to", dst_url, "--lease-seconds", "0.2", url=src_url)
    assert done.exit_code == 0, done.output
    assert connect(dst_url).sismember(CrawlKeys.registry(), "c")


def test_a_worker_leases_nothing_while_a_move_copies_and_stops_handing_out_once_it_has_moved(
    plain_redis_url: str,
) -> None:
    """An in-process worker: while the shards say pause it leases nothing more but acks what it holds; once they say moved it hands out nothing, names the new place, and a refused follow-up neither retries nor logs a refusal."""
    from harness import InProcessWorker

    url = plain_redis_url
    _seed(url, "w", [f"http://w{i}.test/p" for i in range(20)])
    worker = InProcessWorker(url, "w", STREAMS_EXIT_ON_MOVE=False)
    try:
        first = worker.next_request()
        f = frontier_of(url, "w")
        for shard in f.shard_keys():
            f.client.set(shard.halt, "pause:test")
        worker.scheduler.request_done(first)
        for _ in range(worker.io.leases.total - 1):  # what it holds is crawled and acked
            worker.scheduler.request_done(worker.next_request())
        worker.settle()
        for _ in range(5):
            worker.step()
        assert worker.io.leases.total == 0 and worker.exchange.moved is None  # nothing new leased
        for shard in f.shard_keys():
            f.client.set(shard.halt, "moved:redis://new-redis:6379/0")
        worker.until(lambda: worker.exchange.moved, what="the worker to read the mark")
        assert worker.exchange.moved == "redis://new-redis:6379/0"
        assert worker.scheduler.next_request() is None and worker.scheduler.has_pending_requests()
        worker.scheduler.enqueue_request(Request("http://follow.test/up"))
        for _ in range(3):
            worker.step()
        assert not worker.io.trouble.refusals.counts
    finally:
        worker.close()
