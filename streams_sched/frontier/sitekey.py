"""What a site is: the request's host name, or its registered domain (STREAMS_SITE_KEY).

``"domain"`` groups ``a.shop.co.uk`` and ``b.shop.co.uk`` under ``shop.co.uk``,
using the public suffix list that tldextract ships in its wheel: it is built
with no suffix-list URLs and no cache directory, so it never downloads or
writes anything at run time (Scrapy already depends on tldextract). Private
suffixes (``github.io``, ``blogspot.com``) are not used: like browsers' cookie
rules without them, ``a.github.io`` and ``b.github.io`` are one site.
IP addresses and names without a public suffix (``localhost``,
``intranet.test``) keep their whole host name.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["SITE_KEYS", "site_keyer"]

#: Values of STREAMS_SITE_KEY.
SITE_KEYS = ("host", "domain")


def _host(host: str) -> str:
    return host


def site_keyer(mode: str, cache_size: int = 100_000) -> Callable[[str], str]:
    """A function from a host name to its site name, for ``mode`` "host" or "domain"."""
    if mode == "host":
        return _host
    import tldextract

    extract: Any = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None, fallback_to_snapshot=True)
    cache: dict[str, str] = {}

    def domain(host: str) -> str:
        site = cache.get(host)
        if site is None:
            parts = extract(host)
            site = parts.top_domain_under_public_suffix if hasattr(parts, "top_domain_under_public_suffix") else parts.registered_domain
            site = site or host
            if len(cache) >= cache_size:
                cache.clear()
            cache[host] = site
        return site

    return domain
