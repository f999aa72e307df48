"""A spider that follows every link of the synthetic web and yields one item per page."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import scrapy
from scrapy.http import Response

from streams_sched.demo.handler import web_from_settings

__all__ = ["SyntheticSpider"]


class SyntheticSpider(scrapy.Spider):
    name = "synthetic"

    async def start(self) -> Any:
        # Seeds come from `streams-sched push` unless SYNTH_SEED is set.
        if self.settings.getbool("SYNTH_SEED", False):
            for url in web_from_settings(self.settings).seeds():
                yield scrapy.Request(url, callback=self.parse)

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url, "status": response.status}
        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse)

    def parse_other(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "status": response.status, "via": "parse_other"}

    def errback_record(self, failure: Any) -> Iterator[Any]:
        request = failure.request
        yield {"url": request.url, "status": -1, "via": "errback", "error": type(failure.value).__name__}
