"""The spider of ``python -m bench sites`` for scrapy-redis: a RedisSpider, seeded its usual way.

scrapy-redis's own way to seed a crawl is a Redis list of start URLs
(``REDIS_START_URLS_KEY``) that a RedisSpider reads a batch at a time
(CONCURRENT_REQUESTS URLs) whenever the spider falls idle; each entry is JSON,
``{"url": ...}`` (a plain URL string gets a deprecation warning per entry). Its
own module so the other workers do not import scrapy-redis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from scrapy.http import Response
from scrapy_redis.spiders import RedisSpider

__all__ = ["OnePageRedisSpider"]


class OnePageRedisSpider(RedisSpider):  # type: ignore[misc]
    name = "sites"

    def parse(self, response: Response, **kwargs: Any) -> Iterator[Any]:
        yield {"url": response.url}
