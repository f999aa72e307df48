"""The demo's browser part: pages whose content only JavaScript writes, crawled with
scrapy-playwright and a system Chromium by a worker with the browser capability.

- :class:`ScriptServer`: ``/`` links to ``/page/N``, whose HTML holds an empty
  ``#app`` and a script that fetches ``/data/N.json`` and writes a token computed
  from it (in no response: a plain download cannot read it);
- :class:`ScriptSpider`: renders each page (``meta["playwright"]``, a
  ``PageMethod`` waiting for the token, ``meta["task_type"] = "browser"``) and
  yields the token it read;
- :func:`find_chromium`, :func:`browser_settings`: the settings a project sets.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any

import scrapy
from scrapy.http import Response

from streams_sched.demo.serving import Answer, answering_server

__all__ = ["ScriptServer", "ScriptSpider", "browser_settings", "find_chromium", "token"]

#: Chromium's flags for a headless worker: no sandbox (it may run as root in a container),
#: no GPU, and no traffic of its own beside the pages it renders
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]


def find_chromium() -> str | None:
    """Debian's /usr/bin/chromium, or a chromium on PATH; None without one (or without scrapy-playwright)."""
    try:
        import scrapy_playwright  # noqa: F401
    except ImportError:
        return None
    if os.access("/usr/bin/chromium", os.X_OK):
        return "/usr/bin/chromium"
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browser_settings(chromium: str) -> dict[str, Any]:
    """What a Scrapy project sets to render with scrapy-playwright and a system Chromium."""
    handler = "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler"
    return {
        "DOWNLOAD_HANDLERS": {"http": handler, "https": handler},
        "PLAYWRIGHT_LAUNCH_OPTIONS": {"executable_path": chromium, "args": CHROMIUM_ARGS},
    }


def token(n: int) -> str:
    """What the script of /page/N writes (from /data/N.json)."""
    return str((n + 3) * 17)


class ScriptServer:
    """``pages`` script-written pages on 127.0.0.1:``port``; each render waits ``delay_s`` for its data."""

    def __init__(self, pages: int, port: int, delay_s: float = 0.3) -> None:
        self.pages = pages
        self.loads: list[tuple[float, str]] = []

        def get(handler: BaseHTTPRequestHandler) -> Answer:
            self.loads.append((time.monotonic(), handler.path))
            status, kind, body = self.answer(handler.path, delay_s)
            return status, {"Content-Type": kind}, body

        self.httpd = answering_server(get, port)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, path: str, delay_s: float) -> tuple[int, str, bytes]:
        html = "text/html; charset=utf-8"
        parts = [p for p in path.split("/") if p]
        if not parts:
            links = "".join(f'<a href="/page/{n}">page {n}</a> ' for n in range(self.pages))
            return 200, html, f"<html><body>{links}</body></html>".encode()
        if parts[0] == "page" and len(parts) == 2 and parts[1].isdigit():
            n = int(parts[1])
            script = (
                f"fetch('/data/{n}.json').then(r => r.json()).then(d => {{ document.getElementById('app').innerHTML ="
                " '<span class=\"token\">' + (d.a * d.b) + '</span>'; });"
            )
            return 200, html, f'<html><body><div id="app"></div><script>{script}</script></body></html>'.encode()
        if parts[0] == "data" and len(parts) == 2 and parts[1].endswith(".json"):
            n = int(parts[1][: -len(".json")])
            time.sleep(delay_s)
            return 200, "application/json", json.dumps({"a": n + 3, "b": 17}).encode()
        return 404, html, b"<html>not found</html>"

    def start(self) -> ScriptServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class ScriptSpider(scrapy.Spider):
    """Renders every page the index links to and yields the token its script wrote."""

    name = "demo_browser"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        from scrapy_playwright.page import PageMethod

        for href in response.css("a::attr(href)").getall():
            yield response.follow(href, callback=self.parse_page, meta={
                "playwright": True,
                "playwright_page_methods": [PageMethod("wait_for_selector", ".token")],
                "task_type": "browser",
            })

    def parse_page(self, response: Response) -> Iterator[Any]:
        yield {"url": response.url, "token": response.css(".token::text").get()}
