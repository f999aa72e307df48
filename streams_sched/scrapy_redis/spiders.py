"""Spiders that still subclass scrapy-redis's RedisSpider or RedisCrawlSpider.

Such a spider reads its own feed when idle (``next_requests``: LRANGE + LTRIM on the
reactor, so the batch is gone if the worker dies before crawling it) and keeps the
spider open forever (``spider_idle`` raises DontCloseSpider). Under streams-sched
its reading is switched off (its ``fetch_data`` returns nothing), the worker's I/O
thread moves the feed instead (feed.py), through the normal dedupe and without loss,
and an overridden ``make_request_from_data`` still decides what an entry means.
Nothing from scrapy-redis is imported: the class is recognised by name.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

__all__ = ["adopt_redis_spider", "is_redis_spider"]

logger = logging.getLogger(__name__)

_MIXIN = ("scrapy_redis.spiders", "RedisMixin")


def is_redis_spider(spider: Any) -> bool:
    """True if ``spider`` is a scrapy-redis RedisSpider / RedisCrawlSpider (by its MRO)."""
    return any((c.__module__, c.__name__) == _MIXIN for c in type(spider).__mro__)


def _overrides(spider: Any, name: str) -> bool:
    for cls in type(spider).__mro__:
        if name in vars(cls):
            return (cls.__module__, cls.__name__) != _MIXIN
    return False


def adopt_redis_spider(spider: Any, feed_key: str) -> tuple[str, Callable[[bytes], Any] | None]:
    """(feed key, entry reader) for this spider; turns off a RedisSpider's own feed reading.

    A plain spider: ``(feed_key, None)``. A RedisSpider: its ``redis_key`` (from
    REDIS_START_URLS_KEY or the class attribute, as scrapy-redis set it), and its own
    ``make_request_from_data`` if the spider overrides it.
    """
    if not is_redis_spider(spider):
        return feed_key, None
    key = getattr(spider, "redis_key", None) or feed_key
    spider.fetch_data = lambda _key, _n: []  # scrapy-redis's reader: the I/O thread reads instead
    reader = spider.make_request_from_data if _overrides(spider, "make_request_from_data") else None
    logger.info(
        "spider %s is a scrapy-redis %s: streams-sched moves its feed %s instead of the spider"
        " (the spider stays open when the crawl is drained, as under scrapy-redis; see MAX_IDLE_TIME_BEFORE_CLOSE)",
        spider.name, type(spider).__mro__[1].__name__, key,
    )
    return key, reader
