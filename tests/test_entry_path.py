"""Every way into a crawl makes the same entry of a request (frontier/entries.py).

The scheduler's enqueue_request, the Seeder (a Request, and a URL string on its faster
path), ``streams-sched push`` and the scrapy-redis feed each put the request into a crawl
of their own; the entries read back from Redis must be byte for byte the scheduler's, in
the same site and stream, and each must be a duplicate in the scheduler's crawl (the same
fingerprint, so the same dedupe decision).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import scrapy
from click.testing import CliRunner
from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from streams_sched import Seeder
from streams_sched.cli import main
from streams_sched.config import StreamsConfig
from streams_sched.connect.clients import connect
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.entries import entry_for, fingerprint_of, url_entries
from streams_sched.scrapy_redis.feed import FeedMover
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.scheduler import Limits, StreamsScheduler

from helpers import queued, wait_for

URL = "http://a.test/list/p1"
SITE = "a.test"
PRIORITY = 3  # the high band: the band and the stream are compared too


class Digest32:
    """A project's REQUEST_FINGERPRINTER_CLASS with 32-byte fingerprints (hashed to 20)."""

    def fingerprint(self, request: Request) -> bytes:
        return hashlib.sha256(b"tenant-1:" + request.url.encode()).digest()


class Salted:
    """A REQUEST_FINGERPRINTER_CLASS built from the crawler's settings (FINGERPRINT_SALT)."""

    def __init__(self, salt: str) -> None:
        self.salt = salt.encode()

    @classmethod
    def from_crawler(cls, crawler: Any) -> Salted:
        return cls(crawler.settings.get("FINGERPRINT_SALT", ""))

    def fingerprint(self, request: Request) -> bytes:
        return hashlib.sha1(self.salt + b":" + request.url.encode()).digest()


FINGERPRINTERS: dict[str, tuple[Callable[[], Any], str | None]] = {
    "scrapy": (RequestFingerprinter, None),
    "digest32": (Digest32, f"{__name__}.Digest32"),
}


class Spider(scrapy.Spider):
    name = "entry-path"

    def parse_list(self, response: Any) -> None:  # pragma: no cover - never called
        pass

    def _callback(self, response: Any) -> None:  # pragma: no cover - CrawlSpider's own name
        pass


@pytest.fixture(params=sorted(FINGERPRINTERS))
def fingerprinter(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _scheduler(url: str, crawl: str, fingerprinter: Any) -> StreamsScheduler:
    config = StreamsConfig.from_settings(
        {"REDIS_URL": url, "STREAMS_PREFIX": crawl, "STREAMS_IDLE_POLL_SECONDS": 0.1,
         "STREAMS_FLUSH_INTERVAL_SECONDS": 0.005},
        "entry-path",
    )
    s = StreamsScheduler(config, fingerprinter=fingerprinter, limits=Limits(4, 4))
    s.open(Spider())
    return s


@pytest.fixture
def scheduled(plain_redis_url: str, crawl: str, fingerprinter: str) -> Iterator[Callable[[bool, int], bytes]]:
    """Enqueue Request(URL) (its callback the spider's ``_callback``, or none; a priority)
    through a scheduler on ``crawl`` (leasing nothing) and return the entry's payload as
    Redis holds it."""
    s = _scheduler(plain_redis_url, crawl, FINGERPRINTERS[fingerprinter][0]())
    s._io.stop_leasing()  # the entries stay queued, to be read back

    def enqueue(callback: bool, priority: int) -> bytes:
        spider = s.spider
        assert isinstance(spider, Spider)
        request = Request(URL, priority=priority, callback=spider._callback if callback else None)
        assert s.enqueue_request(request)
        return _one_entry(plain_redis_url, crawl, "high" if request.priority else "default")

    yield enqueue
    s.close("test")


def _one_entry(url: str, crawl: str, band: str) -> bytes:
    f = Frontier(connect(url), crawl)
    (payload,) = wait_for(lambda: queued(f, SITE, "http", band), timeout=20, what=f"the entry in {crawl}")
    assert f.status(SITE).backlog == 1  # the only entry of the site
    return payload


def _seeder_request(url: str, crawl: str, fp: Any, callback: bool) -> list[str]:
    request = Request(URL, priority=PRIORITY, callback=Spider()._callback if callback else None)
    with Seeder(url, crawl, fingerprinter=fp) as seeder:
        return seeder.seed([request]).duplicates


def _seeder_url(url: str, crawl: str, fp: Any, callback: bool) -> list[str]:
    with Seeder(url, crawl, fingerprinter=fp) as seeder:
        return seeder.seed([URL], priority=PRIORITY, callback="_callback" if callback else None).duplicates


def _push(url: str, crawl: str, fingerprinter: str, callback: bool, priority: int = PRIORITY) -> str:
    args = ["push", "--redis-url", url, "-c", crawl, "-p", str(priority), URL]
    path = FINGERPRINTERS[fingerprinter][1]
    args += ["--fingerprinter", path] if path else []
    args += ["--callback", "_callback"] if callback else []
    out = CliRunner().invoke(main, args)
    assert out.exit_code == 0, out.output
    return out.output


def _feed(url: str, crawl: str, fp: Any) -> tuple[int, int]:
    client = connect(url)
    f = Frontier(client, crawl, crawl_bloom(client, crawl))
    f.scripts.load()
    key = f"{crawl}:start_urls"
    client.lpush(key, URL)
    moved = FeedMover(f, key, RequestCodec(None), fp, "n1").move()
    return moved.added, moved.duplicates


@pytest.mark.parametrize("callback", [False, True], ids=["no-callback", "private-callback"])
def test_scheduler_seeder_and_push_make_one_entry(
    plain_redis_url: str, crawl: str, fingerprinter: str, callback: bool, scheduled: Callable[[bool, int], bytes]
) -> None:
    """A request with a priority (and CrawlSpider's `_callback`) gives the scheduler's entry through the Seeder (Request and URL), and push."""
    make = FINGERPRINTERS[fingerprinter][0]
    theirs = scheduled(callback, PRIORITY)
    url = plain_redis_url
    runs: dict[str, Callable[[str], Any]] = {
        "seeder-request": lambda c: _seeder_request(url, c, make(), callback),
        "seeder-url": lambda c: _seeder_url(url, c, make(), callback),
        "push": lambda c: _push(url, c, fingerprinter, callback),
    }
    for name, run in runs.items():
        mine = f"{crawl}-{name}"
        run(mine)
        assert _one_entry(url, mine, "high") == theirs, name  # same site, stream and payload
        # the scheduler's crawl has its fingerprint already: a duplicate there
        again = run(crawl)
        assert again == [URL] or "pushed 0 request(s)" in again and "1 duplicate(s)" in again, (name, again)


def test_scheduler_feed_and_push_make_one_entry_of_a_url(
    plain_redis_url: str, crawl: str, fingerprinter: str, scheduled: Callable[[bool, int], bytes]
) -> None:
    """A bare URL gives the scheduler's entry through the scrapy-redis feed and push, and is a duplicate where the scheduler sent it."""
    make = FINGERPRINTERS[fingerprinter][0]
    theirs = scheduled(False, 0)
    url = plain_redis_url
    assert _feed(url, f"{crawl}-feed", make()) == (1, 0)
    assert _one_entry(url, f"{crawl}-feed", "default") == theirs
    assert _feed(url, crawl, make()) == (0, 1)
    _push(url, f"{crawl}-push", fingerprinter, False, priority=0)
    assert _one_entry(url, f"{crawl}-push", "default") == theirs
    assert "1 duplicate(s)" in _push(url, crawl, fingerprinter, False, priority=0)


def test_a_seeded_request_filters_the_same_request_of_a_worker(plain_redis_url: str, crawl: str, fingerprinter: str) -> None:
    """A request seeded first is filtered when a worker's scheduler enqueues it: the Redis filter finds its fingerprint."""
    make = FINGERPRINTERS[fingerprinter][0]
    _seeder_request(plain_redis_url, crawl, make(), True)
    s = _scheduler(plain_redis_url, crawl, make())
    try:
        s._io.stop_leasing()
        assert s.enqueue_request(Request(URL, priority=PRIORITY, callback=s.spider._callback))
        x = s._x
        assert x is not None
        wait_for(lambda: x.enqueues_done >= 1, timeout=20, what="the enqueue confirmed")
        assert Frontier(connect(plain_redis_url), crawl).status(SITE).backlog == 1
    finally:
        s.close("test")


@pytest.mark.parametrize("callback", [None, "_callback", "parse_list"])
@pytest.mark.parametrize("fingerprinter", sorted(FINGERPRINTERS))
def test_the_url_path_gives_the_entry_of_the_request_path(fingerprinter: str, callback: str | None) -> None:
    """url_entries(url) equals entry_for(Request(url)) field by field, or does not apply (a fingerprinter of the project's own)."""
    codec, fp = RequestCodec(None), FINGERPRINTERS[fingerprinter][0]()
    fast = url_entries(codec, fp, priority=PRIORITY, meta={"job": "j1"}, callback=callback)
    if fingerprinter != "scrapy":
        assert fast is None
        return
    assert fast is not None
    for url in (URL, "http://Ex.COM/p?b=2&a=1#f", "http://bücher.de/ü", "http://a.test"):
        slow = entry_for(Request(url, priority=PRIORITY, meta={"job": "j1"}), codec, fp, callback=callback)
        assert fast(url) == slow, url


def test_fingerprints_not_20_bytes_long_are_hashed_to_20() -> None:
    """A 32-byte fingerprint becomes its SHA-1 (20 bytes); dont_filter gives no fingerprint."""
    request = Request(URL)
    assert fingerprint_of(request, Digest32()) == hashlib.sha1(Digest32().fingerprint(request)).digest()
    assert fingerprint_of(request, RequestFingerprinter()) == RequestFingerprinter().fingerprint(request)
    assert fingerprint_of(Request(URL, dont_filter=True), Digest32()) == b""


def test_push_builds_its_fingerprinter_from_the_project_settings(
    plain_redis_url: str, crawl: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """push --fingerprinter builds a from_crawler fingerprinter with the project's settings, so its seeds dedupe as the workers' requests do."""
    (tmp_path / "salted_settings.py").write_text('FINGERPRINT_SALT = "pepper"\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("SCRAPY_SETTINGS_MODULE", "salted_settings")
    out = CliRunner().invoke(main, ["push", "--redis-url", plain_redis_url, "-c", crawl, URL,
                                    "--fingerprinter", f"{__name__}.Salted"])
    assert out.exit_code == 0 and "pushed 1 request(s)" in out.output, out.output
    with Seeder(plain_redis_url, crawl, fingerprinter=Salted("pepper")) as seeder:
        assert seeder.seed([URL]).duplicates == [URL]  # the project's salt: the same fingerprint
    with Seeder(plain_redis_url, crawl, fingerprinter=Salted("")) as seeder:
        assert seeder.seed([URL]).added == [URL]  # without it, another one
