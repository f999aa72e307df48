"""scrapy-redis's dupefilter SET as a read-only "already seen" filter of a migrated crawl.

scrapy-redis 0.9.1 (``RFPDupeFilter.request_fingerprint``) stores
``sha1(json.dumps({"method", "url": canonicalize_url(url), "body": body.hex()},
sort_keys=True)).hexdigest()`` in a SET. That is **not** Scrapy's own fingerprint
(Scrapy's JSON also has a ``"headers"`` key and the digest is binary), and the SET
holds no URL, so the fingerprints cannot be put into a site's Bloom filter.
``streams-sched migrate-scrapy-redis`` copies the SET into ``ss:{C}:legacy-seen``
and records it in the crawl's meta hash; from then on every request about to enter
the crawl (follow-ups, seeds, feed entries) is looked up there first, in one
SMISMEMBER per batch on the I/O thread, and dropped if scrapy-redis saw it.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from scrapy import Request
from w3lib.url import canonicalize_url

__all__ = ["LEGACY_FIELD", "legacy_fingerprint", "legacy_key", "legacy_seen"]

#: Field of the crawl's meta hash naming the legacy SET ("" or absent: none).
LEGACY_FIELD = "legacy_dupefilter"


def legacy_fingerprint(request: Request) -> bytes:
    """scrapy-redis 0.9.1's fingerprint of ``request`` (40 hex digits, as bytes)."""
    data = {
        "method": request.method,
        "url": canonicalize_url(request.url),
        "body": (request.body or b"").hex(),
    }
    return hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest().encode()


def legacy_key(client: Any, meta_key: str) -> str | None:
    """The legacy SET recorded for a crawl, or None."""
    value = client.hget(meta_key, LEGACY_FIELD)
    if not value:
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


def legacy_seen(client: Any, key: str, fingerprints: Sequence[bytes]) -> list[bool]:
    """For each fingerprint, True if the legacy SET has it (one SMISMEMBER)."""
    if not fingerprints:
        return []
    return [bool(v) for v in client.smismember(key, list(fingerprints))]
