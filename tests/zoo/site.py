"""The zoo's web: a real HTTP server on 127.0.0.1 serving two host names.

``a.zoo.test`` is a small shop (categories, products, robots.txt with a Sitemap:
line, a sitemap index with a gzipped sitemap, an RSS feed, a CSV feed, a login
form with a cookie session, a JSON search API, redirects to the other host and a
page that fails before it works); ``b.zoo.test`` is a second site (more
categories, the middle hop of a redirect chain). Both names resolve to
127.0.0.1 through :class:`zoo.resolver.ZooResolver`, so a crawl crosses real
host names on one local port.

Every product is linked from exactly one listing page and product pages link to
no other product: what a spider records about how it reached a page does not
depend on the order in which a scheduler hands out requests.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["HOSTS", "ZooSite", "ZooWeb"]

HOSTS = ("a.zoo.test", "b.zoo.test")
LOGIN = {"username": "zoo", "password": "secret"}
CSRF = "zoo-csrf-1"
SESSION = "zoo-session-1"

Reply = tuple[int, dict[str, str], bytes]


def html(title: str, body: str) -> bytes:
    return f"<html><head><title>{title}</title></head><body><h1>{title}</h1>{body}</body></html>".encode()


def links(*pairs: tuple[str, str]) -> str:
    return "<ul>" + "".join(f'<li><a href="{href}">{text}</a></li>' for href, text in pairs) + "</ul>"


@dataclass
class ZooWeb:
    """What the zoo's server answers; ``port`` is in every absolute URL."""

    port: int
    cats: int = 3
    per_page: int = 3  # products per listing page; each category has two pages
    flaky_failures: int = 2
    delay_s: float = 0.0
    hits: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def a(self) -> str:
        return f"http://a.zoo.test:{self.port}"

    @property
    def b(self) -> str:
        return f"http://b.zoo.test:{self.port}"

    def reset(self) -> None:
        """Forget the failures served (before each crawl of the same site)."""
        with self.lock:
            self.hits.clear()

    def _hit(self, key: str) -> int:
        with self.lock:
            n = self.hits[key] = self.hits.get(key, 0) + 1
            return n

    # -- content -------------------------------------------------------------

    def products(self, cat: int, page: int) -> list[str]:
        start = (page - 1) * self.per_page
        return [f"{cat}-{i}" for i in range(start, start + self.per_page)]

    def product_urls(self, base: str, cats: range | list[int]) -> list[str]:
        return [f"{base}/product/{p}" for c in cats for page in (1, 2) for p in self.products(c, page)]

    def price(self, product: str) -> str:
        cat, i = product.split("-")
        return f"{int(cat) * 10 + int(i)}.99"

    def home(self, host: str) -> bytes:
        if host == "b.zoo.test":
            return html("Site B", links((f"{self.a}/", "back to A"), ("/cat/9?ref=b", "B catalogue")))
        pairs = [(f"/cat/{c}?ref=home", f"Category {c}") for c in range(1, self.cats + 1)]
        pairs += [(f"{self.b}/cat/9?ref=a", "Partner shop"), ("/about", "About"), ("/private/x", "Private")]
        return html("Zoo shop", links(*pairs))

    def category(self, cat: int, page: int) -> bytes:
        pairs = [(f"/product/{p}?ref=cat{cat}", f"Product {p}") for p in self.products(cat, page)]
        if page == 1:
            pairs.append((f"/cat/{cat}/2?ref=next", "Next page"))
            if cat == 2:
                pairs.append(("/product/2-missing", "Discontinued"))
        return html(f"Category {cat} page {page}", links(*pairs))

    def product(self, product: str) -> bytes:
        return html(
            f"Product {product}",
            f'<span class="price">{self.price(product)}</span><p class="desc">The {product} widget.</p>'
            + links(("/", "Home"), ("/about", "About")),
        )

    def robots(self) -> bytes:
        return f"User-agent: *\nDisallow: /private/\nSitemap: {self.a}/sitemap_index.xml\n".encode()

    def sitemap_index(self) -> bytes:
        entries = "".join(
            f"<sitemap><loc>{self.a}/{name}</loc></sitemap>"
            for name in ("sitemap_products.xml", "sitemap_pages.xml.gz", "archive_2019.xml")
        )
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</sitemapindex>'
        ).encode()

    def urlset(self, urls: list[str]) -> bytes:
        entries = "".join(f"<url><loc>{u}</loc><lastmod>2026-01-0{1 + n % 9}</lastmod></url>" for n, u in enumerate(urls))
        return (
            '<?xml version="1.0" encoding="UTF-8"?>'
            f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'
        ).encode()

    def sitemap_products(self) -> bytes:
        return self.urlset(self.product_urls(self.a, [1, 2]) + [f"{self.b}/product/9-0"])

    def sitemap_pages(self) -> bytes:
        return gzip.compress(self.urlset([f"{self.a}/page/{n}" for n in range(1, 5)] + [f"{self.a}/other/1"]))

    def rss(self) -> bytes:
        items = "".join(
            f"<item><title>Feed {p}</title><link>{self.a}/product/{p}</link><price>{self.price(p)}</price></item>"
            for page in (1, 2) for p in self.products(1, page)
        )
        return f'<?xml version="1.0"?><rss version="2.0"><channel><title>Zoo</title>{items}</channel></rss>'.encode()

    def csv(self) -> bytes:
        rows = ["id,name,price,url"]
        rows += [f"{p},Widget {p},{self.price(p)},{self.a}/product/{p}" for page in (1, 2) for p in self.products(2, page)]
        return ("\n".join(rows) + "\n").encode()

    def login_form(self) -> bytes:
        return html(
            "Log in",
            '<form action="/login" method="post">'
            f'<input type="hidden" name="csrf_token" value="{CSRF}">'
            '<input type="text" name="username"><input type="password" name="password">'
            '<input type="submit" name="go" value="Log in"></form>',
        )

    def api(self, body: bytes) -> Reply:
        try:
            query = json.loads(body)
            q, page = str(query["q"]), int(query["page"])
        except (ValueError, KeyError, TypeError):
            return 400, {"Content-Type": "application/json"}, b'{"error": "expected {\\"q\\": str, \\"page\\": int}"}'
        data = {
            "query": q,
            "page": page,
            "results": [{"id": f"{q}-{page}-{i}", "name": f"{q.title()} {page}.{i}"} for i in range(3)],
            "next_page": page + 1 if page < 3 else None,
        }
        return 200, {"Content-Type": "application/json"}, json.dumps(data).encode()

    # -- routing -------------------------------------------------------------

    def respond(self, method: str, host: str, target: str, headers: Any, body: bytes) -> Reply:
        if self.delay_s:
            time.sleep(self.delay_s)
        path = urlsplit(target).path
        parts = [p for p in path.split("/") if p]
        cookie = headers.get("Cookie") or ""
        logged_in = f"session={SESSION}" in cookie
        ok = {"Content-Type": "text/html; charset=utf-8"}
        xml = {"Content-Type": "application/xml"}
        if method == "POST":
            if host == "a.zoo.test" and path == "/login":
                form = {k: v[0] for k, v in parse_qs(body.decode()).items()}
                if form.get("csrf_token") == CSRF and all(form.get(k) == v for k, v in LOGIN.items()):
                    return 302, {"Location": "/account", "Set-Cookie": f"session={SESSION}; Path=/"}, b""
                return 200, ok, html("Login failed", "")
            if host == "a.zoo.test" and path == "/api/search":
                if "json" not in (headers.get("Content-Type") or ""):
                    return 415, {"Content-Type": "text/plain"}, b"send JSON"
                return self.api(body)
            return 405, {"Content-Type": "text/plain"}, b"method not allowed"
        if path == "/":
            return 200, ok, self.home(host)
        if parts[:1] == ["cat"] and len(parts) in (2, 3) and parts[1].isdigit():
            page = int(parts[2]) if len(parts) == 3 and parts[2].isdigit() else 1
            return 200, ok, self.category(int(parts[1]), page)
        if parts[:1] == ["product"] and len(parts) == 2 and parts[1] != "2-missing":
            return 200, ok, self.product(parts[1])
        if parts[:1] == ["page"] and len(parts) == 2:
            return 200, ok, html(f"Page {parts[1]} on {host}", links(("/", "Home")))
        if path == "/about":
            return 200, ok, html("About", "")
        if host == "b.zoo.test" and parts[:1] == ["hop"] and len(parts) == 2:
            return 301, {"Location": f"{self.a}/landed/{parts[1]}"}, b""
        if host != "a.zoo.test":
            return 404, ok, html("Not found", "")
        if path == "/robots.txt":
            return 200, {"Content-Type": "text/plain"}, self.robots()
        if path == "/sitemap_index.xml":
            return 200, xml, self.sitemap_index()
        if path == "/sitemap_products.xml":
            return 200, xml, self.sitemap_products()
        if path == "/sitemap_pages.xml.gz":
            return 200, {"Content-Type": "application/x-gzip"}, self.sitemap_pages()
        if path == "/archive_2019.xml":
            return 200, xml, self.urlset([f"{self.a}/page/99"])
        if path == "/feed.xml":
            return 200, {"Content-Type": "application/rss+xml"}, self.rss()
        if path == "/feed.csv":
            return 200, {"Content-Type": "text/csv"}, self.csv()
        if path == "/login":
            return 200, ok, self.login_form()
        if path == "/account":
            if not logged_in:
                return 302, {"Location": "/login"}, b""
            return 200, ok, html(f"Welcome {LOGIN['username']}", links(*[(f"/account/orders/{n}", f"Order {n}") for n in range(1, 5)]))
        if parts[:2] == ["account", "orders"] and len(parts) == 3:
            if not logged_in:
                return 403, ok, html("Forbidden", "")
            n = parts[2]
            return 200, ok, html(f"Order {n}", f'<span class="total">{n}0.50</span><span class="user">{LOGIN["username"]}</span>')
        if parts[:1] == ["go"] and len(parts) == 2:  # a -> b -> a
            return 302, {"Location": f"{self.b}/hop/{parts[1]}"}, b""
        if parts[:1] == ["go-b"] and len(parts) == 2:  # a -> b
            return 302, {"Location": f"{self.b}/page/{parts[1]}"}, b""
        if parts[:1] == ["landed"] and len(parts) == 2:
            return 200, ok, html(f"Landed {parts[1]}", "")
        if parts[:1] == ["flaky"] and len(parts) == 2:
            if parts[1] == "dead" or self._hit(path) <= self.flaky_failures:
                return 503, ok, html("Try again", "")
            return 200, ok, html(f"Flaky {parts[1]} works", "")
        return 404, ok, html("Not found", "")


class _Handler(BaseHTTPRequestHandler):
    web: ZooWeb
    protocol_version = "HTTP/1.0"

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        host = (self.headers.get("Host") or "").split(":")[0]
        status, headers, payload = self.web.respond(self.command, host, self.path, self.headers, body)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    do_GET = do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ZooSite:
    """The zoo's web served on a free port of 127.0.0.1 by a thread of this process."""

    def __init__(self, **web: Any) -> None:
        handler = type("Handler", (_Handler,), {})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.web = handler.web = ZooWeb(port=self.server.server_address[1], **web)
        self.thread = threading.Thread(target=self.server.serve_forever, name="zoo-site", daemon=True)

    def start(self) -> ZooSite:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
