"""Redis eviction and out-of-memory never lose a crawl silently: every component checks the
eviction policy at start, a worker at maxmemory says so once and loses nothing, and the
monitor exports evictions and memory. Real redis-server processes, real workers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from streams_sched.connection import connect
from streams_sched.demo.web import SyntheticWeb
from streams_sched.testing import RedisServer

from helpers import (
    Worker,
    base_settings,
    crawl_to_end,
    crawled_urls,
    read_items,
    start_errors,
)

ALLKEYS = ["--maxmemory-policy", "allkeys-lru"]


@pytest.fixture
def allkeys() -> Iterator[RedisServer]:
    """A Redis with maxmemory-policy allkeys-lru (no maxmemory: the policy alone is refused)."""
    with RedisServer(extra_args=ALLKEYS) as server:
        yield server


def refusal_of(line: str, policy: str = "allkeys-lru") -> bool:
    """True if ``line`` is the refusal: it names the policy, what it does and the fix."""
    return (
        f"has maxmemory-policy {policy}: it evicts any key, including queued requests" in line
        and "CONFIG SET maxmemory-policy noeviction" in line
        and "to run anyway" in line
    )


def keys_in(server: RedisServer) -> int:
    client = connect(server.url)
    try:
        return int(client.dbsize())
    finally:
        client.close()


# -- the worker -------------------------------------------------------------------------


def test_worker_refuses_an_allkeys_redis_at_start(allkeys: RedisServer, crawl: str, tmp_path: Path) -> None:
    """A worker on an allkeys-lru Redis exits 1 at start with one CRITICAL line naming the policy and noeviction, and crawls nothing."""
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(allkeys.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=20), tmp_path / "w.log")
    try:
        assert w.wait(60) == 1, w.log()
        errors = start_errors(w.log())
        assert len(errors) == 1 and refusal_of(errors[0]), w.log()
        assert f"Redis at {allkeys.url}" in errors[0] and "STREAMS_ALLOW_EVICTION = True" in errors[0]
    finally:
        w.close()
    assert read_items(items) == [] and keys_in(allkeys) == 0


def test_worker_with_allow_eviction_starts_and_warns(allkeys: RedisServer, crawl: str, tmp_path: Path) -> None:
    """With STREAMS_ALLOW_EVICTION=True the same worker crawls everything, after one warning that pages can be lost."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(allkeys.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=20, STREAMS_ALLOW_EVICTION=True)
    w = Worker(settings, tmp_path / "w.log")
    crawl_to_end(w)
    log = w.log()
    warnings = [line for line in log.splitlines() if "WARNING" in line and "maxmemory-policy allkeys-lru" in line]
    assert len(warnings) == 1 and "can be lost silently" in warnings[0] and "STREAMS_ALLOW_EVICTION = True is set" in warnings[0]
    assert not start_errors(log)
    assert set(crawled_urls(items)) == SyntheticWeb(sites=1, pages=20).all_urls()


def test_worker_on_volatile_lru_starts_with_the_warning(crawl: str, tmp_path: Path) -> None:
    """A volatile-lru Redis is accepted: one warning names our keys with a TTL, and the crawl completes."""
    items = tmp_path / "items.jsonl"
    with RedisServer(extra_args=["--maxmemory-policy", "volatile-lru"]) as server:
        w = Worker(base_settings(server.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=20), tmp_path / "w.log")
        crawl_to_end(w)
    warnings = [line for line in w.log().splitlines() if "maxmemory-policy volatile-lru" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], w.log()
    assert ":window" in warnings[0] and "revisit buckets" in warnings[0] and "no page is lost" in warnings[0]
    assert set(crawled_urls(items)) == SyntheticWeb(sites=1, pages=20).all_urls()


def test_noeviction_logs_nothing_about_the_policy(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """On the default policy (noeviction) a worker logs no line about maxmemory-policy."""
    items = tmp_path / "items.jsonl"
    w = Worker(base_settings(plain_redis_url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=10), tmp_path / "w.log")
    crawl_to_end(w)
    assert "maxmemory-policy" not in w.log()
