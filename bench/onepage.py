"""The web of ``python -m bench sites``: sites of one page each, pages without links.

Site ``i`` is ``http://s{i}.test/``, its one page a few dozen bytes of HTML without a
link, so a crawl of N sites is exactly N pages. :class:`OnePageHandler` serves
it at no cost (no network, no latency) for ``SYNTH_SITES`` sites, and 404 for
anything else; :class:`OnePageSpider` yields one item per page and, with
``SYNTH_SEED``, the N URLs from ``start()`` (Scrapy's in-memory scheduler gets its
seeds that way). The scrapy-redis spider is in :mod:`bench.onepage_redis`.

This module stays today's in a ``KIND@REV`` run (only ``streams_sched`` comes from the
revision), so both sides crawl the same web.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import scrapy
from scrapy import Request
from scrapy.http import HtmlResponse, Response
from scrapy.utils.defer import deferred_from_coro

try:
    from scrapy.core.downloader.handlers.base import BaseDownloadHandler

    _DEFERRED_API = False
except ImportError:  # Scrapy 2.13: download_request(request, spider) and close() return Deferreds
    BaseDownloadHandler = object  # type: ignore[assignment,misc]
    _DEFERRED_API = True

__all__ = ["OnePageHandler", "OnePageSpider", "site_url"]

_URL_RE = re.compile(r"^http://s(\d+)\.test/$")


def site_url(i: int) -> str:
    """The URL of the one page of site ``i``."""
    return f"http://s{i}.test/"


class OnePageHandler(BaseDownloadHandler):
    lazy = False

    def __init__(self, crawler: Any) -> None:
        if not _DEFERRED_API:
            super().__init__(crawler)
        self.sites = crawler.settings.getint("SYNTH_SITES", 10)

    @classmethod
    def from_crawler(cls, crawler: Any) -> OnePageHandler:
        return cls(crawler)

    if _DEFERRED_API:

        def download_request(self, request: Request, spider: Any = None) -> Any:
            return deferred_from_coro(self._respond(request))

        def close(self) -> Any:
            return deferred_from_coro(self._close())

    else:

        async def download_request(self, request: Request) -> Response:  # type: ignore[misc]
            return await self._respond(request)

        async def close(self) -> None:  # type: ignore[misc]
            await self._close()

    async def _respond(self, request: Request) -> Response:
        m = _URL_RE.match(request.url)
        if m is None or int(m.group(1)) >= self.sites:
            return HtmlResponse(request.url, status=404, body=b"<html>not found</html>", request=request)
        body = f"<html><head><title>site {m.group(1)}</title></head><body><p>the only page</p></body></html>"
        return HtmlResponse(request.url, status=200, body=body.encode(), request=request, encoding="utf-8")

    async def _close(self) -> None:
        pass


class OnePageSpider(scrapy.Spider):
    name = "sites"

    async def start(self) -> AsyncIterator[Any]:
        # the other schedulers find their seeds in Redis when the crawl starts
        if self.settings.getbool("SYNTH_SEED", False):
            for i in range(self.settings.getint("SYNTH_SITES", 10)):
                yield Request(site_url(i))

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url}
