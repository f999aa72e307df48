"""streams-sched: a distributed crawl frontier for Scrapy on Redis Streams consumer groups.

Enable it in a Scrapy project with two settings::

    SCHEDULER = "streams_sched.scheduler.StreamsScheduler"
    REDIS_URL = "redis://localhost:6379/0"
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

from streams_sched.config import StreamsConfig
from streams_sched.errors import (
    ConfigError,
    DedupeBackendError,
    EntryError,
    EvictionPolicyError,
    RedisUnavailable,
    RequestsRefused,
    ScrapyCompatError,
    SerializationError,
    StreamsSchedError,
)
from streams_sched.politeness.policy import pause_site, resume_site, set_policy
from streams_sched.wire.meta_codecs import MetaCodec, register_meta_codec

if TYPE_CHECKING:
    from streams_sched.frontier.seeding import Seeder, SeedResult, seed
    from streams_sched.worker.scheduler import StreamsScheduler


def __getattr__(name: str) -> Any:
    # The scheduler pulls in Scrapy; the daemons (reclaimer, monitor) and the CLI import
    # this package without it, so it loads on first use (the CLI's commands that encode
    # requests import Scrapy when they run). tests/test_exports.py checks it.
    if name == "StreamsScheduler":
        from streams_sched.worker.scheduler import StreamsScheduler

        return StreamsScheduler
    if name in ("Seeder", "SeedResult", "seed"):
        from streams_sched.frontier import seeding

        return getattr(seeding, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# What users call. Internals (Frontier, CrawlKeys, SiteKeys, BloomParams) are imported
# from their modules; tests/test_exports.py holds this list and checks it.
__all__ = [
    "ConfigError",
    "DedupeBackendError",
    "EntryError",
    "EvictionPolicyError",
    "MetaCodec",
    "RedisUnavailable",
    "RequestsRefused",
    "ScrapyCompatError",
    "SeedResult",
    "Seeder",
    "SerializationError",
    "StreamsConfig",
    "StreamsSchedError",
    "StreamsScheduler",
    "__version__",
    "pause_site",
    "register_meta_codec",
    "resume_site",
    "seed",
    "set_policy",
]
