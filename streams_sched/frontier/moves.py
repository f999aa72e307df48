"""The marks ``streams-sched move`` leaves in a crawl's Redis, and how their readers read them.

While a move copies the crawl, each shard's halt key (keys.py) says ``pause:<move id>``:
lease.lua leases nothing and claim.lua takes nothing over, so the requests in flight end
and nothing new starts. Once the copy is whole it says ``moved:<url>``, enqueue.lua
refuses every request with ``CRAWLMOVED <url>``, and the crawl's meta hash has
``moved_to`` = the URL (the daemons and the CLI read that one). The URL never carries a
password. Workers, producers and daemons that meet a mark stop (exit code 6); none
connects to a URL it read from Redis.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streams_sched.frontier.keys import CrawlKeys

__all__ = ["CRAWL_MOVED", "MOVED", "MOVED_TO", "PAUSE", "moved_crawls", "moved_in_error", "moved_in_halt"]

#: the crawl meta field with where the crawl went
MOVED_TO = "moved_to"
#: a shard halt's value while a move copies the crawl, then once it has moved
PAUSE = "pause:"
MOVED = "moved:"
#: the first word of enqueue.lua's refusal once the crawl has moved
CRAWL_MOVED = "CRAWLMOVED"


def moved_in_halt(halt: str) -> str | None:
    """The new place a shard's halt names ('' none, a pause: None)."""
    return halt[len(MOVED):] if halt.startswith(MOVED) else None


def moved_in_error(exc: BaseException) -> str | None:
    """The new place an error reply of enqueue.lua names, None for any other error."""
    text = str(exc)
    if not text.startswith(CRAWL_MOVED + " "):
        return None
    return text[len(CRAWL_MOVED) + 1:].strip()


def moved_crawls(client: Any, crawls: Sequence[str]) -> dict[str, str]:
    """The crawls of ``crawls`` that have moved, with where to (one round trip)."""
    if not crawls:
        return {}
    pipe = client.pipeline(transaction=False)
    for crawl in crawls:
        pipe.hget(CrawlKeys(crawl).meta, MOVED_TO)
    out = {}
    for crawl, value in zip(crawls, pipe.execute(), strict=True):
        if value:
            out[crawl] = value.decode() if isinstance(value, bytes) else str(value)
    return out
