"""A site with one queued URL costs Redis at most 350 bytes, what scrapy-redis spends on one queued
request: many one-page sites must not exhaust Redis (a million of them fit in 350 MB)."""

from __future__ import annotations

from typing import Any

import redis

from streams_sched import Seeder

SITES = 10_000
#: Redis used_memory per site that has one queued URL, everything the Seeder wrote included
MAX_BYTES_PER_SITE = 350


def test_a_single_page_site_costs_at_most_350_bytes(redis_url: str, crawl: str, measured: Any) -> None:
    """10,000 one-page sites seeded through Seeder grow Redis used_memory by at most 350 bytes each, on both back-ends."""
    client = redis.Redis.from_url(redis_url)
    urls = [f"http://s{i}.test/" for i in range(SITES)]
    # the Seeder loads its scripts and records the crawl's dedupe parameters when it is made:
    # a cost per crawl, not per site, so the first reading comes after it
    with Seeder(redis_url, crawl) as seeder:
        before = int(client.info("memory")["used_memory"])
        result = seeder.seed(urls)
        after = int(client.info("memory")["used_memory"])
    assert len(result.added) == SITES and not result.duplicates
    per_site = (after - before) / SITES
    measured(f"{per_site:,.0f} B of used_memory per site with one queued URL ({SITES:,} sites)")
    assert per_site <= MAX_BYTES_PER_SITE, f"{per_site:,.0f} B per site"
