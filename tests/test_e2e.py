"""End-to-end: real Scrapy workers in their own processes against a real Redis."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import redis

from streams_sched.demo.web import SyntheticWeb
from streams_sched.frontier.keys import CrawlKeys

from helpers import (
    Worker,
    base_settings,
    crawl_to_end,
    crawled_urls,
    frontier,
    read_items,
    subscribe_events,
    wait_for,
    wait_heartbeats,
)

pytestmark = [pytest.mark.e2e, pytest.mark.cluster]


def expected(sites: int, pages: int) -> set[str]:
    return SyntheticWeb(sites=sites, pages=pages).all_urls()


def assert_frontier_empty(url: str, crawl: str, dedupe: str) -> None:
    f = frontier(url, crawl, dedupe)
    for site in f.sites():
        st = f.status(site)
        assert (st.backlog, st.pending, st.delayed) == (0, 0, 0), (site, st)
        assert st.stats.get("enqueued", 0) == st.stats.get("acked", 0) + st.stats.get("dead", 0), (site, st.stats)
    # the drain check's view: no shard names a site with work or leases
    assert [c[:3] for c in f.shard_counts()] == [(0, 0, 0)] * f.shards


@pytest.mark.scrapy_matrix
@pytest.mark.targets("bitmap", "cluster", "valkey")  # RedisBloom dedupe runs on the cluster
def test_one_worker_crawls_every_page_once_and_closes(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """A single worker crawls the whole synthetic web exactly once, drains the frontier and exits."""
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(redis_url, crawl, dedupe, items, SYNTH_SEED=True), tmp_path / "w.log")
    crawl_to_end(w)
    seen = crawled_urls(items)
    assert set(seen) == expected(3, 100)
    assert max(seen.values()) == 1
    assert_frontier_empty(redis_url, crawl, dedupe)
    assert f"crawl {crawl} is drained" in w.log()


# Not in the Scrapy matrix: a killed worker's leases come back through Redis, not the engine.
@pytest.mark.targets("bitmap", "cluster", "valkey")  # nor does the kill depend on the dedupe back-end
def test_killed_worker_is_replaced_and_no_page_is_lost(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """SIGKILL a worker mid-crawl, start another: every page is crawled; repeats stay within the kill's leases."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items,
        SYNTH_SEED=True, SYNTH_PAGES=150, SYNTH_DELAY_SECONDS=0.02,
        STREAMS_LEASE_SECONDS=2, CONCURRENT_REQUESTS=8, CONCURRENT_REQUESTS_PER_DOMAIN=4,
    )
    first = Worker({**settings, "RECORD_TAG": "first"}, tmp_path / "first.log")
    try:
        wait_for(lambda: len(read_items(items)) >= 120, timeout=60, what="the first worker to crawl 120 pages")
        first.kill()
        killed_at = len(read_items(items))
        second = Worker({**settings, "RECORD_TAG": "second"}, tmp_path / "second.log")
        crawl_to_end(second)
    finally:
        first.close()
    seen = crawled_urls(items)
    assert set(seen) == expected(3, 150)
    repeats = sum(n - 1 for n in seen.values())
    # only what the killed worker held (in flight + prefetched: at most 8 + 8) can be crawled twice
    assert repeats <= 16, repeats
    assert killed_at < 450
    assert_frontier_empty(redis_url, crawl, dedupe)
    assert "took over" in second.log()


@pytest.mark.scrapy_matrix
@pytest.mark.targets("bitmap", "cluster", "valkey")  # the drain check does not read the dedupe filters
def test_two_workers_both_close_only_when_drained(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """While one worker holds the only request (slow page 0), the other must not close; both exit at the end."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items,
        SYNTH_SITES=2, SYNTH_PAGES=60, SYNTH_DELAY_SECONDS=0.05,  # slow enough that the idle worker joins in
        SYNTH_SPECIAL={"http://site0.test/p/0": {"delay": 2.0, "times": 1}},
    )
    workers = [
        Worker({**settings, "RECORD_TAG": f"w{i}"}, tmp_path / f"w{i}.log", spider="spiders.SlowRootSpider")
        for i in range(2)
    ]
    try:
        # the moment the first worker is gone, every item must already be in the file
        # (items are written before their request is acked, and acked before drain)
        wait_for(lambda: not all(w.alive() for w in workers), timeout=120, interval=0.01, what="a worker to exit")
        items_at_first_exit = len(read_items(items))
        for w in workers:
            assert w.wait(60) == 0, w.log()
    finally:
        for w in workers:
            w.close()
    all_items = read_items(items)
    assert {i["url"] for i in all_items} == expected(2, 60)
    assert items_at_first_exit == len(all_items), "a worker closed while another still had work"
    assert {i["worker"] for i in all_items} == {"w0", "w1"}  # both took part
    assert_frontier_empty(redis_url, crawl, dedupe)


@pytest.mark.scrapy_matrix
@pytest.mark.targets("bitmap", "cluster", "valkey")  # RedisBloom dedupe runs on the cluster
def test_every_outcome_is_acked_exactly_once(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """Redirect, retry, errback, download error, IgnoreRequest, callback exception, 404: one ack each."""
    from spiders import OUTCOME_SPECIAL

    items = tmp_path / "items.jsonl"
    acks = tmp_path / "acks.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items,
        SCHEDULER="spiders.AckLogScheduler", ACK_LOG=str(acks), SYNTH_SPECIAL=OUTCOME_SPECIAL,
        RETRY_TIMES=3,
        DOWNLOADER_MIDDLEWARES={"spiders.IgnoreSomeMiddleware": 50},
    )
    w = Worker(settings, tmp_path / "w.log", spider="spiders.OutcomesSpider")
    crawl_to_end(w)
    lines = [json.loads(line) for line in acks.read_text().splitlines()]
    per_entry = Counter((line["site"], line["stream"], line["id"]) for line in lines)
    assert max(per_entry.values()) == 1  # no entry acked twice
    acked_urls = Counter(line["url"] for line in lines)
    b = "http://site0.test"
    # the original and its follow-ups: redirect and retries are new entries, each acked once
    assert acked_urls[f"{b}/redirect"] == 1 and acked_urls[f"{b}/p/2"] == 1
    assert acked_urls[f"{b}/p/8"] == 3  # first try + 2 retries (the third answers 200)
    for url in ("/ignore/me", "/p/3", "/p/4", "/p/5", "/p/6", "/p/7", "/gone", "/p/1"):
        assert acked_urls[b + url] == 1, url
    # a connection error is retried 3 times (RETRY_TIMES), each try its own entry, then given up
    assert acked_urls[f"{b}/down"] == 4 and acked_urls[f"{b}/down-noerrback"] == 4
    got = {(i["url"], i.get("via")) for i in read_items(items)}
    assert (f"{b}/down", "errback") in got and (f"{b}/ignore/me", "errback") in got
    assert (f"{b}/p/2", "parse_page") in got and (f"{b}/p/8", "parse_page") in got
    f = frontier(redis_url, crawl, dedupe)
    st = f.status("site0.test")
    assert (st.backlog, st.pending) == (0, 0)
    assert st.stats["acked"] == len(lines) == st.stats["enqueued"]
    assert "callback failed on purpose" in w.log()


@pytest.mark.targets("bitmap", "cluster", "valkey")  # decoding comes after dedupe
def test_garbage_entry_goes_to_dead_letters_and_crawl_goes_on(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """Random bytes and a foreign schema in a stream end in the dead-letter stream with reasons."""
    f = frontier(redis_url, crawl, dedupe)
    keys = f.site("site0.test")
    f.client.xgroup_create(keys.stream("http", "default"), "workers", id="0", mkstream=True)
    f.client.xadd(keys.stream("http", "default"), {"r": b"\xc1\xff not msgpack"})
    f.client.xadd(keys.stream("http", "default"), {"something": "else"})
    # a foreign writer bypasses the scripts that index a site: put it in its shard's ready
    # index, as an operator's repair would, so workers look at it (and the crawl is not drained)
    f.reindex("site0.test")
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(redis_url, crawl, dedupe, items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=30), tmp_path / "w.log")
    crawl_to_end(w)
    letters = f.dead_letters("site0.test")
    reasons = sorted(letter["reason"].decode() for letter in letters)
    assert len(letters) == 2
    assert any("not msgpack" in r for r in reasons) and any("no payload" in r for r in reasons)
    assert set(crawled_urls(items)) == expected(1, 30)


@pytest.mark.targets("bitmap", "cluster", "valkey")  # decoding comes after dedupe
def test_foreign_entries_arriving_mid_crawl_are_dead_lettered_with_reasons(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """Entries written into a stream while a worker crawls (random bytes, no payload, an unknown
    callback, a private attribute as callback, a URL Scrapy rejects, a class outside the
    allowlist, a malformed delayed member) each end in the dead-letter stream with the reason;
    the worker keeps crawling and finishes."""
    import msgpack

    f = frontier(redis_url, crawl, dedupe)
    keys = f.site("site0.test")
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=80, SYNTH_DELAY_SECONDS=0.03,
        CONCURRENT_REQUESTS=4,
    )
    w = Worker(settings, tmp_path / "w.log")
    pack = lambda d: msgpack.packb(d, use_bin_type=True)  # noqa: E731
    foreign = [
        ({"r": b"\xc1\xff not msgpack"}, "not msgpack"),
        ({"something": "else"}, "no payload"),
        ({"r": pack({"u": "http://site0.test/p/1", "c": "no_such_method"})}, "has no attribute 'no_such_method'"),
        ({"r": pack({"u": "http://site0.test/p/2", "c": "__class__"})}, "no dunders"),
        ({"r": pack({"u": "no scheme at all"})}, "Scrapy rejects the request"),
        ({"r": pack({"u": "http://site0.test/p/3", "t": "subprocess.Popen"})}, "is not allowed"),
    ]
    try:
        wait_for(lambda: len(read_items(items)) >= 10, timeout=60, what="the crawl to be under way")
        for fields, _ in foreign:
            f.client.xadd(keys.stream("http", "default"), fields)
        f.client.zadd(keys.delayed, {b"garbage without separators": 0})
        # a foreign writer bypasses the scripts that index a site with work: without this the
        # entries would wait for the site's next enqueue, and none may come once they are in
        f.reindex("site0.test")
        assert w.wait(120) == 0, w.log()
    finally:
        w.close()
    reasons = [letter["reason"].decode() for letter in f.dead_letters("site0.test")]
    assert len(reasons) == len(foreign) + 1, reasons
    for _, why in foreign:
        assert any(why in r for r in reasons), (why, reasons)
    assert any("malformed delayed-queue member" in r for r in reasons)
    assert set(crawled_urls(items)) == expected(1, 80)
    st = f.status("site0.test")  # (the foreign entries were never counted as enqueued)
    assert (st.backlog, st.pending, st.delayed) == (0, 0, 0)


OVERSIZE_SPECIAL = {
    f"http://site0.test/{path}": {"body": "<html>kept local</html>"} for path in ("big-body", "big-meta", "obj-meta")
}


@pytest.mark.targets("bitmap")  # decided in the worker, before Redis
def test_requests_that_cannot_travel_are_crawled_by_their_worker(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """Requests over STREAMS_MAX_REQUEST_BYTES (body or meta) and with unencodable meta are kept
    by the worker and crawled from its memory (STREAMS_UNSERIALIZABLE="local", the default):
    one warning per reason naming the request, counted, and nothing is lost."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items, SYNTH_SITES=1, SYNTH_PAGES=20, STREAMS_MAX_REQUEST_BYTES=2000,
        SYNTH_SPECIAL=OVERSIZE_SPECIAL,
    )
    w = Worker(settings, tmp_path / "w.log", spider="spiders.OversizeSpider")
    crawl_to_end(w)
    log = w.log()
    assert "cannot enqueue <POST http://site0.test/big-body>: size: encoded request is" in log
    assert "over STREAMS_MAX_REQUEST_BYTES=2000" in log
    assert "cannot enqueue <GET http://site0.test/big-meta>: size:" not in log  # one warning per reason
    assert "cannot enqueue <GET http://site0.test/obj-meta>: meta['obj']" in log
    assert log.count("this worker keeps it in memory") == 2
    assert "'streams/oversize': 2" in log and "'streams/unserializable_local': 3" in log
    assert set(crawled_urls(items)) == expected(1, 20) | set(OVERSIZE_SPECIAL)


@pytest.mark.targets("bitmap")
def test_requests_that_cannot_travel_fail_the_crawl_in_error_mode(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """With STREAMS_UNSERIALIZABLE="error" those requests are refused with an ERROR each, counted,
    the rest of the crawl completes, and the worker process exits with code 1."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items, SYNTH_SITES=1, SYNTH_PAGES=20, STREAMS_MAX_REQUEST_BYTES=2000,
        SYNTH_SPECIAL=OVERSIZE_SPECIAL, STREAMS_UNSERIALIZABLE="error",
    )
    w = Worker(settings, tmp_path / "w.log", spider="spiders.OversizeSpider")
    try:
        assert w.wait(120) == 1, w.log()
    finally:
        w.close()
    log = w.log()
    assert log.count("refused (STREAMS_UNSERIALIZABLE='error'") == 3
    assert "'streams/unserializable_refused': 3" in log
    assert "RequestsRefused: streams-sched refused 3 requests" in log
    assert set(crawled_urls(items)) == expected(1, 20)


@pytest.mark.targets("bitmap", "cluster", "valkey")  # dead letters do not touch the dedupe filters
def test_entry_that_kills_every_worker_ends_in_dead_letters(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """A request whose processing kills the worker is retried up to the limit, then dead-lettered."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items, SYNTH_SITES=1, STREAMS_LEASE_SECONDS=1, STREAMS_MAX_DELIVERIES=2,
        SYNTH_SPECIAL={"http://site0.test/crash": {"body": "<html>boom</html>"}},
    )
    codes = []
    for n in range(6):
        w = Worker(settings, tmp_path / f"w{n}.log", spider="spiders.CrashSpider")
        try:
            codes.append(w.wait(60))
        finally:
            w.close()
        if codes[-1] == 0:
            break
    assert codes[:2] == [-9, -9] and codes[-1] == 0, codes
    letters = frontier(redis_url, crawl, dedupe).dead_letters("site0.test")
    assert len(letters) == 1 and b"delivered 3 times" in letters[0]["reason"]
    assert json.loads(Path(tmp_path / "items.jsonl").read_text().splitlines()[0])["url"].endswith("/p/1")


@pytest.mark.targets("bitmap", "cluster", "valkey")  # a retry has no fingerprint: no dedupe
def test_retry_after_waits_in_the_delay_queue(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """A 429 with Retry-After is retried through the site's delay queue, not at once."""
    items = tmp_path / "items.jsonl"
    downloads = tmp_path / "downloads.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=5,
        SYNTH_SPECIAL={"http://site0.test/p/0": {"status": 429, "headers": {"Retry-After": "2"}, "times": 1}},
        SYNTH_RECORD_FILE=str(downloads),
    )
    w = Worker(settings, tmp_path / "w.log")
    crawl_to_end(w)
    # both times are taken by the worker's download handler: the 429, then the retry
    tries = [json.loads(line)["t"] for line in downloads.read_text().splitlines() if json.loads(line)["url"].endswith("/p/0")]
    assert len(tries) == 2, tries
    assert tries[1] - tries[0] >= 2.0 - 0.05, tries
    st = frontier(redis_url, crawl, dedupe).status("site0.test")
    assert st.stats.get("delayed_in") == 1 and st.stats.get("promoted") == 1
    assert set(crawled_urls(items)) == expected(1, 5)


@pytest.mark.targets("bitmap", "cluster", "valkey")  # RedisBloom dedupe runs on the cluster
def test_stopped_worker_keeps_state_and_a_new_one_resumes(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """A worker that stops early deletes nothing; the next one resumes and finishes the crawl."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(redis_url, crawl, dedupe, items, SYNTH_SEED=True)
    w = Worker({**settings, "CLOSESPIDER_ITEMCOUNT": 40}, tmp_path / "a.log")
    crawl_to_end(w)
    first = len(read_items(items))
    assert 40 <= first < 300
    f = frontier(redis_url, crawl, dedupe)
    assert sum(f.status(s).backlog for s in f.sites()) > 0
    assert sum(f.status(s).pending for s in f.sites()) == 0  # unstarted leases were handed back
    w2 = Worker({**settings, "SYNTH_SEED": False}, tmp_path / "b.log")
    crawl_to_end(w2)
    seen = crawled_urls(items)
    assert set(seen) == expected(3, 100)
    assert max(seen.values()) == 1
    assert_frontier_empty(redis_url, crawl, dedupe)


def test_close_on_drain_false_waits_for_new_work(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """With STREAMS_CLOSE_ON_DRAIN=False a drained worker stays up and crawls what is pushed later."""
    from streams_sched import seed

    items = tmp_path / "items.jsonl"
    late = "http://site0.test/late"  # outside the 3 linked pages: crawled only if pushed
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=1, SYNTH_PAGES=3, STREAMS_CLOSE_ON_DRAIN=False,
        SYNTH_SPECIAL={late: {"body": "<html>late</html>"}},
    )
    client = redis.Redis.from_url(plain_redis_url)
    events = subscribe_events(plain_redis_url, crawl)
    w = Worker(settings, tmp_path / "w.log")
    try:
        seed(client, crawl, ["http://site0.test/p/0"])
        wait_for(lambda: len(read_items(items)) == 3, timeout=60, what="3 pages")
        wait_for(lambda: f"crawl {crawl} is drained" in w.log(), timeout=30, what="the worker to see the crawl drained")
        wait_heartbeats(events, 3, w)  # a worker that closes on drain is gone before the third
        seed(client, crawl, [late])
        wait_for(lambda: any(i["url"] == late for i in read_items(items)), timeout=30, what="the pushed page")
        assert w.alive()
    finally:
        w.proc.terminate()
        w.wait(60)
        w.close()


def test_node_events_are_published(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A worker publishes node_online, heartbeats and node_offline on the crawl's channel."""
    client = redis.Redis.from_url(plain_redis_url)
    sub = client.pubsub()
    sub.subscribe(CrawlKeys(crawl).events)
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(plain_redis_url, crawl, "bitmap", items, SYNTH_SEED=True, SYNTH_DELAY_SECONDS=0.01), tmp_path / "w.log")
    crawl_to_end(w)
    events = []
    while (msg := sub.get_message(timeout=0.5)) is not None:
        if msg["type"] == "message":
            events.append(json.loads(msg["data"])["event"])
    assert events[0] == "node_online" and events[-1] == "node_offline" and "heartbeat" in events
    nodes = client.hgetall(CrawlKeys(crawl).nodes)
    assert len(nodes) == 1 and json.loads(next(iter(nodes.values())))["state"] == "offline"


def test_two_crawls_in_one_redis_do_not_touch_each_other(plain_redis_url: str, tmp_path: Path) -> None:
    """Two crawls with different prefixes run side by side in one Redis, each complete."""
    workers = []
    for name in ("crawl-a", "crawl-b"):
        settings = base_settings(plain_redis_url, name, "bitmap", tmp_path / f"{name}.jsonl", SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=50)
        workers.append(Worker(settings, tmp_path / f"{name}.log"))
    crawl_to_end(*workers)
    for name in ("crawl-a", "crawl-b"):
        seen = crawled_urls(tmp_path / f"{name}.jsonl")
        assert set(seen) == expected(2, 50) and max(seen.values()) == 1


@pytest.mark.targets("cluster")
def test_node_events_use_sharded_pubsub_on_a_cluster(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """On Redis Cluster node events go out with SPUBLISH on the crawl's shard; SSUBSCRIBE sees them all."""
    sub = frontier(redis_url, crawl).subscribe_events()
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(redis_url, crawl, dedupe, items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=30), tmp_path / "w.log")
    crawl_to_end(w)
    events = []
    while (msg := sub.get_sharded_message(timeout=0.5)) is not None:
        if msg["type"] == "smessage":
            events.append(json.loads(msg["data"])["event"])
    assert events[0] == "node_online" and events[-1] == "node_offline" and "heartbeat" in events


@pytest.mark.targets("bitmap")  # the codec decides, in the worker
def test_objects_in_meta_and_cb_kwargs_arrive_as_in_memory(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """An Item, an aware datetime, a Decimal, a tuple and a frozenset in meta and a dataclass in
    cb_kwargs, followed through a name-mangled private callback, arrive through the shared queue
    exactly as with Scrapy's in-memory scheduler: the same pages, the same types and values."""
    runs = {}
    for kind, scheduler in (("memory", "scrapy.core.scheduler.Scheduler"), ("streams", "streams_sched.scheduler.StreamsScheduler")):
        items = tmp_path / f"{kind}.jsonl"
        settings = base_settings(redis_url, crawl, dedupe, items, SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=40,
                                 SCHEDULER=scheduler)
        crawl_to_end(Worker(settings, tmp_path / f"{kind}.log", spider="spiders.MetaObjectsSpider"))
        runs[kind] = {(i["url"], i["arrived"]) for i in read_items(items)}
    assert runs["streams"] == runs["memory"]
    arrived = [json.loads(a) for _, a in runs["streams"] if a != "seed"]
    assert len(arrived) > 40
    assert all(a[0] == {"page": "PageItem", "when": "datetime", "price": "Decimal", "trail": "tuple",
                        "seen_in": "frozenset", "offer": "OfferData", "offer.tags": "tuple"} for a in arrived)
    assert "+02:00" in arrived[0][1][1]
    assert_frontier_empty(redis_url, crawl, dedupe)
