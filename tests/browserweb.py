"""A local site that needs a browser, and one spider that crawls it with scrapy-playwright.

:class:`BrowserServer` serves two host names on one port of 127.0.0.1 (threads,
real sockets): ``127.0.0.1`` has the pages a browser must render and
``localhost`` the plain ones, so each is its own streams-sched site and
Scrapy download slot. Pages:

- ``/`` (either host): links to every page below;
- ``/plain/N`` (localhost): plain HTML;
- ``/js/N``: an empty ``#app``; its script fetches ``/data/N.json`` (answered
  after ``render_delay_s``) and writes a title, a token (a product of two numbers
  in the JSON: it is in no response) and a link to ``/js-only/N``, a plain page no
  raw HTML links to; then it fetches ``/mark/done?page=js-N``;
- ``/frames/N``: an iframe ``#outer`` added late by script, whose document adds
  an iframe ``#inner`` late, whose script writes ``<p class="secret">``; read
  with ``frame_locator``;
- ``/hang/N``: a page whose image never arrives, so it never finishes loading;
- ``/crash/N``: a page whose script allocates without end until its tab runs out
  of memory and crashes (quickly with a small ``--js-flags=--max-old-space-size``).

The server logs every request it answers (:attr:`BrowserServer.log`: server time,
path, User-Agent). Each worker sends its own ``USER_AGENT``, which scrapy-playwright
puts on every request its browser makes too, so the log tells which worker loaded
each page and which browser fetched each resource; a render runs from the page's
request to its ``/mark/done``.

:class:`BrowserSpider` crawls the site from ``BROWSER_SITE`` (the index URL):
plain pages without a browser, the others with ``meta["playwright"]``,
``PageMethod``s and ``meta["task_type"] = "browser"``, the frame pages with
``playwright_include_page`` (the callback reads the frames through the live page,
then asks for the page's raw HTML with that page in meta, for the next callback
to read and close: a request that cannot travel, crawled by its worker).
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import scrapy
from scrapy.http import Response

from streams_sched.demo.serving import Answer, answering_server

CHROMIUM = "/usr/bin/chromium"
#: Chromium's flags for a headless worker: no sandbox (root in a container), no GPU, and
#: no traffic of its own (updates, sync, field trials) beside the pages it renders
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
    "--disable-sync", "--no-first-run", "--disable-quic",
]
#: a small JavaScript heap: the crashing page's tab dies at once, not after gigabytes
SMALL_HEAP = "--js-flags=--max-old-space-size=16"

BROWSER_HOST, PLAIN_HOST = "127.0.0.1", "localhost"


def token(n: int) -> str:
    """What the script of /js/N writes into .token (from /data/N.json; in no response)."""
    return str((n + 7) * 13)


def secret(n: int) -> str:
    """What the inner frame of /frames/N writes into .secret."""
    return f"{n * 31 + 5}-deep"


def chromium_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium; scripts/bootstrap.sh does it as root)"
    try:
        import scrapy_playwright  # noqa: F401
    except ImportError:
        return "scrapy-playwright is not installed (pip install -e '.[test]')"
    return None


def playwright_settings(agent: str, *, nav_timeout_ms: int | None = None, small_heap: bool = False) -> dict[str, Any]:
    """What a Scrapy project sets to crawl with scrapy-playwright and Debian's Chromium."""
    settings: dict[str, Any] = {
        "DOWNLOAD_HANDLERS": {
            "http": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
            "https": "scrapy_playwright.handler.ScrapyPlaywrightDownloadHandler",
        },
        "PLAYWRIGHT_LAUNCH_OPTIONS": {
            "executable_path": CHROMIUM,
            "args": CHROMIUM_ARGS + ([SMALL_HEAP] if small_heap else []),
        },
        "USER_AGENT": agent,
    }
    if nav_timeout_ms is not None:
        settings["PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT"] = nav_timeout_ms
    return settings


# -- the site -------------------------------------------------------------------


def _html(title: str, body: str) -> bytes:
    return f"<html><head><title>{title}</title></head><body>{body}</body></html>".encode()


@dataclass
class BrowserWeb:
    """What the server answers (page counts per kind, delays)."""

    port: int
    plain: int = 4
    js: int = 6
    frames: int = 3
    hang: int = 0
    crash: int = 0
    #: how long /data/N.json takes: a render lasts at least this long
    render_delay_s: float = 0.2
    #: how long a plain page takes
    plain_delay_s: float = 0.0

    def url(self, host: str, path: str) -> str:
        return f"http://{host}:{self.port}{path}"

    @property
    def index(self) -> str:
        return self.url(BROWSER_HOST, "/")

    def links(self) -> list[str]:
        urls = [self.url(PLAIN_HOST, f"/plain/{n}") for n in range(self.plain)]
        for kind in ("js", "frames", "hang", "crash"):
            urls += [self.url(BROWSER_HOST, f"/{kind}/{n}") for n in range(getattr(self, kind))]
        return urls

    def answer(self, path: str, stop: threading.Event) -> tuple[int, str, bytes]:
        html = "text/html; charset=utf-8"
        parts = urlsplit(path)
        bits = [b for b in parts.path.split("/") if b]
        n = int(bits[-1]) if bits and bits[-1].isdigit() else -1
        if parts.path == "/":
            return 200, html, _html("Index", "".join(f'<a href="{u}">{u}</a> ' for u in self.links()))
        if bits[:1] == ["plain"] and n >= 0:
            if self.plain_delay_s:
                time.sleep(self.plain_delay_s)
            return 200, html, _html(f"Plain {n}", f'<h1>Plain {n}</h1><span class="price">{n}.99</span>')
        if bits[:1] == ["js-only"] and n >= 0:
            return 200, html, _html(f"Only via JS {n}", f"<h1>Only via JS {n}</h1>")
        if bits[:1] == ["js"] and n >= 0:
            more = self.url(PLAIN_HOST, f"/js-only/{n}")
            script = (
                f"fetch('/data/{n}.json').then(r => r.json()).then(d => {{"
                "document.getElementById('app').innerHTML = '<h1 class=\"title\">' + d.title + '</h1>'"
                " + '<span class=\"token\">' + (d.a * d.b) + '</span>'"
                f" + '<a class=\"more\" href=\"{more}\">more</a>';"
                f" fetch('/mark/done?page=js-{n}'); }});"
            )
            return 200, html, _html(f"JS {n}", f'<div id="app">Loading</div><script>{script}</script>')
        if bits[:1] == ["data"] and bits[-1].endswith(".json"):
            m = int(bits[-1][: -len(".json")])
            if self.render_delay_s:
                time.sleep(self.render_delay_s)
            return 200, "application/json", json.dumps({"title": f"Rendered {m}", "a": m + 7, "b": 13}).encode()
        if bits[:1] == ["mark"]:
            return 204, "text/plain", b""
        if bits[:1] == ["frames"] and n >= 0:
            return 200, html, _html(f"Frames {n}", f"<h1>Frames {n}</h1><div id=\"slot\"></div>" + _late_frame("outer", f"/frame/outer/{n}"))
        if bits[:2] == ["frame", "outer"] and n >= 0:
            return 200, html, _html("outer", f"<p>outer {n}</p><div id=\"slot\"></div>" + _late_frame("inner", f"/frame/inner/{n}"))
        if bits[:2] == ["frame", "inner"] and n >= 0:
            script = (
                "setTimeout(() => { document.getElementById('x').innerHTML ="
                f" '<p class=\"secret\">' + ({n} * 31 + 5) + '-deep</p>'; fetch('/mark/done?page=frames-{n}'); }}, 100);"
            )
            return 200, html, _html("inner", f'<div id="x"></div><script>{script}</script>')
        if bits[:1] == ["hang"] and n >= 0:
            return 200, html, _html(f"Hang {n}", f'<h1>Hang {n}</h1><img src="/stall/{n}.png">')
        if bits[:1] == ["stall"]:
            stop.wait(120)  # never while a test runs: the page's load event never comes
            return 404, "text/plain", b""
        if bits[:1] == ["crash"] and n >= 0:
            script = "let hoard = []; while (true) { hoard.push(new Array(4e6).fill(1.5)); }"
            return 200, html, _html(f"Crash {n}", f"<h1>Crash {n}</h1><script>{script}</script>")
        return 404, html, _html("Not found", "")


def _late_frame(frame_id: str, src: str) -> str:
    """A script that adds an iframe 150 ms after the page loads."""
    return (
        "<script>setTimeout(() => { const f = document.createElement('iframe');"
        f" f.id = '{frame_id}'; f.src = '{src}'; document.getElementById('slot').appendChild(f); }}, 150);</script>"
    )


@dataclass(frozen=True)
class Hit:
    """One request the server answered."""

    t: float  # time.monotonic() of the server when the request arrived
    path: str
    agent: str


@dataclass
class BrowserServer:
    """The site on a free port of 127.0.0.1, served by threads of this process, logging every request."""

    plain: int = 4
    js: int = 6
    frames: int = 3
    hang: int = 0
    crash: int = 0
    render_delay_s: float = 0.2
    plain_delay_s: float = 0.0
    log: list[Hit] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._stop = threading.Event()

        def get(handler: BaseHTTPRequestHandler) -> Answer:
            hit = Hit(time.monotonic(), handler.path, handler.headers.get("User-Agent") or "")
            with self._lock:
                self.log.append(hit)
            status, kind, body = self.web.answer(handler.path, self._stop)
            return status, {"Content-Type": kind}, body

        self.httpd = answering_server(get)
        self.port = self.httpd.server_address[1]
        self.web = BrowserWeb(self.port, self.plain, self.js, self.frames, self.hang, self.crash,
                              self.render_delay_s, self.plain_delay_s)
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="browser-site", daemon=True)

    def __enter__(self) -> BrowserServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def hits(self) -> list[Hit]:
        with self._lock:
            return list(self.log)

    # -- what the server saw ----------------------------------------------------------

    def renders(self, until: dict[str, float] | None = None) -> list[tuple[str, str, float, float]]:
        """Every render the server saw: (agent, page, start, end), from the page's request to
        its /mark/done by the same agent. A render with no end ends at ``until[agent]`` (a
        worker killed mid-render) or never (``inf``)."""
        open_: dict[tuple[str, str], list[float]] = defaultdict(list)
        out: list[tuple[str, str, float, float]] = []
        for hit in self.hits():
            parts = urlsplit(hit.path)
            bits = [b for b in parts.path.split("/") if b]
            if len(bits) == 2 and bits[0] in ("js", "frames") and bits[1].isdigit():
                open_[(hit.agent, f"{bits[0]}-{bits[1]}")].append(hit.t)
            elif bits[:2] == ["mark", "done"]:
                page = parse_qs(parts.query).get("page", [""])[0]
                starts = open_.get((hit.agent, page))
                if starts:
                    out.append((hit.agent, page, starts.pop(0), hit.t))
        for (agent, page), starts in open_.items():
            end = (until or {}).get(agent, float("inf"))
            out += [(agent, page, t, end) for t in starts]
        return out


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one time (an interval ending as another starts: not both)."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals], key=lambda ev: (ev[0], ev[1]))
    best = now = 0
    for _, step in events:
        now += step
        best = max(best, now)
    return best


# -- the spider -------------------------------------------------------------------


def browser_meta(*methods: Any, **extra: Any) -> dict[str, Any]:
    """The meta of a request that a browser must render: scrapy-playwright's keys (PageMethods
    travel by method name) and the task type that routes it to browser workers."""
    return {"playwright": True, "playwright_page_methods": list(methods), "task_type": "browser", **extra}


class BrowserSpider(scrapy.Spider):
    """Plain pages without a browser; script-written pages and late nested frames with one."""

    name = "browser_zoo"

    async def start(self) -> Any:
        yield scrapy.Request(self.settings["BROWSER_SITE"], callback=self.parse_index)

    def parse_index(self, response: Response) -> Iterator[Any]:
        from scrapy_playwright.page import PageMethod

        for href in response.css("a::attr(href)").getall():
            kind = urlsplit(href).path.split("/")[1]
            if kind == "plain":
                yield scrapy.Request(href, callback=self.parse_plain)
            elif kind == "js":
                yield scrapy.Request(href, callback=self.parse_js, errback=self.failed,
                                     meta=browser_meta(PageMethod("wait_for_selector", ".token")))
            elif kind == "frames":
                yield scrapy.Request(href, callback=self.parse_frames, errback=self.failed,
                                     meta=browser_meta(playwright_include_page=True))
            else:  # hang, crash
                yield scrapy.Request(href, callback=self.parse_js, errback=self.failed, meta=browser_meta())

    def parse_plain(self, response: Response) -> Iterator[Any]:
        yield {"kind": "plain", "url": response.url, "title": response.css("h1::text").get(),
               "price": response.css(".price::text").get()}

    def parse_js(self, response: Response) -> Iterator[Any]:
        yield {"kind": "js", "url": response.url, "title": response.css(".title::text").get(),
               "token": response.css(".token::text").get()}
        for href in response.css("a.more::attr(href)").getall():
            yield scrapy.Request(href, callback=self.parse_plain)

    async def parse_frames(self, response: Response) -> Any:
        page = response.meta["playwright_page"]
        text = await page.frame_locator("#outer").frame_locator("#inner").locator(".secret").inner_text()
        yield {"kind": "frames", "url": response.url, "secret": text}
        # the page's raw HTML too, with the live page handed on to its callback: a request
        # with a page object in meta cannot travel, so its worker crawls it
        yield scrapy.Request(response.url + "?raw=1", callback=self.parse_raw, errback=self.failed,
                             meta={"frames_page": page})

    async def parse_raw(self, response: Response) -> Any:
        page = response.meta["frames_page"]
        try:
            text = await page.frame_locator("#outer").frame_locator("#inner").locator(".secret").inner_text()
        finally:
            await page.close()
        yield {"kind": "frames-raw", "url": response.url, "title": response.css("h1::text").get(),
               "iframes": len(response.css("iframe")), "secret": text}

    async def failed(self, failure: Any) -> Any:
        meta = failure.request.meta
        page = meta.get("playwright_page") or meta.get("frames_page")
        if page is not None:
            await page.close()
        yield {"kind": "failed", "url": failure.request.url, "error": type(failure.value).__name__}


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


# -- processes ----------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children, theirs, ...), from /proc."""
    children: dict[int, list[int]] = defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        children[int(stat[stat.rindex(")") + 2 :].split()[1])].append(int(name))
    out, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        out += kids
        todo += kids
    return out


def running(pids: list[int]) -> list[int]:
    """The processes of ``pids`` still running (not gone, not zombies)."""
    out = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] != "Z":
            out.append(pid)
    return out


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
