"""Requests that cannot travel through the shared queue (``STREAMS_UNSERIALIZABLE``).

The codec refuses a request whose callback is not a method of the spider (a
lambda, a nested function, another object's method), whose meta or cb_kwargs
hold a value it has no encoding for (a Response, a Selector, a live browser
page), whose class is not allowed, or that is over ``STREAMS_MAX_REQUEST_BYTES``.
Such a request is never dropped silently:

- ``"local"`` (the default): the worker keeps it in memory and crawls it
  itself, as Scrapy's disk queues keep what they cannot pickle
  (``scheduler/unserializable``). It is deduplicated by this worker only, is
  not shared with other workers, holds no lease, and is lost if this worker
  dies. Counted in ``streams/unserializable_local``.
- ``"error"``: it is refused with an ERROR line giving the reason, counted in
  ``streams/unserializable_refused``, and the crawl ends with exit code 1.

Both count ``streams/unserializable`` (and ``streams/oversize`` for the size).
In "local" mode one WARNING per spider and reason says how to make such
requests travel; the rest are only counted.
"""

from __future__ import annotations

import logging
from typing import Any

from streams_sched.errors import SerializationError

__all__ = ["LOCAL_WARNING", "UnserializablePolicy", "how_to_fix", "reason_of"]

logger = logging.getLogger(__name__)

LOCAL_WARNING = (
    "%s; this worker keeps it in memory and crawls it itself. Local requests are neither shared"
    " nor leased, and are lost if this worker dies. To make them travel: %s. Further requests of"
    " spider %r that fail on %s are only counted (streams/unserializable_local);"
    " STREAMS_UNSERIALIZABLE='error' refuses them instead"
)


def reason_of(exc: SerializationError) -> str:
    """What one warning stands for: the field that cannot travel (``callback``,
    ``meta['page']``, ``size``, ``class``, ...)."""
    return exc.field


def how_to_fix(field: str) -> str:
    """What the user changes so that requests refused for ``field`` can travel."""
    if field in ("callback", "errback"):
        return (
            f"make the {field} a method of the spider (self.parse_page), not a lambda, a nested"
            " function or another object's method; private methods are fine"
        )
    if field.startswith(("meta", "cb_kwargs")):
        return (
            "keep only data in meta and cb_kwargs (plain values, items, dataclasses, classes listed in"
            " STREAMS_META_CLASSES, or a class given a codec in STREAMS_META_CODECS); pass what you parsed"
            " from a Response, a Selector or a browser"
            " page instead of the object itself"
        )
    if field.startswith("cookies"):
        return "give cookies as plain values (str, int, float), the way Scrapy sends them"
    if field == "size":
        return "keep large data out of meta and the body, or raise STREAMS_MAX_REQUEST_BYTES"
    if field == "class":
        return "add the request class's import path to STREAMS_REQUEST_CLASSES"
    return "see docs/operations/security.md, 'What travels through the queue'"


class UnserializablePolicy:
    """Decides, counts and logs what happens to requests the codec refuses."""

    def __init__(self, mode: str, spider_name: str, spider: Any = None) -> None:
        self.mode = mode
        self.spider_name = spider_name
        self.spider = spider
        self.warned: set[str] = set()
        #: kept in memory and crawled here ("local")
        self.kept = 0
        #: refused ("error")
        self.refused = 0

    def keep_local(self, exc: SerializationError) -> bool:
        """True: crawl the request from this worker's memory; False: refuse it."""
        field = reason_of(exc)
        if self.mode == "error":
            self.refused += 1
            logger.error(
                "%s; refused (STREAMS_UNSERIALIZABLE='error'; the crawl will exit with code 1). To make it"
                " travel: %s",
                exc, how_to_fix(field), extra={"spider": self.spider},
            )
            return False
        self.kept += 1
        if field not in self.warned:
            self.warned.add(field)
            logger.warning(
                LOCAL_WARNING, exc, how_to_fix(field), self.spider_name, field, extra={"spider": self.spider}
            )
        return True

    def failure(self) -> str | None:
        """Why the crawl must not exit 0 ("error" mode with refused requests), else None."""
        if not self.refused:
            return None
        return (
            f"streams-sched refused {self.refused} requests that cannot travel through the shared queue"
            " (STREAMS_UNSERIALIZABLE='error'); their ERROR lines above say why and how to fix them"
        )
