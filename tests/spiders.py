"""Spiders and a scheduler subclass used by the end-to-end tests (run in worker processes)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import signal
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import scrapy
from scrapy.exceptions import IgnoreRequest
from scrapy.http import Response

from streams_sched.demo.spider import SyntheticSpider
from streams_sched.worker.scheduler import StreamsScheduler


class AckLogScheduler(StreamsScheduler):
    """Writes one line per lease it acks (entry id, url) to ACK_LOG, to count acks per entry."""

    @classmethod
    def from_crawler(cls, crawler: Any) -> AckLogScheduler:
        sched = super().from_crawler(crawler)
        sched.ack_log = crawler.settings.get("ACK_LOG")  # type: ignore[attr-defined]
        return sched  # type: ignore[return-value]

    def request_done(self, request: scrapy.Request) -> None:
        entry = self._leases.get(request)
        if entry is not None and self.ack_log:  # type: ignore[attr-defined]
            line = json.dumps({"id": entry.id.decode(), "stream": entry.stream, "site": entry.site, "url": request.url}) + "\n"
            fd = os.open(self.ack_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND)  # type: ignore[attr-defined]
            os.write(fd, line.encode())
            os.close(fd)
        super().request_done(request)


class IgnoreSomeMiddleware:
    """Downloader middleware raising IgnoreRequest for URLs containing /ignore."""

    def process_request(self, request: scrapy.Request, spider: Any = None) -> None:
        if "/ignore" in request.url:
            raise IgnoreRequest("ignored by test middleware")


class OutcomesSpider(scrapy.Spider):
    """One start request per way a request can end; each must be acked exactly once."""

    name = "outcomes"
    base = "http://site0.test"

    async def start(self) -> Any:
        b = self.base
        yield scrapy.Request(f"{b}/p/1", callback=self.parse_page)  # plain page
        yield scrapy.Request(f"{b}/redirect", callback=self.parse_page)  # 302 -> /p/2
        yield scrapy.Request(f"{b}/p/8", callback=self.parse_page)  # 503 twice, then 200
        yield scrapy.Request(f"{b}/down", callback=self.parse_page, errback=self.on_error)  # error, errback
        yield scrapy.Request(f"{b}/down-noerrback", callback=self.parse_page)  # error, no errback
        yield scrapy.Request(f"{b}/ignore/me", callback=self.parse_page, errback=self.on_error)
        yield scrapy.Request(f"{b}/p/3", callback=self.parse_boom)  # callback raises
        yield scrapy.Request(f"{b}/p/4", callback=self.parse_children)  # yields follow-ups
        yield scrapy.Request(f"{b}/gone", callback=self.parse_page)  # 404, dropped by HttpError

    def parse_page(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "via": "parse_page"}

    def parse_boom(self, response: Response) -> Iterator[Any]:
        raise RuntimeError("callback failed on purpose")

    def parse_children(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "via": "parse_children"}
        for n in (5, 6, 7):
            yield response.follow(f"/p/{n}", callback=self.parse_page)

    def on_error(self, failure: Any) -> Iterator[Any]:
        yield {"url": failure.request.url, "via": "errback", "error": type(failure.value).__name__}


OUTCOME_SPECIAL = {
    "http://site0.test/redirect": {"status": 302, "headers": {"Location": "http://site0.test/p/2"}},
    "http://site0.test/p/8": {"status": 503, "times": 2},
    "http://site0.test/down": {"raise": "ConnectionRefusedError"},
    "http://site0.test/down-noerrback": {"raise": "ConnectionRefusedError"},
    "http://site0.test/gone": {"status": 404},
}


class CrashSpider(SyntheticSpider):
    """Kills its own process (SIGKILL) when it parses a page with /crash in its URL."""

    name = "crash"

    async def start(self) -> Any:
        yield scrapy.Request("http://site0.test/crash", callback=self.parse)
        yield scrapy.Request("http://site0.test/p/1", callback=self.parse_leaf)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        if "/crash" in response.url:
            os.kill(os.getpid(), signal.SIGKILL)
        yield {"url": response.url}

    def parse_leaf(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url}


class SlowRootSpider(SyntheticSpider):
    """Seeds only page 0 of site 0 (which the handler serves slowly): the other worker has
    nothing to do while the first holds it, and must not close."""

    name = "slowroot"

    async def start(self) -> Any:
        yield scrapy.Request("http://site0.test/p/0", callback=self.parse)


class AnnounceMiddleware:
    """Downloader middleware appending each URL whose download starts to ANNOUNCE_FILE,
    so a test can wait until requests are really in progress."""

    def __init__(self, path: str) -> None:
        self.path = path

    @classmethod
    def from_crawler(cls, crawler: Any) -> AnnounceMiddleware:
        return cls(crawler.settings.get("ANNOUNCE_FILE"))

    def process_request(self, request: scrapy.Request, spider: Any = None) -> None:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, (request.url + "\n").encode())
        os.close(fd)


class OversizeSpider(SyntheticSpider):
    """Seeds site 0 plus requests that cannot be enqueued: a body and a meta value over
    STREAMS_MAX_REQUEST_BYTES, and a meta value msgpack cannot encode."""

    name = "oversize"

    async def start(self) -> Any:
        yield scrapy.Request("http://site0.test/p/0", callback=self.parse)
        yield scrapy.Request("http://site0.test/big-body", method="POST", body=b"x" * 5000, callback=self.parse)
        yield scrapy.Request("http://site0.test/big-meta", meta={"blob": "y" * 5000}, callback=self.parse)
        yield scrapy.Request("http://site0.test/obj-meta", meta={"obj": object()}, callback=self.parse)


# -- README guarantees through a real engine (tests/test_guarantees.py) --------------


async def _gate(directory: str, name: str) -> None:
    """Write ``name``-started in ``directory``, then wait until the test creates ``name``-go."""
    import asyncio
    from pathlib import Path

    where = Path(directory)
    (where / f"{name}-started").touch()
    while not (where / f"{name}-go").exists():
        await asyncio.sleep(0.02)


class GatedSpider(scrapy.Spider):
    """One request whose callback, and then the item pipeline (GatedPipeline), each wait
    for the test to open a gate (files in GATE_DIR), so the test can look at Redis while
    Scrapy is still busy with the request."""

    name = "gated"

    async def start(self) -> Any:
        yield scrapy.Request("http://site0.test/p/0", callback=self.parse_gated)

    async def parse_gated(self, response: Response) -> Any:
        await _gate(self.settings.get("GATE_DIR"), "callback")
        yield {"url": response.url}


class GatedPipeline:
    """An item pipeline that waits for the GATE_DIR "pipeline" gate, then records the item."""

    def __init__(self, gate_dir: str) -> None:
        self.gate_dir = gate_dir

    @classmethod
    def from_crawler(cls, crawler: Any) -> GatedPipeline:
        return cls(crawler.settings.get("GATE_DIR"))

    async def process_item(self, item: Any, spider: Any = None) -> Any:
        await _gate(self.gate_dir, "pipeline")
        return item


class RedirectSpider(scrapy.Spider):
    """One request that the site redirects to another site (REDIRECT_SPECIAL)."""

    name = "redirect"

    async def start(self) -> Any:
        yield scrapy.Request("http://site0.test/moved", callback=self.parse_page)

    def parse_page(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url}


REDIRECT_SPECIAL = {
    "http://site0.test/moved": {"status": 301, "headers": {"Location": "http://site1.test/landing"}},
    "http://site1.test/landing": {"body": "<html>landed</html>"},
}


class TaggedRequest(scrapy.Request):
    """A Request subclass a project might define; allowed only through STREAMS_REQUEST_CLASSES."""


class TaggedSpider(SyntheticSpider):
    """Crawls site 0 with TaggedRequest everywhere; each item says which class arrived."""

    name = "tagged"

    async def start(self) -> Any:
        yield TaggedRequest("http://site0.test/p/0", callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url, "class": type(response.request).__name__}
        for href in response.css("a::attr(href)").getall():
            yield TaggedRequest(response.urljoin(href), callback=self.parse)


class DroppedSpider(SyntheticSpider):
    """Seeds site 0 plus requests that cannot travel; records each request_dropped signal
    (one JSON line per request) in DROPPED_FILE."""

    name = "dropped"

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> DroppedSpider:
        spider = super().from_crawler(crawler, *args, **kwargs)
        crawler.signals.connect(spider.on_dropped, signal=scrapy.signals.request_dropped)
        return spider  # type: ignore[return-value]

    def on_dropped(self, request: scrapy.Request, spider: Any = None) -> None:
        fd = os.open(self.settings.get("DROPPED_FILE"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.write(fd, (json.dumps({"url": request.url}) + "\n").encode())
        os.close(fd)

    async def start(self) -> Any:
        yield scrapy.Request("http://site0.test/p/0", callback=self.parse)
        yield scrapy.Request("http://site0.test/obj-meta", meta={"obj": object()}, callback=self.parse)
        yield scrapy.Request("http://site0.test/obj-cookie", cookies={"session": object()}, callback=self.parse)
        yield scrapy.Request("http://site0.test/obj-kwargs", cb_kwargs={"when": object()}, callback=self.parse)


class FeedSpider(scrapy.Spider):
    """Crawls only what it is fed (no link following); one item per page with its method, body and meta."""

    name = "feedspider"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        request = response.request
        assert request is not None
        yield {"url": response.url, "method": request.method, "body": request.body.decode(), "job": request.meta.get("job"), "pid": os.getpid()}


def _redis_feed_spider() -> type[scrapy.Spider]:
    from scrapy_redis.spiders import RedisSpider

    class RedisFeedSpider(RedisSpider):  # type: ignore[misc]
        """An unchanged scrapy-redis spider: only SCHEDULER and REDIS_URL point at streams-sched."""

        name = "feedspider"
        parse = FeedSpider.parse

    return RedisFeedSpider


RedisFeedSpider = _redis_feed_spider()
class PageItem(scrapy.Item):
    """An Item carried in meta by MetaObjectsSpider."""

    url = scrapy.Field()
    n = scrapy.Field()


@dataclasses.dataclass(frozen=True)
class OfferData:
    """A dataclass carried in cb_kwargs by MetaObjectsSpider."""

    price: Decimal
    seen: dt.datetime
    tags: tuple[str, ...]


def _page_number(url: str) -> int:
    tail = url.rstrip("/").rsplit("/", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class MetaObjectsSpider(SyntheticSpider):
    """Follows every link through a private callback, carrying an Item, a datetime, a Decimal,
    a tuple and a set in meta and a dataclass in cb_kwargs, all derived from the target URL; each
    page records what arrived (type names and values), so two crawls can be compared."""

    name = "metaobjects"

    def _follow(self, response: Response) -> Iterator[Any]:
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            n = _page_number(url)
            when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2))) + dt.timedelta(minutes=n)
            yield response.follow(
                url,
                callback=self.__parse_page,
                meta={"page": PageItem(url=url, n=n), "when": when, "price": Decimal(n) / 100,
                      "trail": (n, str(n)), "seen_in": frozenset({n % 3})},
                cb_kwargs={"offer": OfferData(Decimal(n), when.replace(tzinfo=None), ("a", str(n)))},
            )

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url, "arrived": "seed"}
        yield from self._follow(response)

    def __parse_page(self, response: Response, offer: OfferData) -> Iterator[Any]:
        m = response.meta
        arrived = {k: type(m[k]).__name__ for k in ("page", "when", "price", "trail", "seen_in")}
        arrived["offer"] = type(offer).__name__
        arrived["offer.tags"] = type(offer.tags).__name__
        values = [dict(m["page"]), m["when"].isoformat(), str(m["price"]), list(m["trail"]), sorted(m["seen_in"]),
                  str(offer.price), offer.seen.isoformat(), list(offer.tags)]
        yield {"url": response.url, "arrived": json.dumps([arrived, values], sort_keys=True)}
        yield from self._follow(response)


def tracked_page(url: str, one_in: int) -> bool:
    """Whether TrackedSpider tracks ``url``: its page number is a multiple of ``one_in``
    (page 0 of every site, the seeds, always)."""
    return _page_number(url) % max(1, one_in) == 0


class TrackedSpider(SyntheticSpider):
    """The synthetic crawl with a share of its pages tracked (continuous crawling): a page
    whose number is a multiple of TRACK_ONE_IN (default 1: every page) gets
    ``meta["revisit"] = TRACK_EVERY_SECONDS``, whichever link finds it first, and priority
    TRACK_PRIORITY (default 1, the high band: its revisits are crawled while the first
    pass still has a backlog, not after it). Each item says
    whether it was a revisit (``_rv`` in its meta), so a test counts first visits
    apart. With TRACK_FOLLOW_REVISITS false a revisit yields its item and no link, as a price
    page does: the crawl's steady state then sends acks and no enqueue."""

    name = "tracked"

    def _tracking(self, url: str) -> dict[str, Any]:
        """The arguments of a request for ``url``: meta and priority if it is tracked."""
        if not tracked_page(url, self.settings.getint("TRACK_ONE_IN", 1)):
            return {}
        return {"meta": {"revisit": self.settings.getfloat("TRACK_EVERY_SECONDS", 3.0)},
                "priority": self.settings.getint("TRACK_PRIORITY", 1)}

    async def start(self) -> Any:
        async for request in super().start():
            yield request.replace(**self._tracking(request.url))

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        revisit = "_rv" in response.meta
        yield {"url": response.url, "status": response.status, "revisit": revisit}
        if revisit and not self.settings.getbool("TRACK_FOLLOW_REVISITS", True):
            return
        for href in response.css("a::attr(href)").getall():
            url = response.urljoin(href)
            yield response.follow(url, callback=self.parse, **self._tracking(url))


class ConditionalSpider(scrapy.Spider):
    """Tracks the URLs of COND_URLS (adaptive, every COND_EVERY_SECONDS) and yields one item
    per answer its callback gets, with the answer's status."""

    name = "conditional"

    async def start(self) -> Any:
        every = self.settings.getfloat("COND_EVERY_SECONDS", 0.3)
        for url in self.settings.getlist("COND_URLS"):
            yield scrapy.Request(url, meta={"revisit": {"every": every, "adaptive": True, "min": every, "max": every}})

    def parse(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "status": response.status}
