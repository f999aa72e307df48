"""The way in from scrapy-redis.

It owns the feed that moves what scrapy-redis producers push into ``<spider>:start_urls``
into the frontier (:mod:`.feed`), copying a half-done scrapy-redis crawl
(:mod:`.migrate`), scrapy-redis's dupefilter as a read-only seen filter
(:mod:`.legacy`) and spiders that still subclass ``RedisSpider`` (:mod:`.spiders`).
It may import :mod:`streams_sched.frontier`, :mod:`streams_sched.wire` and the top-level
modules; nothing outside it imports scrapy-redis itself.
"""
