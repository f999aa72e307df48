"""`streams-sched migrate-scrapy-redis`: a half-done scrapy-redis crawl carried over and finished by streams-sched."""

from __future__ import annotations

import json
import pickle
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from scrapy import Request

from streams_sched.cli import main
from streams_sched.connect.clients import connect
from streams_sched.demo.web import SyntheticWeb
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import CrawlKeys
from streams_sched.scrapy_redis.legacy import LEGACY_FIELD, legacy_fingerprint
from streams_sched.scrapy_redis.migrate import request_from_scrapy_redis

from helpers import Worker, base_settings, crawl_to_end
from helpers import queued as queued_payloads

SITES, PAGES = 2, 100


def _downloads(path: Path) -> Counter[str]:
    if not path.exists():
        return Counter()
    return Counter(json.loads(line)["url"] for line in path.read_text().splitlines() if line.endswith("}"))


def _migrate(url: str, *args: str) -> Any:
    return CliRunner().invoke(main, ["migrate-scrapy-redis", "--redis-url", url, "--spider", "synthetic", *args])


@pytest.mark.e2e
@pytest.mark.parametrize("queue_class", ["PriorityQueue", "FifoQueue", "LifoQueue"])
def test_half_done_scrapy_redis_crawl_is_finished_by_streams_sched(plain_redis_url: str, crawl: str, tmp_path: Path, queue_class: str) -> None:
    """A scrapy-redis crawl stopped halfway, migrated with --trust-pickle, is finished by two streams-sched
    workers: every page crawled, none that scrapy-redis crawled crawled again; a second run adds nothing."""
    client = connect(plain_redis_url)
    web = SyntheticWeb(sites=SITES, pages=PAGES)
    before, after = tmp_path / "before.jsonl", tmp_path / "after.jsonl"
    # 1. scrapy-redis crawls until CLOSESPIDER_PAGECOUNT, then stops gracefully (SCHEDULER_PERSIST keeps its keys)
    old = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items-old.jsonl", SYNTH_SITES=SITES, SYNTH_PAGES=PAGES, SYNTH_SEED=True,
        SYNTH_RECORD_FILE=str(before), SCHEDULER="scrapy_redis.scheduler.Scheduler", SCHEDULER_PERSIST=True,
        DUPEFILTER_CLASS="scrapy_redis.dupefilter.RFPDupeFilter", SCHEDULER_QUEUE_CLASS=f"scrapy_redis.queue.{queue_class}",
        CLOSESPIDER_PAGECOUNT=80, CONCURRENT_REQUESTS=4,
    )
    crawl_to_end(Worker(old, tmp_path / "old.log"), timeout=120)
    crawled_before = set(_downloads(before))
    assert 40 <= len(crawled_before) < SITES * PAGES, len(crawled_before)
    queued = client.zcard("synthetic:requests") if queue_class == "PriorityQueue" else client.llen("synthetic:requests")
    assert queued > 0, "scrapy-redis left pending requests"
    # a producer had also pushed start URLs: one page scrapy-redis crawled, one JSON entry, one bad entry
    crawled_page = sorted(crawled_before)[0]
    unseen = next(u for u in sorted(web.all_urls()) if not client.sismember("synthetic:dupefilter", legacy_fingerprint(Request(u))))
    client.lpush("synthetic:start_urls", crawled_page, json.dumps({"url": unseen, "meta": {"job": "x"}}), "not a url")

    # 2. migrate: refused without --trust-pickle, counted by --dry-run, then done
    refused = _migrate(plain_redis_url, "-c", crawl)
    assert refused.exit_code == 2 and "--trust-pickle" in refused.output and "runs" in refused.output
    assert not client.exists(CrawlKeys(crawl).legacy_seen)
    dry = _migrate(plain_redis_url, "-c", crawl, "--dry-run")
    assert dry.exit_code == 0 and f"{queued} pending request(s)" in dry.output and "3 start URL(s)" in dry.output
    assert not client.exists(CrawlKeys(crawl).legacy_seen) and not client.exists(CrawlKeys(crawl).meta)
    done = _migrate(plain_redis_url, "-c", crawl, "--trust-pickle")
    assert done.exit_code == 0, done.output
    assert f"pending requests: {queued} read, {queued} added" in done.output, done.output
    assert "start URLs: 3 read, 1 added, 1 duplicate(s), 1 dead-lettered" in done.output, done.output
    again = _migrate(plain_redis_url, "-c", crawl, "--trust-pickle")
    assert f"pending requests: {queued} read, 0 added, {queued} already there" in again.output, again.output
    assert "start URLs: 3 read, 0 added, 2 duplicate(s), 0 dead-lettered" in again.output, again.output
    assert "0 new in" in again.output
    assert client.hget(CrawlKeys(crawl).meta, LEGACY_FIELD) == CrawlKeys(crawl).legacy_seen.encode()
    assert client.xlen(Frontier(client, crawl).site("_migrate").dlq) == 1

    # 3. two streams-sched workers finish the crawl
    new = base_settings(plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl", SYNTH_SITES=SITES, SYNTH_PAGES=PAGES,
                        SYNTH_RECORD_FILE=str(after), STREAMS_FEED_KEY="")
    crawl_to_end(*[Worker(new, tmp_path / f"w{n}.log") for n in range(2)], timeout=120)
    crawled_after = _downloads(after)
    again_crawled = crawled_before & set(crawled_after)
    print(f"{queue_class}: scrapy-redis crawled {len(crawled_before)}, streams-sched {len(crawled_after)}, both {len(again_crawled)}")
    assert crawled_before | set(crawled_after) == web.all_urls(), "every page crawled"
    assert again_crawled == set(), "no page scrapy-redis crawled is crawled again"
    assert max(crawled_after.values()) == 1
    assert unseen in crawled_after


def test_queue_entries_become_requests_with_callbacks_by_name(plain_redis_url: str) -> None:
    """A pickled scrapy-redis entry gives back url, method, body, meta, priority and the callback's name."""
    from streams_sched.demo.spider import SyntheticSpider

    spider = SyntheticSpider()
    r = Request("http://a.test/x", method="POST", body=b"a=1", meta={"k": [1, 2]}, priority=3, callback=spider.parse_other, errback=spider.errback_record)
    request, cb, eb = request_from_scrapy_redis(pickle.dumps(r.to_dict(spider=spider), protocol=-1))
    assert (request.url, request.method, request.body, request.meta, request.priority) == ("http://a.test/x", "POST", b"a=1", {"k": [1, 2]}, 3)
    assert (cb, eb) == ("parse_other", "errback_record")


def test_nothing_to_migrate_is_said_plainly(plain_redis_url: str, crawl: str) -> None:
    """With no scrapy-redis keys the command reports zero everywhere and creates the crawl."""
    out = _migrate(plain_redis_url, "-c", crawl)
    assert out.exit_code == 0, out.output
    assert "0 start URL(s)" in out.output and "0 pending request(s)" in out.output
    assert crawl in Frontier.crawls(connect(plain_redis_url))


@pytest.mark.cluster
@pytest.mark.targets("cluster")
def test_migrates_from_a_plain_redis_into_a_cluster(redis_url: str, plain_redis_url: str, crawl: str) -> None:
    """--from-redis-url: a scrapy-redis crawl on a plain Redis (all three queue classes' keys, written by
    scrapy-redis itself) is copied into a crawl on Redis Cluster, and a second run adds nothing."""
    from scrapy_redis.dupefilter import RFPDupeFilter
    from scrapy_redis.queue import FifoQueue, LifoQueue, PriorityQueue

    from streams_sched.demo.spider import SyntheticSpider

    source = connect(plain_redis_url)
    spider = SyntheticSpider()
    dupefilter = RFPDupeFilter(source, "synthetic:dupefilter")
    queues = {"synthetic:requests": PriorityQueue, "fifo:requests": FifoQueue, "lifo:requests": LifoQueue}
    for key, cls in queues.items():
        q = cls(source, spider, key)
        for i in range(30):
            r = Request(f"http://site{i % 3}.test/p/{i}?{key}", priority=i % 4 - 1, callback=spider.parse_other, meta={"k": key})
            dupefilter.request_seen(r)
            q.push(r)
    source.lpush("synthetic:start_urls", "http://site0.test/p/99", json.dumps({"url": "http://site1.test/p/99"}))
    client = connect(redis_url)
    for queue_key, queue_class in (("synthetic:requests", "PriorityQueue"), ("fifo:requests", "FifoQueue"), ("lifo:requests", "LifoQueue")):
        args = ["--from-redis-url", plain_redis_url, "-c", crawl, "--trust-pickle", "--queue-key", queue_key, "--queue-class", queue_class]
        out = CliRunner().invoke(main, ["migrate-scrapy-redis", "--redis-url", redis_url, "--spider", "synthetic", *args])
        assert out.exit_code == 0, out.output
        assert "pending requests: 30 read, 30 added" in out.output, out.output
        again = CliRunner().invoke(main, ["migrate-scrapy-redis", "--redis-url", redis_url, "--spider", "synthetic", *args])
        assert "pending requests: 30 read, 0 added, 30 already there" in again.output, again.output
    assert client.scard(CrawlKeys(crawl).legacy_seen) == 90
    f = Frontier(client, crawl)
    assert sum(f.status(f"site{s}.test").backlog for s in range(3)) == 90 + 2
    high = queued_payloads(f, "site1.test", "http", "high")
    codec_spider = SyntheticSpider()
    from streams_sched.wire.codec import RequestCodec

    decoded = [RequestCodec(codec_spider).decode(payload) for payload in high]
    assert decoded and all(r.callback == codec_spider.parse_other and r.priority >= 1 for r in decoded)
