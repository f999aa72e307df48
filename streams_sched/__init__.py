"""streams-sched: a distributed crawl frontier for Scrapy on Redis Streams consumer groups.

Enable it in a Scrapy project with two settings::

    SCHEDULER = "streams_sched.scheduler.StreamsScheduler"
    REDIS_URL = "redis://localhost:6379/0"
"""

from __future__ import annotations

__version__ = "0.1.0"

from .config import StreamsConfig
from .errors import (
    ConfigError,
    DedupeBackendError,
    EntryError,
    RedisUnavailable,
    ScrapyCompatError,
    SerializationError,
    StreamsSchedError,
)
from .frontier import BloomParams, Frontier
from .keys import CrawlKeys, SiteKeys
from .policy import pause_site, resume_site, set_policy
from .scheduler import StreamsScheduler

__all__ = [
    "BloomParams",
    "ConfigError",
    "CrawlKeys",
    "DedupeBackendError",
    "EntryError",
    "Frontier",
    "RedisUnavailable",
    "ScrapyCompatError",
    "SerializationError",
    "SiteKeys",
    "StreamsConfig",
    "StreamsSchedError",
    "StreamsScheduler",
    "__version__",
    "pause_site",
    "resume_site",
    "set_policy",
]
