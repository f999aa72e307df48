"""A Scrapy download handler that serves :class:`~.web.SyntheticWeb` without a network.

Settings: ``SYNTH_SITES``, ``SYNTH_PAGES``, ``SYNTH_EXTRA_LINKS``,
``SYNTH_DELAY_SECONDS`` (per response, to slow a crawl down),
``SYNTH_RECORD_FILE`` (one JSON line per download: url, time, pid, task type and
the browser downloads in flight in this process), ``SYNTH_SPECIAL`` (a dict url
-> spec for tests: a status, headers, a delay,
an exception to raise, and ``times``: how many responses use the spec before
the normal page is served).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

from scrapy import Request
from scrapy.http import HtmlResponse, Response
from scrapy.utils.defer import deferred_from_coro

try:
    from scrapy.core.downloader.handlers.base import BaseDownloadHandler

    _DEFERRED_API = False
except ImportError:  # Scrapy 2.13: download_request(request, spider) and close() return Deferreds
    BaseDownloadHandler = object  # type: ignore[assignment,misc]
    _DEFERRED_API = True

from streams_sched.demo.web import SyntheticWeb

__all__ = ["SyntheticHandler"]

#: The download failures SYNTH_SPECIAL's "raise" can name (no lookup by a computed name).
_FAILURES: dict[str, type[Exception]] = {
    e.__name__: e for e in (ConnectionRefusedError, ConnectionResetError, TimeoutError, OSError)
}


def web_from_settings(settings: Any) -> SyntheticWeb:
    return SyntheticWeb(
        sites=settings.getint("SYNTH_SITES", 10),
        pages=settings.getint("SYNTH_PAGES", 2000),
        extra_links=settings.getint("SYNTH_EXTRA_LINKS", 4),
        padding=settings.getint("SYNTH_PADDING", 2000),
    )


class SyntheticHandler(BaseDownloadHandler):
    lazy = False

    def __init__(self, crawler: Any) -> None:
        if not _DEFERRED_API:
            super().__init__(crawler)
        settings = crawler.settings
        self.web = web_from_settings(settings)
        self.delay = settings.getfloat("SYNTH_DELAY_SECONDS", 0.0)
        self.special: dict[str, Any] = dict(settings.getdict("SYNTH_SPECIAL"))
        self.served: dict[str, int] = {}
        record = settings.get("SYNTH_RECORD_FILE")
        self.record_fd = os.open(record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if record else -1
        self.tag = settings.get("RECORD_TAG", "")
        self.browser_inflight = 0

    @classmethod
    def from_crawler(cls, crawler: Any) -> SyntheticHandler:
        return cls(crawler)

    if _DEFERRED_API:

        def download_request(self, request: Request, spider: Any = None) -> Any:
            return deferred_from_coro(self._download(request))

        def close(self) -> Any:
            return deferred_from_coro(self._close())

    else:

        async def download_request(self, request: Request) -> Response:  # type: ignore[misc]
            return await self._download(request)

        async def close(self) -> None:  # type: ignore[misc]
            await self._close()

    async def _download(self, request: Request) -> Response:
        browser = request.meta.get("task_type") == "browser"
        if browser:
            self.browser_inflight += 1
        try:
            if self.record_fd >= 0:
                line = {"url": request.url, "t": time.time(), "pid": os.getpid(), "worker": self.tag,
                        "browser": browser, "browser_inflight": self.browser_inflight}
                os.write(self.record_fd, (json.dumps(line) + "\n").encode())
            return await self._respond(request)
        finally:
            if browser:
                self.browser_inflight -= 1

    async def _respond(self, request: Request) -> Response:
        special = self.special.get(request.url)
        if special is not None:
            n = self.served[request.url] = self.served.get(request.url, 0) + 1
            if n <= special.get("times", 10**9):
                if special.get("delay"):
                    await asyncio.sleep(float(special["delay"]))
                return self._special(request, special)
        if self.delay:
            await asyncio.sleep(self.delay)
        where = self.web.parse(request.url)
        if where is None:
            return HtmlResponse(request.url, status=404, body=b"<html>not found</html>", request=request)
        return HtmlResponse(request.url, status=200, body=self.web.html(*where), request=request, encoding="utf-8")

    async def _close(self) -> None:
        if self.record_fd >= 0:
            os.close(self.record_fd)
            self.record_fd = -1

    def _special(self, request: Request, spec: Any) -> Response:
        """spec: {"status": 302, "headers": {...}, "body": "...", "raise": "ConnectionRefusedError"}"""
        if "status" not in spec and "raise" not in spec:
            where = self.web.parse(request.url)
            if where is not None:
                return HtmlResponse(request.url, body=self.web.html(*where), request=request, encoding="utf-8")
        if "raise" in spec:
            raise _FAILURES[spec["raise"]]("synthetic failure")
        return HtmlResponse(
            request.url,
            status=int(spec.get("status", 200)),
            headers=spec.get("headers") or {},
            body=str(spec.get("body", "<html></html>")).encode(),
            request=request,
            encoding="utf-8",
        )
