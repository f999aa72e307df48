"""The spider zoo: every kind of Scrapy spider crawls the zoo's local site (tests/zoo/) once
with Scrapy's in-memory scheduler and once through streams-sched, and gives the same items.

The zoo's spiders run side by side in one process per way of crawling (memory, and through
streams-sched on bitmap, redisbloom and a local 3-master Redis Cluster), each once per module;
the tests then compare spider by spider.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streams_sched.connect.clients import connect

from helpers import Worker, frontier, wait_for
from zoo.harness import (
    Batch,
    describe_difference,
    read_records,
    run_batch,
    scrapy_crawl,
    streams_settings,
    zoo_settings,
)
from zoo.site import ZooSite
from zoo.spiders import ZOO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: spiders whose every request can travel through the shared queue
TRAVELLING = sorted(set(ZOO) - {"zoo_local"})
#: how many items each spider gives on the zoo's default site (so an empty crawl cannot pass)
EXPECTED_COUNTS = {
    "zoo_crawl": 25, "zoo_sitemap": 17, "zoo_xmlfeed": 6, "zoo_csvfeed": 6, "zoo_item_meta": 12,
    "zoo_dataclass": 4, "zoo_typed_meta": 3, "zoo_login": 5, "zoo_json": 18, "zoo_redirect": 3,
    "zoo_retry": 3, "zoo_playwright_meta": 3, "zoo_local": 4,
}


def flushed(url: str) -> str:
    client = connect(url)
    client.flushall()
    client.close()
    return url


class ZooRuns:
    """Each way of crawling the whole zoo, run once, on first use."""

    def __init__(self, site: ZooSite, redis_source: Any, tmp: Path) -> None:
        self.site = site
        self.redis_source = redis_source
        self.tmp = tmp
        self.batches: dict[str, Batch] = {}
        self.dead_letters: dict[str, dict[str, list[str]]] = {}

    def get(self, way: str) -> Batch:
        if way not in self.batches:
            self.site.web.reset()
            extra: dict[str, Any] = {}
            if way != "memory":
                url = flushed(self.redis_source.cluster_url() if way == "cluster" else self.redis_source.url(way))
                extra = streams_settings(url, "auto" if way == "cluster" else way)
            batch = run_batch(zoo_settings(self.site.web, self.tmp / way, **extra), sorted(ZOO), self.tmp / way)
            assert batch.returncode == 0, batch.log_text()[-5000:]
            if way != "memory":
                self.dead_letters[way] = {
                    name: [
                        letter["reason"].decode()
                        for f in [frontier(url, name, way)]
                        for site in f.sites()
                        for letter in f.dead_letters(site)
                    ]
                    for name in ZOO
                }
            self.batches[way] = batch
        return self.batches[way]


@pytest.fixture(scope="module")
def zoo_site() -> Iterator[ZooSite]:
    site = ZooSite().start()
    yield site
    site.stop()


@pytest.fixture(scope="module")
def zoo_runs(zoo_site: ZooSite, redis_source: Any, tmp_path_factory: pytest.TempPathFactory) -> ZooRuns:
    return ZooRuns(zoo_site, redis_source, tmp_path_factory.mktemp("zoo"))


def assert_same_items(name: str, memory: Batch, streams: Batch) -> None:
    expected = memory.items(name)
    assert sum(expected.values()) == EXPECTED_COUNTS[name], (name, sorted(expected))
    got = streams.items(name)
    assert got == expected, f"{name}: " + describe_difference(expected, got)


@pytest.mark.parametrize("way", ["bitmap", "redisbloom", "cluster"])
@pytest.mark.parametrize("name", TRAVELLING)
def test_zoo_spider_gives_the_in_memory_items_through_redis(name: str, way: str, zoo_runs: ZooRuns, measured: Any) -> None:
    """The spider gives through streams-sched exactly the items (fields, and the types of what
    travelled in meta and cb_kwargs) it gives with Scrapy's in-memory scheduler, every request
    going through Redis: none kept local, none dead-lettered."""
    memory, streams = zoo_runs.get("memory"), zoo_runs.get(way)
    assert_same_items(name, memory, streams)
    stats = streams.stats(name)
    assert stats["zoo/close_reason"] == "finished"
    assert stats.get("streams/unserializable_local", 0) == 0, stats
    assert stats.get("scheduler/dequeued/redis", 0) > 0 and stats.get("scheduler/dequeued/memory", 0) == 0
    assert zoo_runs.dead_letters[way][name] == []
    if name == TRAVELLING[0]:
        measured(f"{way}: the zoo ({len(ZOO)} spiders) in one process: memory {memory.seconds:.1f}s, streams {streams.seconds:.1f}s")


def test_requests_that_cannot_travel_give_the_in_memory_items(zoo_runs: ZooRuns) -> None:
    """A spider with a lambda callback and a Selector in meta gives the in-memory items through
    streams-sched: those requests are crawled by their worker, the rest travel through Redis."""
    memory, streams = zoo_runs.get("memory"), zoo_runs.get("bitmap")
    assert_same_items("zoo_local", memory, streams)
    stats = streams.stats("zoo_local")
    assert stats["zoo/close_reason"] == "finished"
    assert stats["streams/unserializable_local"] == 3 and stats["scheduler/dequeued/memory"] == 3
    assert stats["scheduler/dequeued/redis"] >= 2  # the start page and the follow-up of the lambda callbacks
    log = streams.log_text()
    assert log.count("Further requests of spider 'zoo_local'") == 2  # one per reason: callback, meta['heading']


@pytest.mark.scrapy_matrix
def test_scrapy_crawl_exits_1_when_requests_cannot_travel_in_error_mode(
    zoo_site: ZooSite, redis_source: Any, tmp_path: Path
) -> None:
    """`scrapy crawl` with STREAMS_UNSERIALIZABLE="error" refuses the requests that cannot travel
    with an ERROR each, crawls the rest, and exits 1; the default ("local") exits 0 with every item."""
    url = flushed(redis_source.url("bitmap"))
    zoo_site.web.reset()
    base = {
        "ZOO_A": zoo_site.web.a, "ZOO_B": zoo_site.web.b, "ZOO_OUT": str(tmp_path / "error"),
        **streams_settings(url, "bitmap", STREAMS_PREFIX="error-mode", STREAMS_UNSERIALIZABLE="error"),
    }
    refused = scrapy_crawl(tmp_path / "project", "zoo_local", base)
    assert refused.returncode == 1, refused.stderr[-4000:]
    assert refused.stderr.count("refused (STREAMS_UNSERIALIZABLE='error'") == 3, refused.stderr[-4000:]
    assert "RequestsRefused: streams-sched refused 3 requests" in refused.stderr
    assert read_records(tmp_path / "error" / "zoo_local.jsonl") == []  # every item came from a refused request
    stats = json.loads((tmp_path / "error" / "zoo_local.stats.json").read_text())
    assert stats["streams/unserializable_refused"] == 3 and stats["scheduler/dequeued/redis"] == 1, stats
    kept = scrapy_crawl(tmp_path / "project", "zoo_local", {**base, "STREAMS_PREFIX": "local-mode", "STREAMS_UNSERIALIZABLE": "local", "ZOO_OUT": str(tmp_path / "local")})
    assert kept.returncode == 0, kept.stderr[-4000:]
    assert len(read_records(tmp_path / "local" / "zoo_local.jsonl")) == EXPECTED_COUNTS["zoo_local"]


@pytest.mark.targets("bitmap")
def test_crawlspider_with_a_worker_sigkilled_mid_crawl_loses_no_page(
    redis_url: str, dedupe: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """A CrawlSpider crawl with two workers, one SIGKILLed mid-crawl and replaced, crawls every
    page the in-memory crawl does; pages crawled twice are at most what the killed worker held."""
    from test_faults import assert_drained, leases_of, no_tracebacks

    site = ZooSite(cats=10, per_page=10, delay_s=0.03).start()
    try:
        memory = run_batch(zoo_settings(site.web, tmp_path / "memory"), ["zoo_crawl"], tmp_path / "memory")
        assert memory.returncode == 0, memory.log_text()[-4000:]
        expected = {json.loads(item)["url"] for item in memory.items("zoo_crawl")}
        assert len(expected) == (10 + 1) * 2 * 10 + 1  # products of A's categories and B's, and the one that fails
        out = tmp_path / "streams"
        settings = zoo_settings(
            site.web, out,
            **streams_settings(redis_url, dedupe, STREAMS_PREFIX=crawl, STREAMS_LEASE_SECONDS=2),
            CONCURRENT_REQUESTS=4, CONCURRENT_REQUESTS_PER_DOMAIN=4,
        )
        spider = "zoo.spiders.ZooCrawlSpider"
        records = out / "zoo_crawl.jsonl"
        workers = {
            node: Worker({**settings, "STREAMS_NODE_ID": node, "RECORD_TAG": node}, tmp_path / f"{node}.log", spider=spider)
            for node in ("w1", "w2")
        }
        try:
            def by(node: str) -> int:
                return sum(1 for r in read_records(records) if r["worker"] == node)

            wait_for(
                lambda: len(read_records(records)) >= len(expected) // 4 and by("w1") >= 5,
                timeout=90, what="a quarter of the crawl, w1 in it",
            )
            workers["w1"].kill()
            held = leases_of(redis_url, crawl, "w1")  # what it held when it died
            crawled_at_kill = len(read_records(records))
            workers["w3"] = Worker({**settings, "STREAMS_NODE_ID": "w3", "RECORD_TAG": "w3"}, tmp_path / "w3.log", spider=spider)
            for node in ("w2", "w3"):
                assert workers[node].wait(120) == 0, workers[node].log()
        finally:
            for w in workers.values():
                w.close()
        seen = Counter(r["item"]["url"] for r in read_records(records))
        missing = expected - set(seen)
        twice = {u: n for u, n in seen.items() if n > 1}
        measured(
            f"killed w1 after {crawled_at_kill}/{len(expected)} pages holding {held} leases;"
            f" crawled {len(seen)}, never crawled {len(missing)}, crawled twice {len(twice)}"
        )
        assert not missing, sorted(missing)[:10]
        assert set(seen) == expected
        assert sum(n - 1 for n in twice.values()) <= held, twice
        memory_items = set(memory.items("zoo_crawl"))
        streams_items = {json.dumps(r["item"], sort_keys=True) for r in read_records(records)}
        assert streams_items == memory_items
        assert_drained(redis_url, crawl)
        no_tracebacks(workers["w2"], workers["w3"])
    finally:
        site.stop()


#: spiders whose site answers a page differently the second time, so a revisit's item differs
REVISITS_DIFFER = {
    "zoo_retry": "its flaky pages answer 503 on their first two fetches, whichever request makes them: a retry's"
                 " copy and the page's revisit share those, so which fetch succeeds, and its retry_times, vary",
}


def urls_of(items: Counter[str]) -> set[Any]:
    return {json.loads(i).get("url") for i in items}


def given(name: str, batch: Batch) -> set[Any]:
    """What a spider's items are compared by: the items, or their URLs (REVISITS_DIFFER)."""
    items = batch.items(name)
    return urls_of(items) if name in REVISITS_DIFFER else set(items)


def test_every_spider_with_every_page_tracked_gives_the_in_memory_items_and_then_gives_them_again(
    zoo_runs: ZooRuns, redis_source: Any, tmp_path: Path, measured: Any
) -> None:
    """Continuous crawling: with STREAMS_REVISIT_EVERY_SECONDS every page of every travelling spider comes back; the distinct items are exactly the in-memory crawl's (REVISITS_DIFFER: their URLs), each spider gives some again, and once `revisits --stop` ends the tracking every crawl drains and exits 0."""
    import threading

    from streams_sched.admin.revisits import stop_tracking

    memory = zoo_runs.get("memory")
    url = flushed(redis_source.url("bitmap"))
    zoo_runs.site.web.reset()
    out = tmp_path / "tracked"
    settings = zoo_settings(zoo_runs.site.web, out, **streams_settings(url, "bitmap", STREAMS_REVISIT_EVERY_SECONDS=1.0,
                                                                        STREAMS_REVISIT_JITTER=0.0))
    done: list[Batch] = []
    runner = threading.Thread(target=lambda: done.append(run_batch(settings, TRAVELLING, out, timeout=300)), daemon=True)
    runner.start()
    records = Batch(out, 0, out / "crawl.log", 0.0)

    def every_item_seen_and_some_again() -> bool:
        return all(given(n, memory) <= given(n, records)
                   and sum(records.items(n).values()) > sum(memory.items(n).values()) for n in TRAVELLING)

    wait_for(every_item_seen_and_some_again, timeout=180,
             what="every spider's in-memory items, and more: its pages visited again")
    client = connect(url)
    for name in TRAVELLING:
        stop_tracking(frontier(url, name, "bitmap"))
    client.close()
    runner.join(240)
    assert done and done[0].returncode == 0, records.log_text()[-5000:]
    revisits = {}
    for name in TRAVELLING:
        expected, got = memory.items(name), records.items(name)
        if name in REVISITS_DIFFER:
            assert urls_of(got) == urls_of(expected), (name, sorted(got))
        else:
            assert set(got) == set(expected), f"{name}: " + describe_difference(Counter(set(expected)), Counter(set(got)))
        revisits[name] = sum(got.values()) - sum(expected.values())
        stats = records.stats(name)
        assert stats["zoo/close_reason"] == "finished", (name, stats)
    measured(f"items given again by revisits, per spider: {revisits}")


#: spiders a move can carry halfway: zoo_login's session cookie lives in its worker's
#: process (Scrapy's cookie jar), so a crawl that goes on in a new process has to log in again
MOVABLE = sorted(set(TRAVELLING) - {"zoo_login"})


def test_the_zoo_dumped_halfway_and_finished_on_a_fresh_cluster_gives_the_in_memory_items(
    redis_source: Any, tmp_path: Path, measured: Any
) -> None:
    """The zoo crawled through one Redis, its worker SIGKILLed halfway, each crawl dumped with its seen filters, loaded into a fresh 3-master cluster and finished there by a new worker: the items are the in-memory crawl's, every page is crawled, and the pages crawled twice are at most those leased at the dump."""
    import subprocess
    import sys

    from streams_sched.transfer.records import RequestLine

    from transfer_helpers import cli, records
    from zoo.harness import env

    site = ZooSite(delay_s=0.02).start()
    try:
        memory = run_batch(zoo_settings(site.web, tmp_path / "memory"), MOVABLE, tmp_path / "memory")
        assert memory.returncode == 0, memory.log_text()[-4000:]
        want = sum(sum(memory.items(n).values()) for n in MOVABLE)
        src = flushed(redis_source.url("bitmap"))
        site.web.reset()
        first = tmp_path / "first"
        first.mkdir()
        settings = zoo_settings(site.web, first, **streams_settings(src, "bitmap"), CONCURRENT_REQUESTS=2)
        with open(first / "crawl.log", "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "zoo.run", json.dumps(settings), *MOVABLE],
                                    stdout=log, stderr=subprocess.STDOUT, env=env(), cwd=first)
        try:
            wait_for(lambda: sum(len(read_records(first / f"{n}.jsonl")) for n in MOVABLE) >= want // 2 or proc.poll(),
                     timeout=120, what="half the zoo's items")
            assert proc.poll() is None, "the crawl ended before it could be stopped halfway"
            proc.kill()
        finally:
            proc.kill()
            proc.wait()
        dst = flushed(redis_source.cluster_url())
        leased: set[str] = set()
        for name in MOVABLE:
            dump = tmp_path / f"{name}.jsonl.gz"
            result = cli("dump", "-c", name, "-o", str(dump), "--seen", url=src)
            assert result.exit_code == 0, result.output
            lines = gzip.decompress(dump.read_bytes()).decode().splitlines()
            leased |= {r.url for r in records(lines) if isinstance(r, RequestLine) and r.lease}
            loaded = cli("load", "-c", name, str(dump), url=dst)
            assert loaded.exit_code == 0, loaded.output
        second = run_batch(
            zoo_settings(site.web, tmp_path / "second", **streams_settings(dst, "auto"),
                         SPIDER_MIDDLEWARES={"zoo.resume.NoStart": 1}),
            MOVABLE, tmp_path / "second",
        )
        assert second.returncode == 0, second.log_text()[-5000:]
        halves = Batch(first, 0, first / "crawl.log", 0.0)
        twice: set[Any] = set()
        for name in MOVABLE:
            got = halves.items(name) + second.items(name)
            expected = memory.items(name)
            assert set(map(_key(name), got)) == set(map(_key(name), expected)), \
                f"{name}: " + describe_difference(expected, got)
            extra = got - expected
            twice |= {json.loads(item).get("url") for item in extra.elements()}
        assert twice <= leased, (twice - leased, leased)
        measured(f"moved after {sum(sum(halves.items(n).values()) for n in MOVABLE)}/{want} items, {len(leased)} leased"
                 f" at the dump, {len(twice)} page(s) crawled twice")
    finally:
        site.stop()


def _key(name: str) -> Any:
    """What a spider's items are compared by: the item, or its URL for spiders whose items
    record how many fetches a page took (REVISITS_DIFFER: a fetch the move repeats counts)."""
    if name in REVISITS_DIFFER:
        return lambda item: json.loads(item).get("url")
    return lambda item: item
