"""A deterministic synthetic web: ``sites`` sites of ``pages`` pages each.

Page ``p`` of site ``s`` links to its children ``2p+1`` and ``2p+2`` (so every
page is reachable from page 0 of every site), to its parent, to page 0, to a
few pseudo-random pages of the same site and to the same page of the next
site: most links on a page were seen before, like on a real site.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass

__all__ = ["SyntheticWeb"]

_SITE_RE = re.compile(r"^https?://site(\d+)\.test(?::\d+)?/p/(\d+)$")
_IP_RE = re.compile(r"^https?://127\.0\.0\.(\d+)(?::\d+)?/p/(\d+)$")


@dataclass(frozen=True)
class SyntheticWeb:
    sites: int = 10
    pages: int = 2000
    extra_links: int = 4
    #: URL pattern: {site} (0-based), {ip} (site + 1, for 127.0.0.{ip}) and {page}
    base: str = "http://site{site}.test/p/{page}"
    padding: int = 2000

    def url(self, site: int, page: int) -> str:
        return self.base.format(site=site, ip=site + 1, page=page)

    def seeds(self) -> list[str]:
        return [self.url(s, 0) for s in range(self.sites)]

    def all_urls(self) -> set[str]:
        return {self.url(s, p) for s in range(self.sites) for p in range(self.pages)}

    def parse(self, url: str) -> tuple[int, int] | None:
        url = url.split("?", 1)[0]
        m = _SITE_RE.match(url)
        if m:
            site, page = int(m.group(1)), int(m.group(2))
        else:
            m = _IP_RE.match(url)
            if not m:
                return None
            site, page = int(m.group(1)) - 1, int(m.group(2))
        if site >= self.sites or page >= self.pages:
            return None
        return site, page

    def links(self, site: int, page: int) -> list[str]:
        n = self.pages
        targets = [2 * page + 1, 2 * page + 2, page // 2, 0]
        h = zlib.crc32(f"{site}/{page}".encode())
        for i in range(self.extra_links):
            targets.append((h >> (i * 5)) % n)
        out = [self.url(site, t) for t in targets if t < n]
        if self.sites > 1:
            out.append(self.url((site + 1) % self.sites, page))
        return out

    def html(self, site: int, page: int) -> bytes:
        anchors = "".join(f'<li><a href="{u}">link {i}</a></li>' for i, u in enumerate(self.links(site, page)))
        filler = "<p>" + ("lorem ipsum " * (self.padding // 12)) + "</p>"
        return (
            f"<html><head><title>site {site} page {page}</title></head>"
            f"<body><h1>site {site} page {page}</h1><ul>{anchors}</ul>{filler}</body></html>"
        ).encode()
