"""A worker's local memory of what it already sent, in front of Redis's dedupe.

Redis decides what is a duplicate (enqueue.lua, with the crawl's Bloom or bitmap filter).
A worker also remembers the fingerprints it sent (a bounded cache), so most links on a
page, seen before, never leave the worker. With Scrapy's own fingerprinter a GET without
body has a fingerprint that depends on the URL string alone, so a URL this worker already
sent is a duplicate without canonicalize_url + json + sha1 (about 13 us); any other
fingerprinter always fingerprints. When a Redis primary is replaced, what the worker
remembers sending may not have arrived, so it forgets and lets Redis decide again.
"""

from __future__ import annotations

import logging
from typing import Any

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from streams_sched.worker.seen import SeenCache

__all__ = ["LocalDedupe"]

logger = logging.getLogger(__name__)


class LocalDedupe:
    """Fingerprints and URLs this worker sent, and Scrapy's duplicate log lines."""

    def __init__(self, size: int, fingerprinter: Any, url_shortcut: bool, debug: bool) -> None:
        self.size = size
        self.seen = SeenCache(size)
        self.url_shortcut = url_shortcut and type(fingerprinter) is RequestFingerprinter
        self.seen_urls = SeenCache(size if self.url_shortcut else 0)
        #: the I/O thread's Exchange.seen_epoch when the caches were last trusted
        self.epoch = 0
        self.debug = debug
        self._logged = False

    def forget(self, epoch: int) -> None:
        """A Redis primary was replaced: what this worker remembers sending may not have
        arrived there, so let Redis' own dedupe decide again."""
        self.epoch = epoch
        forgotten = len(self.seen)
        self.seen = SeenCache(self.size)
        self.seen_urls = SeenCache(self.size if self.url_shortcut else 0)
        logger.info("forgot %d fingerprints sent ahead of a Redis primary's replacement", forgotten)

    def log_filtered(self, request: Request, spider: Any) -> None:
        """Scrapy's duplicate log line: every one with DUPEFILTER_DEBUG, else the first."""
        if self.debug:
            logger.debug("Filtered duplicate request: %(request)s", {"request": request}, extra={"spider": spider})
        elif not self._logged:
            logger.debug(
                "Filtered duplicate request: %(request)s - no more duplicates will be shown"
                " (see DUPEFILTER_DEBUG to show all duplicates)",
                {"request": request},
                extra={"spider": spider},
            )
            self._logged = True
