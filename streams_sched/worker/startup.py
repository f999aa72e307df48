"""One clear line when a worker cannot start.

Scrapy reports an exception raised while a crawl starts with two or three
tracebacks (the failed deferred, then components closing that never opened),
and the setting at fault ends up somewhere in the middle. :func:`fail_clearly`
wraps the scheduler's start-up steps: a :class:`StreamsSchedError` (a bad
setting, Redis unreachable, wrong credentials, a dedupe back-end mismatch, an
incompatible Scrapy) is logged once, at CRITICAL, as one line that names the
setting and the value, then re-raised so the crawl fails and ``scrapy crawl``
exits 1. The re-raised exception carries no frames of ours.

Scrapy before 2.16 counts a crawl as failed to start only when its crawler has
no spider (later ones also when the crawl failed), so there ``scrapy crawl``
would exit 0: :func:`fail_clearly` also clears ``crawler.spider``.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from streams_sched.errors import StreamsSchedError

__all__ = ["fail_clearly"]

logger = logging.getLogger("streams_sched")

F = TypeVar("F", bound=Callable[..., Any])


def fail_clearly(func: F) -> F:
    """Log a StreamsSchedError raised by ``func`` as one CRITICAL line, then re-raise it."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except StreamsSchedError as exc:
            if not getattr(exc, "_streams_logged", False):
                logger.critical("streams-sched cannot start: %s", exc)
                exc._streams_logged = True  # type: ignore[attr-defined]
                _count_as_bootstrap_failure(args)
            raise exc.with_traceback(None) from None

    return wrapper  # type: ignore[return-value]


def _count_as_bootstrap_failure(args: tuple[Any, ...]) -> None:
    """Make CrawlerProcess.bootstrap_failed true on every Scrapy (so `scrapy crawl` exits 1)."""
    from scrapy.crawler import Crawler

    for arg in args:
        crawler = arg if isinstance(arg, Crawler) else getattr(arg, "crawler", None)
        if isinstance(crawler, Crawler):
            crawler.spider = None
            return
