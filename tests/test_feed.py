"""scrapy-redis producers feeding a streams-sched crawl through <spider>:start_urls (feed.py)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from scrapy import Spider
from scrapy.utils.request import RequestFingerprinter
from scrapy_redis.spiders import RedisSpider

from streams_sched.connect.clients import connect
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.scrapy_redis.feed import FEED_DLQ_SITE, FeedMover, parse_feed_entry
from streams_sched.scrapy_redis.spiders import adopt_redis_spider, is_redis_spider
from streams_sched.wire.codec import RequestCodec

from helpers import Worker, base_settings, crawl_to_end, read_items, wait_for

ENTRIES = [
    "http://a.test/plain",
    json.dumps({"url": "http://a.test/json", "meta": {"job": "j1"}}),
    json.dumps({"url": "http://a.test/post", "method": "post", "q": "x", "page": "2"}),
    json.dumps({"url": "http://a.test/get", "a": "1"}),
]


class _RS(RedisSpider):  # type: ignore[misc]
    name = "rs"


@pytest.mark.parametrize("raw", ENTRIES)
def test_entries_mean_what_they_mean_to_scrapy_redis(raw: str) -> None:
    """Plain and JSON entries give the url, method, body and meta scrapy-redis 0.9.1's make_request_from_data gives."""
    spider = _RS()
    spider.redis_encoding = "utf-8"
    theirs = spider.make_request_from_data(raw.encode())
    (ours,) = parse_feed_entry(raw.encode())
    assert (ours.url, ours.method, ours.body) == (theirs.url, theirs.method, theirs.body)
    assert {k: v for k, v in ours.meta.items()} == {k: v for k, v in theirs.meta.items()}
    assert not ours.dont_filter  # unlike scrapy-redis, feed entries are deduped


@pytest.mark.parametrize("raw", [b"", b"not a url", b'{"meta": {}}', b"[1, 2]", b'{"url": "http://a.test/", "n": 3}', b"\xff\xfe"])
def test_bad_entries_say_why(raw: bytes) -> None:
    """An entry that is no request raises EntryError with the reason."""
    from streams_sched.errors import EntryError

    with pytest.raises(EntryError):
        parse_feed_entry(raw)


def _mover(client: Any, crawl: str, key: str, kind: str = "list", batch: int = 100) -> FeedMover:
    f = Frontier(client, crawl, crawl_bloom(client, crawl))
    f.scripts.load()
    return FeedMover(f, key, RequestCodec(None), RequestFingerprinter(), "n1", kind=kind, batch=batch)


def _backlog(client: Any, crawl: str, site: str) -> int:
    """Requests queued for ``site``, in its streams or its shard's inbox."""
    return Frontier(client, crawl).status(site).backlog


@pytest.mark.cluster
@pytest.mark.parametrize("kind", ["list", "set", "zset"])
def test_mover_moves_every_entry_and_dead_letters_bad_ones(redis_url: str, crawl: str, kind: str) -> None:
    """A list, set or zset feed is moved whole (deduped); a bad entry goes to the _feed dead-letter stream."""
    client = connect(redis_url)
    key = f"{crawl}-spider:start_urls"
    entries = [f"http://site{i % 3}.test/p/{i}" for i in range(250)] + ["http://site0.test/p/0", "nonsense"]
    if kind == "list":
        client.lpush(key, *entries)
    elif kind == "set":
        client.sadd(key, *entries)
    else:
        client.zadd(key, {e: i for i, e in enumerate(entries)})
    mover = _mover(client, crawl, key, kind)
    total = {"read": 0, "added": 0, "dups": 0, "dead": 0}
    while (result := mover.move()).read:
        total["read"] += result.read
        total["added"] += result.added
        total["dups"] += result.duplicates
        total["dead"] += result.dead
    assert client.exists(key) == 0
    assert total["added"] == 250 and total["dead"] == 1
    assert total["dups"] == (1 if kind == "list" else 0)  # a set/zset holds the repeated URL once
    assert sum(_backlog(client, crawl, f"site{i}.test") for i in range(3)) == 250
    (letter,) = client.xrange(Frontier(client, crawl).site(FEED_DLQ_SITE).dlq)
    assert letter[1][b"r"] == b"nonsense" and b"URL" in letter[1][b"reason"]


def test_mover_that_dies_after_enqueue_loses_nothing_and_adds_nothing_twice(plain_redis_url: str, crawl: str) -> None:
    """Entries stay in the feed until their enqueue is confirmed; moving them again only finds duplicates."""
    client = connect(plain_redis_url)
    key = "spider:start_urls"
    client.lpush(key, *[f"http://a.test/p/{i}" for i in range(10)])
    mover = _mover(client, crawl, key)

    def crash(entries: list[bytes]) -> None:
        raise ConnectionError("worker died before removing")

    mover._remove = crash  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        mover.move()
    assert client.llen(key) == 10 and _backlog(client, crawl, "a.test") == 10
    client.delete(Frontier(client, crawl).keys.feed_lock)  # as if its TTL had passed
    result = _mover(client, crawl, key).move()
    assert (result.added, result.duplicates) == (0, 10)
    assert client.llen(key) == 0 and _backlog(client, crawl, "a.test") == 10


def test_a_held_lock_keeps_a_second_mover_out(plain_redis_url: str, crawl: str) -> None:
    """Only one worker moves the feed at a time; the others leave it alone while the lock lives."""
    client = connect(plain_redis_url)
    client.lpush("k", "http://a.test/1")
    client.set(Frontier(client, crawl).keys.feed_lock, "other", px=10_000)
    result = _mover(client, crawl, "k").move()
    assert (result.read, result.length) == (0, 1) and client.llen("k") == 1


def test_redis_spider_is_adopted() -> None:
    """A RedisSpider's own feed reading is switched off, its redis_key is the feed, and an override of make_request_from_data is kept."""

    class Custom(RedisSpider):  # type: ignore[misc]
        name = "custom"
        redis_key = "custom:urls"

        def make_request_from_data(self, data: bytes) -> Any:
            return super().make_request_from_data(data)

    plain = _RS()
    plain.redis_key = "rs:start_urls"
    assert is_redis_spider(plain) and not is_redis_spider(Spider(name="x"))
    key, reader = adopt_redis_spider(plain, "ignored")
    assert key == "rs:start_urls" and reader is None
    assert plain.fetch_data("rs:start_urls", 10) == []
    custom = Custom()
    key, reader = adopt_redis_spider(custom, "ignored")
    assert key == "custom:urls" and reader is not None
    assert adopt_redis_spider(Spider(name="x"), "x:start_urls") == ("x:start_urls", None)


def _feed_settings(url: str, crawl: str, items: Path, **extra: Any) -> dict[str, Any]:
    return base_settings(url, crawl, "bitmap", items, SYNTH_SITES=3, SYNTH_PAGES=1000, STREAMS_FEED_POLL_SECONDS=0.1, **extra)


@pytest.mark.e2e
def test_producer_lpushes_while_two_workers_run(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """Plain and JSON entries LPUSHed into <crawl>:start_urls while two workers run are all crawled, each once, by both."""
    import time

    client = connect(plain_redis_url)
    key = f"{crawl}:start_urls"  # %(name)s is the crawl name (STREAMS_PREFIX; by default the spider's)
    items = tmp_path / "items.jsonl"
    # workers that wait for more work, as scrapy-redis spiders do, so the producer's pace does not matter
    settings = _feed_settings(plain_redis_url, crawl, items, SYNTH_DELAY_SECONDS=0.05, STREAMS_FEED_BATCH=10,
                              STREAMS_CLOSE_ON_DRAIN=False, CONCURRENT_REQUESTS=4)
    workers = [Worker(settings, tmp_path / f"w{n}.log", spider="spiders.FeedSpider") for n in range(2)]
    try:
        nodes_key = Frontier(client, crawl).keys.nodes
        wait_for(lambda: client.hlen(nodes_key) == 2, timeout=60, what="both workers online")
        want: dict[str, dict[str, Any]] = {}
        for i in range(200):
            url = f"http://site{i % 3}.test/p/{i}"
            if i % 4 == 0:
                client.lpush(key, url)
                want[url] = {"method": "GET", "job": None}
            elif i % 4 == 1:
                client.lpush(key, json.dumps({"url": url, "meta": {"job": f"j{i}"}}))
                want[url] = {"method": "GET", "job": f"j{i}"}
            elif i % 4 == 2:
                client.lpush(key, json.dumps({"url": url, "method": "POST", "n": str(i)}))
                want[url] = {"method": "POST", "job": None, "body": f"n={i}"}
            else:
                client.lpush(key, json.dumps({"url": url}), url)  # the same URL twice: crawled once
                want[url] = {"method": "GET", "job": None}
            if i % 10 == 9:
                time.sleep(0.05)  # a producer pushing over time, not all at once
        wait_for(lambda: len(read_items(items)) >= len(want), timeout=120, what="every URL crawled")
        wait_for(lambda: client.llen(key) == 0, timeout=30, what="the feed moved")
        assert all(w.alive() for w in workers)
    finally:
        for w in workers:
            w.close()
    got = read_items(items)
    assert sorted(i["url"] for i in got) == sorted(want)  # every URL, each once
    for item in got:
        w = want[item["url"]]
        assert item["method"] == w["method"] and item["job"] == w["job"]
        if "body" in w:
            assert item["body"] == w["body"]
    per_worker = Counter(i["pid"] for i in got)
    print(f"pages per worker: {sorted(per_worker.values())}")
    assert len(per_worker) == 2, "both workers crawled"


@pytest.mark.slow
@pytest.mark.e2e
def test_worker_sigkilled_while_moving_the_feed_loses_nothing(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A worker SIGKILLed in the middle of moving a 3000-entry feed loses no entry: a second worker crawls every URL."""
    client = connect(plain_redis_url)
    key = f"{crawl}:start_urls"
    urls = [f"http://site{i % 3}.test/p/{i // 3}" for i in range(3000)]
    client.lpush(key, *urls)
    items = tmp_path / "items.jsonl"
    settings = _feed_settings(plain_redis_url, crawl, items, STREAMS_FEED_BATCH=20, STREAMS_LEASE_SECONDS=2, CONCURRENT_REQUESTS=4)
    first = Worker(settings, tmp_path / "w1.log", spider="spiders.FeedSpider")
    try:
        wait_for(lambda: 0 < client.llen(key) < 2700, timeout=60, interval=0.005, what="the move to be under way")
        first.kill()
    finally:
        first.close()
    left = client.llen(key)
    assert 0 < left < 3000, "killed in the middle of the move"
    second = Worker(settings, tmp_path / "w2.log", spider="spiders.FeedSpider")
    crawl_to_end(second, timeout=180)
    got = {i["url"] for i in read_items(items)}
    assert got == set(urls)
    assert client.llen(key) == 0


@pytest.mark.e2e
def test_unchanged_redis_spider_crawls_the_feed(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A spider still subclassing RedisSpider, with only SCHEDULER and REDIS_URL changed, crawls its feed through streams-sched."""
    client = connect(plain_redis_url)
    urls = [f"http://site0.test/p/{i}" for i in range(30)]
    client.lpush("feedspider:start_urls", *urls)
    items = tmp_path / "items.jsonl"
    w = Worker(_feed_settings(plain_redis_url, crawl, items), tmp_path / "w.log", spider="spiders.RedisFeedSpider")
    try:
        wait_for(lambda: len(read_items(items)) == 30, timeout=60, what="30 pages")
        client.lpush("feedspider:start_urls", "http://site0.test/p/99")  # the spider stays open, as under scrapy-redis
        wait_for(lambda: len(read_items(items)) == 31, timeout=60, what="a page pushed later")
        assert "moves its feed feedspider:start_urls instead of the spider" in w.log()
    finally:
        w.close()
    assert sorted(i["url"] for i in read_items(items)) == sorted(urls + ["http://site0.test/p/99"])


@pytest.mark.e2e
def test_feed_moves_under_the_worker_acl(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A worker whose ACL user has only the worker rules of its crawl moves the feed <crawl>:start_urls, denied nothing."""
    from streams_sched.admin import acl

    from helpers import with_user

    admin = connect(plain_redis_url)
    admin.execute_command("ACL LOG", "RESET")
    acl.setuser(admin, "worker", "pw", "worker", crawl)
    admin.lpush(f"{crawl}:start_urls", *[f"http://site0.test/p/{i}" for i in range(20)], "bad entry")
    items = tmp_path / "items.jsonl"
    try:
        settings = _feed_settings(with_user(plain_redis_url, "worker", "pw"), crawl, items)
        crawl_to_end(Worker(settings, tmp_path / "w.log", spider="spiders.FeedSpider"), timeout=60)
        assert len(read_items(items)) == 20
        assert acl.denials(admin, "worker") == []
        assert admin.xlen(Frontier(admin, crawl).site(FEED_DLQ_SITE).dlq) == 1
    finally:
        acl.deluser(admin, "worker")


@pytest.mark.e2e
def test_a_refused_feed_is_turned_off_and_the_crawl_goes_on(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A feed key of the wrong type (or out of the ACL) is reported once and left alone; the rest of the crawl is crawled."""
    client = connect(plain_redis_url)
    client.set(f"{crawl}:start_urls", "a string, not a list")
    items = tmp_path / "items.jsonl"
    from streams_sched import seed

    seed(client, crawl, [f"http://site0.test/p/{i}" for i in range(5)])
    w = Worker(_feed_settings(plain_redis_url, crawl, items), tmp_path / "w.log", spider="spiders.FeedSpider")
    crawl_to_end(w, timeout=60)
    assert len(read_items(items)) == 5
    assert w.log().count(f"stops moving the feed {crawl}:start_urls") == 1


def test_feed_settings() -> None:
    """STREAMS_FEED_KEY (or REDIS_START_URLS_KEY) names the feed with %(name)s = the crawl; bad values fail naming the setting."""
    from streams_sched.config import StreamsConfig
    from streams_sched.errors import ConfigError

    def cfg(**s: Any) -> StreamsConfig:
        return StreamsConfig.from_settings({"REDIS_URL": "redis://localhost:6379/0", **s}, "books")

    assert cfg().feed_key == "books:start_urls" and cfg().feed_kind == "list"
    assert cfg(STREAMS_PREFIX="books-2").feed_key == "books-2:start_urls"
    assert cfg(STREAMS_FEED_KEY="").feed_key == ""
    assert cfg(REDIS_START_URLS_KEY="q:%(name)s").feed_key == "q:books"
    assert cfg(REDIS_START_URLS_AS_SET=True).feed_kind == "set"
    assert cfg(REDIS_START_URLS_AS_ZSET="1").feed_kind == "zset"
    for bad, setting in (
        ({"STREAMS_FEED_KEY": "%(spider)s:x"}, "STREAMS_FEED_KEY"),
        ({"REDIS_START_URLS_AS_SET": True, "REDIS_START_URLS_AS_ZSET": True}, "REDIS_START_URLS_AS_ZSET"),
        ({"STREAMS_FEED_BATCH": 0}, "STREAMS_FEED_BATCH"),
        ({"STREAMS_FEED_POLL_SECONDS": -1}, "STREAMS_FEED_POLL_SECONDS"),
        ({"REDIS_ENCODING": "klingon"}, "REDIS_ENCODING"),
    ):
        with pytest.raises(ConfigError, match=setting):
            cfg(**bad)
