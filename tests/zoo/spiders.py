"""The zoo: one ordinary user spider per kind of Scrapy spider, nothing in them knows
about streams-sched. Each records, in its items, the fields it parsed and the values
that travelled with its requests (meta, cb_kwargs), with their types.

The site's base URLs come from the settings ``ZOO_A`` and ``ZOO_B`` (the port is
free-chosen by the test); see ``zoo/site.py`` for the pages.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import scrapy
from scrapy.http import FormRequest, JsonRequest, Response
from scrapy.linkextractors import LinkExtractor
from scrapy.spidermiddlewares.httperror import HttpError
from scrapy.spiders import CrawlSpider, CSVFeedSpider, Rule, SitemapSpider, XMLFeedSpider

__all__ = [
    "ZooCrawlSpider", "ZooSitemapSpider", "ZooXmlFeedSpider", "ZooCsvFeedSpider", "ZooItemMetaSpider",
    "ZooDataclassSpider", "ZooTypedMetaSpider", "ZooLoginSpider", "ZooJsonSpider", "ZooRedirectSpider",
    "ZooRetrySpider", "ZooPlaywrightMetaSpider", "ZooLocalSpider", "ZOO",
]


class ZooUrls:
    """Mixin: the zoo's base URLs from the settings."""

    a = b = ""

    @classmethod
    def from_crawler(cls, crawler: Any, *args: Any, **kwargs: Any) -> Any:
        spider = super().from_crawler(crawler, *args, **kwargs)  # type: ignore[misc]
        spider.a = crawler.settings["ZOO_A"]
        spider.b = crawler.settings["ZOO_B"]
        spider.start_urls = [spider.a + path for path in spider.start_paths]
        return spider

    start_paths: tuple[str, ...] = ()


def product_fields(response: Response) -> dict[str, Any]:
    return {
        "url": response.url,
        "title": response.css("h1::text").get(),
        "price": response.css(".price::text").get(),
    }


def errback_fields(failure: Any) -> dict[str, Any]:
    value = failure.value
    return {
        "url": failure.request.url,
        "error": type(value).__name__,
        "status": value.response.status if isinstance(value, HttpError) else None,
    }


class ZooCrawlSpider(ZooUrls, CrawlSpider):
    """CrawlSpider with rules that use follow, callback, errback, process_links and process_request."""

    name = "zoo_crawl"
    start_paths = ("/",)
    rules = (
        Rule(LinkExtractor(allow=r"/cat/\d+"), follow=True, process_links="drop_tracking"),
        Rule(
            LinkExtractor(allow=r"/product/"),
            callback="parse_product",
            errback="product_failed",
            process_links="drop_tracking",
            process_request="tag_request",
        ),
    )

    def drop_tracking(self, links: list[Any]) -> list[Any]:
        for link in links:
            link.url = urlunsplit(urlsplit(link.url)._replace(query=""))
        return links

    def tag_request(self, request: scrapy.Request, response: Response) -> scrapy.Request:
        request.meta["listed_on"] = response.url
        return request

    def parse_product(self, response: Response) -> Iterator[Any]:
        meta = response.meta
        yield {**product_fields(response), "rule": meta["rule"], "link_text": meta["link_text"], "listed_on": meta["listed_on"]}

    def product_failed(self, failure: Any) -> Iterator[Any]:
        meta = failure.request.meta
        yield {**errback_fields(failure), "rule": meta["rule"], "listed_on": meta["listed_on"]}


class ZooSitemapSpider(ZooUrls, SitemapSpider):
    """SitemapSpider: sitemaps found through robots.txt, a sitemap index (one sitemap gzipped,
    one not followed) and sitemap_rules with two callbacks."""

    name = "zoo_sitemap"
    sitemap_rules = [("/product/", "parse_product"), ("/page/", "parse_page")]
    sitemap_follow = [r"/sitemap_"]

    async def start(self) -> Any:
        self.sitemap_urls = [self.a + "/robots.txt"]
        async for request in super().start():
            yield request

    def parse_product(self, response: Response) -> Iterator[Any]:
        yield {**product_fields(response), "kind": "product"}

    def parse_page(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("h1::text").get(), "kind": "page"}


class ZooXmlFeedSpider(ZooUrls, XMLFeedSpider):
    """XMLFeedSpider over an RSS feed; each node leads to its product page (cb_kwargs)."""

    name = "zoo_xmlfeed"
    start_paths = ("/feed.xml",)
    iterator = "iternodes"
    itertag = "item"

    def parse_node(self, response: Response, selector: Any) -> Any:
        yield scrapy.Request(
            selector.xpath("link/text()").get(),
            callback=self.parse_product,
            cb_kwargs={"feed_title": selector.xpath("title/text()").get(), "feed_price": selector.xpath("price/text()").get()},
        )

    def parse_product(self, response: Response, feed_title: str, feed_price: str) -> Iterator[Any]:
        yield {**product_fields(response), "feed_title": feed_title, "feed_price": feed_price}


class ZooCsvFeedSpider(ZooUrls, CSVFeedSpider):
    """CSVFeedSpider; each row (a dict) travels in meta to its product page."""

    name = "zoo_csvfeed"
    start_paths = ("/feed.csv",)

    def parse_row(self, response: Response, row: dict[str, str]) -> Any:
        yield scrapy.Request(row["url"], callback=self.parse_product, meta={"row": row})

    def parse_product(self, response: Response) -> Iterator[Any]:
        yield {**product_fields(response), "row": response.meta["row"]}


class Product(scrapy.Item):
    url = scrapy.Field()
    name = scrapy.Field()
    price = scrapy.Field()
    category = scrapy.Field()
    listed_on = scrapy.Field()


class ZooItemMetaSpider(ZooUrls, scrapy.Spider):
    """Starts a scrapy.Item on the listing page and finishes it on the product page (meta["item"])."""

    name = "zoo_item_meta"
    start_paths = ("/cat/1", "/cat/3")

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        category = response.css("h1::text").get()
        for href in response.css("a[href*='/product/']::attr(href)").getall():
            item = Product(category=category, listed_on=response.url)
            yield response.follow(href, callback=self.parse_product, meta={"item": item})
        for href in response.css("a[href*='/cat/']::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def parse_product(self, response: Response) -> Iterator[Any]:
        item = response.meta["item"]
        item["url"] = response.url
        item["name"] = response.css("h1::text").get()
        item["price"] = response.css(".price::text").get()
        yield item


@dataclasses.dataclass
class Listing:
    category: str
    position: int
    tags: list[str]


@dataclasses.dataclass
class Offer:
    url: str
    name: str | None
    listing: Listing
    listing_type: str


class ZooDataclassSpider(ZooUrls, scrapy.Spider):
    """Carries a dataclass through cb_kwargs, and yields dataclass items."""

    name = "zoo_dataclass"
    start_paths = ("/cat/2",)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        category = response.css("h1::text").get() or ""
        for n, href in enumerate(response.css("a[href*='/product/2-']::attr(href)").getall()):
            listing = Listing(category=category, position=n, tags=["cat2", f"pos{n}"])
            yield response.follow(href, callback=self.parse_product, errback=self.offer_failed, cb_kwargs={"listing": listing})

    def parse_product(self, response: Response, listing: Listing) -> Iterator[Any]:
        yield Offer(url=response.url, name=response.css("h1::text").get(), listing=listing, listing_type=type(listing).__qualname__)

    def offer_failed(self, failure: Any) -> Iterator[Any]:
        listing = failure.request.cb_kwargs["listing"]
        yield Offer(url=failure.request.url, name=None, listing=listing, listing_type=type(listing).__qualname__)


#: typed values the typed-meta spider sends along (module level: both runs use the same)
TYPED_META: dict[str, Any] = {
    "seen_at": datetime(2026, 1, 2, 3, 4, 5, 600000, tzinfo=UTC),
    "local_time": datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone(timedelta(hours=2))),
    "naive": datetime(2026, 1, 2, 3, 4, 5),
    "day": date(2026, 1, 2),
    "price": Decimal("19.99"),
    "dims": (3, 4, 5),
    "nested": {"pair": (1, "a"), "prices": [Decimal("1.50"), Decimal("-0")], "when": (date(2025, 12, 31),)},
}


class ZooTypedMetaSpider(ZooUrls, scrapy.Spider):
    """datetime (aware and naive), date, Decimal and tuples (nested too) in meta."""

    name = "zoo_typed_meta"
    start_paths = ("/cat/3",)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        for n, href in enumerate(response.css("a[href*='/product/']::attr(href)").getall()):
            meta = {**TYPED_META, "position": (n, href)}
            yield response.follow(href, callback=self.parse_product, meta=meta)

    def parse_product(self, response: Response) -> Iterator[Any]:
        meta = {k: response.meta[k] for k in (*TYPED_META, "position")}
        yield {**product_fields(response), "meta": meta}


class ZooLoginSpider(ZooUrls, scrapy.Spider):
    """Logs in with FormRequest.from_response (hidden CSRF field), then crawls pages that need
    the session cookie."""

    name = "zoo_login"
    start_paths = ("/login",)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield FormRequest.from_response(
            response, formdata={"username": "zoo", "password": "secret"}, callback=self.after_login
        )

    def after_login(self, response: Response) -> Iterator[Any]:
        title = response.css("h1::text").get() or ""
        if not title.startswith("Welcome"):
            yield {"url": response.url, "error": "login failed", "title": title}
            return
        yield {"url": response.url, "title": title, "redirect_urls": response.meta.get("redirect_urls")}
        for href in response.css("a[href*='/orders/']::attr(href)").getall():
            yield response.follow(href, callback=self.parse_order)

    def parse_order(self, response: Response) -> Iterator[Any]:
        yield {
            "url": response.url,
            "order": response.css("h1::text").get(),
            "total": response.css(".total::text").get(),
            "user": response.css(".user::text").get(),
        }


class ZooJsonSpider(ZooUrls, scrapy.Spider):
    """Pages through a JSON API with JsonRequest (POST with a JSON body)."""

    name = "zoo_json"

    async def start(self) -> Any:
        for q in ("lamp", "desk"):
            yield JsonRequest(f"{self.a}/api/search", data={"q": q, "page": 1}, callback=self.parse_api)

    def parse_api(self, response: Response) -> Iterator[Any]:
        data = response.json()
        for result in data["results"]:
            yield {"url": response.url, "query": data["query"], "page": data["page"], **result,
                   "request_class": type(response.request).__name__ if response.request else None}
        if data["next_page"]:
            yield JsonRequest(response.url, data={"q": data["query"], "page": data["next_page"]}, callback=self.parse_api)


class ZooRedirectSpider(ZooUrls, scrapy.Spider):
    """Follows redirects across the two host names (a -> b -> a, and a -> b)."""

    name = "zoo_redirect"
    start_paths = ("/go/1", "/go/2", "/go-b/7")

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        meta = response.meta
        yield {
            "url": response.url,
            "title": response.css("h1::text").get(),
            "redirect_urls": meta.get("redirect_urls"),
            "redirect_times": meta.get("redirect_times"),
            "redirect_reasons": meta.get("redirect_reasons"),
        }


class ZooRetrySpider(ZooUrls, scrapy.Spider):
    """Pages that fail (503) twice then work, and one that never works (retries run out)."""

    name = "zoo_retry"
    start_paths = ("/flaky/1", "/flaky/2", "/flaky/dead")

    async def start(self) -> Any:
        for url in self.start_urls:
            yield scrapy.Request(url, callback=self.parse, errback=self.failed)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("h1::text").get(), "retry_times": response.meta.get("retry_times")}

    def failed(self, failure: Any) -> Iterator[Any]:
        yield {**errback_fields(failure), "retry_times": failure.request.meta.get("retry_times")}


class ZooPlaywrightMetaSpider(ZooUrls, scrapy.Spider):
    """scrapy-playwright's meta keys (PageMethod objects included) on every request. The zoo
    has no browser, so plain HTTP downloads them: what is tested is that they travel."""

    name = "zoo_playwright_meta"
    start_paths = ("/cat/1",)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        from scrapy_playwright.page import PageMethod

        for n, href in enumerate(response.css("a[href*='/product/']::attr(href)").getall()):
            yield response.follow(href, callback=self.parse_product, meta={
                "playwright": True,
                "playwright_include_page": False,
                "playwright_context": f"zoo-{n % 2}",
                "playwright_page_methods": [
                    PageMethod("wait_for_selector", "h1", timeout=1000 + n),
                    PageMethod("evaluate", "window.scrollBy(0, 100)"),
                ],
            })

    def parse_product(self, response: Response) -> Iterator[Any]:
        meta = response.meta
        methods = [(type(pm).__qualname__, pm.method, pm.args, pm.kwargs) for pm in meta["playwright_page_methods"]]
        yield {
            **product_fields(response),
            "playwright": meta["playwright"],
            "include_page": meta["playwright_include_page"],
            "context": meta["playwright_context"],
            "page_methods": methods,
        }


class ZooLocalSpider(ZooUrls, scrapy.Spider):
    """Requests that cannot travel through a shared queue: a lambda callback, a Selector in meta."""

    name = "zoo_local"
    start_paths = ("/cat/1",)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        hrefs = response.css("a[href*='/product/']::attr(href)").getall()
        heading = response.css("h1")[0]
        for href in hrefs[:2]:
            yield response.follow(href, callback=lambda r, via="lambda": self.parse_product(r, via))
        for href in hrefs[2:]:
            yield response.follow(href, callback=self.parse_with_selector, meta={"heading": heading})

    def parse_product(self, response: Response, via: str) -> Iterator[Any]:
        yield {**product_fields(response), "via": via}
        # a follow-up that can travel again
        yield response.follow("/about", callback=self.parse_about, dont_filter=False)

    def parse_with_selector(self, response: Response) -> Iterator[Any]:
        yield {**product_fields(response), "via": "selector", "heading": response.meta["heading"].css("::text").get()}

    def parse_about(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "title": response.css("h1::text").get()}


#: every zoo spider by name
ZOO: dict[str, type[scrapy.Spider]] = {
    cls.name: cls  # type: ignore[misc]
    for cls in (
        ZooCrawlSpider, ZooSitemapSpider, ZooXmlFeedSpider, ZooCsvFeedSpider, ZooItemMetaSpider,
        ZooDataclassSpider, ZooTypedMetaSpider, ZooLoginSpider, ZooJsonSpider, ZooRedirectSpider,
        ZooRetrySpider, ZooPlaywrightMetaSpider, ZooLocalSpider,
    )
}
