"""A real local HTTP server with several host names, for the politeness tests.

- :class:`PoliteServer` answers every host name on one port (threads, real sockets).
  It logs each request (host, path, server time, status) and answers 429 with
  ``Retry-After`` when a host has served more than ``limit`` pages in the last second
  (measured by the server itself); robots.txt per host is configurable.
- :class:`LoopbackResolver` (Scrapy's DNS_RESOLVER) maps the test host names to 127.0.0.1.
- :class:`PoliteSpider` crawls the URLs in the POLITE_URLS setting and records each page.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import scrapy
from scrapy.resolver import CachingThreadedResolver
from twisted.internet import defer

from streams_sched.demo.serving import Answer, answering_server

#: Host names the resolver sends to 127.0.0.1.
LOOPBACK_SUFFIXES = (".test", ".co.uk")


class LoopbackResolver(CachingThreadedResolver):
    """Resolves the test host names (``*.test``, ``*.co.uk``) to 127.0.0.1."""

    def getHostByName(self, name: str, timeout: Any = ()) -> Any:
        if name.endswith(LOOPBACK_SUFFIXES):
            return defer.succeed("127.0.0.1")
        return super().getHostByName(name, timeout)


class PoliteServer:
    """A threaded HTTP server on 127.0.0.1 that limits each host to ``limit`` pages per second."""

    def __init__(self, limit: float = 0.0, retry_after: int = 1, robots: dict[str, str] | None = None,
                 group: dict[str, str] | None = None, stall: dict[str, float] | None = None) -> None:
        self.limit = limit
        self.retry_after = retry_after
        self.robots = robots or {}
        #: host -> budget name (several hosts sharing one limit); default the host itself
        self.group = group or {}
        #: host -> seconds to wait before answering (to make downloads time out)
        self.stall = stall or {}
        self.log: list[tuple[str, str, float, int]] = []
        self._served: dict[str, deque[float]] = defaultdict(deque)
        self._lock = threading.Lock()

        def get(handler: BaseHTTPRequestHandler) -> Answer:
            host = (handler.headers.get("Host") or "").split(":")[0]
            status, body, headers = self.answer(host, handler.path)
            kind = "text/html" if handler.path != "/robots.txt" else "text/plain"
            return status, {**headers, "Content-Type": kind}, body

        self.httpd = answering_server(get)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> PoliteServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"

    def answer(self, host: str, path: str) -> tuple[int, bytes, dict[str, str]]:
        now = time.monotonic()
        if path == "/robots.txt":
            text = self.robots.get(host)
            with self._lock:
                self.log.append((host, path, now, 200 if text is not None else 404))
            return (200, text.encode(), {}) if text is not None else (404, b"no robots", {})
        if host in self.stall:
            time.sleep(self.stall[host])
        budget = self.group.get(host, host)
        with self._lock:
            served = self._served[budget]
            while served and now - served[0] >= 1.0:
                served.popleft()
            if self.limit > 0 and len(served) >= self.limit:
                self.log.append((host, path, now, 429))
                return 429, b"slow down", {"Retry-After": str(self.retry_after)}
            served.append(now)
            self.log.append((host, path, now, 200))
        return 200, f"<html><body>{host}{path}</body></html>".encode(), {}

    # -- what the server measured -----------------------------------------------

    def pages(self, hosts: tuple[str, ...] | None = None) -> list[tuple[str, str, float, int]]:
        with self._lock:
            return [r for r in self.log if r[1] != "/robots.txt" and (hosts is None or r[0] in hosts)]


def spider_settings(redis_url: str, crawl: str, urls: list[str], record: str, **extra: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
        "REDIS_URL": redis_url,
        "STREAMS_PREFIX": crawl,
        "STREAMS_DEDUPE": "bitmap",
        "STREAMS_IDLE_POLL_SECONDS": 0.2,
        "STREAMS_HEARTBEAT_SECONDS": 0.5,
        "DNS_RESOLVER": "politeweb.LoopbackResolver",
        "POLITE_URLS": urls,
        "RECORD_FILE": record,
        "LOG_LEVEL": "INFO",
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "EXTENSIONS": {"scrapy.extensions.remote_control.RemoteControl": None},
        "RETRY_TIMES": 50,
        "DOWNLOAD_TIMEOUT": 20,
    }
    settings.update(extra)
    return settings


class PoliteSpider(scrapy.Spider):
    """Crawls the POLITE_URLS; records every page it got (one JSON line each)."""

    name = "polite"

    async def start(self) -> Any:
        for url in self.settings.getlist("POLITE_URLS"):
            yield scrapy.Request(url)

    def parse(self, response: Any) -> Iterator[dict[str, Any]]:
        with open(self.settings["RECORD_FILE"], "a") as f:
            f.write(json.dumps({"url": response.url, "status": response.status, "t": time.time()}) + "\n")
        yield {"url": response.url}
