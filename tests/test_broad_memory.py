"""A finished broad crawl (many sites, few pages each) keeps only a few hundred bytes of Redis per site."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis

from streams_sched.demo.web import SyntheticWeb

from helpers import Worker, base_settings, crawl_to_end, crawled_urls, wait_for

pytestmark = pytest.mark.e2e

SITES, PAGES = 300, 3
#: at most 200 bytes per crawled page, every key counted, so a crawl of millions of
#: small sites fits in one Redis
MAX_BYTES_PER_PAGE = 200
#: what a 3-page site keeps: its exact seen set, its stats, its registry entry
MAX_BYTES_PER_SITE = 400


def key_bytes(client: redis.Redis) -> dict[str, int]:
    """MEMORY USAGE of every key, summed by kind: a site's keys by their name after the site
    (seen, stats, q for the streams...), a shard's indexes by theirs (#sites, #stats, ...),
    crawl-level keys by theirs (meta, nodes, ...)."""
    out: dict[str, int] = defaultdict(int)
    for key in client.scan_iter(count=1000):
        name = key.decode()
        tag, _, kind = name.partition("}:")
        if not kind:
            kind = name
        elif "/#" in tag and not kind.startswith("#"):
            kind = kind.split(":", 1)[1]  # ss:{crawl/#n}:<site>:<kind>
        out["q" if kind.startswith("q:") else kind.split(":")[0]] += int(client.memory_usage(key, samples=0) or 0)
    return dict(out)


def test_finished_broad_crawl_costs_under_200_bytes_per_page(
    redis_url: str, dedupe: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """300 sites x 3 pages, crawled to the end: every key of the crawl together is <= 200 B per page, on both back-ends."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items, SYNTH_SEED=True, SYNTH_SITES=SITES, SYNTH_PAGES=PAGES,
        CONCURRENT_REQUESTS=32, CONCURRENT_REQUESTS_PER_DOMAIN=2,
    )
    crawl_to_end(Worker(settings, tmp_path / "w.log"), timeout=300)
    seen = crawled_urls(items)
    assert set(seen) == SyntheticWeb(sites=SITES, pages=PAGES).all_urls()
    assert max(seen.values()) == 1

    client = redis.Redis.from_url(redis_url)
    # the answers each site gave over the last second (feedback.lua's window keys) expire 3 s
    # after its last page: a finished crawl keeps none
    wait_for(lambda: "window" not in key_bytes(client), timeout=30, what="the window keys to expire")
    by_kind = key_bytes(client)
    total = sum(by_kind.values())
    pages = len(seen)
    measured(f"{total / pages:.0f} B/page, {total / SITES:.0f} B/site: {by_kind}")
    assert "q" not in by_kind, by_kind  # every emptied stream was retired with its group
    assert total / pages <= MAX_BYTES_PER_PAGE, (total / pages, by_kind)
    assert total / SITES <= MAX_BYTES_PER_SITE, (total / SITES, by_kind)
    # each seen filter is still an exact set: 8 bytes per URL of the site, no pre-sized Bloom filter
    assert by_kind["seen"] / SITES < 150, by_kind
