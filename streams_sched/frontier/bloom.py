"""The crawl's dedupe back-end: RedisBloom where the server has it, a bitmap filter otherwise.

Which one a crawl uses, and its sizing, are fixed in the crawl's meta hash by its first
writer, so every worker, daemon and Seeder of the crawl dedupes alike.
"""

from __future__ import annotations

import logging

from streams_sched.connect.clients import RedisClient
from streams_sched.errors import DedupeBackendError
from streams_sched.frontier.keys import CrawlKeys
from streams_sched.frontier.records import BloomParams
from streams_sched.frontier.replies import text

__all__ = ["crawl_bloom", "detect_dedupe", "server_has_bloom"]

logger = logging.getLogger(__name__)


def detect_dedupe(client: RedisClient, crawl: str, wanted: str) -> str:
    """Decide the dedupe back-end ('bf' or 'bitmap') for a crawl, once per crawl.

    ``wanted`` is the STREAMS_DEDUPE setting: 'auto', 'redisbloom' or 'bitmap'.
    The first worker records its choice in the crawl meta hash; later workers
    follow it, so one crawl never mixes back-ends.
    """
    keys = CrawlKeys(crawl)
    has_bf = server_has_bloom(client, keys.meta + ":bfprobe")
    if wanted == "redisbloom" and not has_bf:
        raise DedupeBackendError(
            'STREAMS_DEDUPE="redisbloom" but this Redis has no RedisBloom module (BF.* commands);'
            ' use Redis 8 or Redis Stack, load redisbloom.so, or set STREAMS_DEDUPE="bitmap"'
        )
    choice = {"redisbloom": "bf", "bitmap": "bitmap"}.get(wanted, "bf" if has_bf else "bitmap")
    client.hsetnx(keys.meta, "dedupe", choice)
    recorded = text(client.hget(keys.meta, "dedupe"))
    if recorded != choice:
        if wanted != "auto":
            raise DedupeBackendError(
                f"crawl {crawl!r} was started with dedupe back-end {recorded!r}, but"
                f" STREAMS_DEDUPE={wanted!r}; a crawl cannot switch back-ends (purge it first)"
            )
        if recorded == "bf" and not has_bf:
            raise DedupeBackendError(
                f"crawl {crawl!r} uses RedisBloom for dedupe, but this Redis has no BF.* commands;"
                " load the RedisBloom module or purge the crawl"
            )
        choice = recorded
    return choice


def server_has_bloom(client: RedisClient, probe_key: str = "ss:bfprobe") -> bool:
    """True if the server answers RedisBloom commands (BF.EXISTS on a missing key)."""
    try:
        client.execute_command("BF.EXISTS", probe_key, "x")  # type: ignore[no-untyped-call]
        return True
    except Exception as exc:  # unknown command
        text = str(exc).lower()
        # a cluster client asks COMMAND for the key positions first, and says so itself
        if "unknown command" in text or "err unknown" in text or "doesn't exist in redis commands" in text:
            return False
        raise


def crawl_bloom(
    client: RedisClient,
    crawl: str,
    wanted: str = "auto",
    error_rate: float | None = None,
    capacity: int | None = None,
    expansion: int | None = None,
    revisit_s: float | None = None,
    revisit_buckets: int | None = None,
) -> BloomParams:
    """The crawl's Bloom parameters, fixed by its first worker and shared by every client.

    The bitmap filter's layout depends on them, so a worker with other
    settings uses the recorded ones and says so. ``None`` means "whatever the
    crawl uses" (the defaults if nobody recorded any yet).
    """
    mode = detect_dedupe(client, crawl, wanted)
    meta = CrawlKeys(crawl).meta
    default = BloomParams()
    asked = (error_rate, capacity, expansion, revisit_s, revisit_buckets)
    mine = {
        "bloom_error_rate": repr(default.error_rate if error_rate is None else error_rate),
        "bloom_capacity": str(default.capacity if capacity is None else capacity),
        "bloom_expansion": str(default.expansion if expansion is None else expansion),
        "revisit_seconds": repr(float(default.revisit_s if revisit_s is None else revisit_s)),
        "revisit_buckets": str(default.revisit_buckets if revisit_buckets is None else revisit_buckets),
    }
    for field_name, value in mine.items():
        client.hsetnx(meta, field_name, value)
    rec = [text(v) for v in client.hmget(meta, list(mine))]
    params = BloomParams(mode, float(rec[0]), int(rec[1]), int(rec[2]), float(rec[3]), int(rec[4]))
    recorded = (params.error_rate, params.capacity, params.expansion, params.revisit_s, params.revisit_buckets)
    if None not in asked and recorded != asked:
        logger.warning(
            "crawl %s keeps the dedupe parameters it started with (error_rate, capacity, expansion,"
            " revisit_s, revisit_buckets = %s); the settings ask for %s",
            crawl, recorded, asked,
        )
    return params
