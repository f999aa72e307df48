"""A crawl that tracks nothing pays nothing for tracking.

Continuous crawling (worker/revisits.py, ack.lua) adds work to an ack only for a tracked
page: a site with none in the call passes no delayed ZSET and no stopped-URL set, reads
no revisit counter and decodes no payload. What a one-page site costs Redis is read from
Redis itself, around one lease call and one ack call of several one-page sites of one
shard (as a worker's round makes them): ``INFO commandstats`` (a script's ``redis.call``
commands are counted under their own names) and the keyspace lookups (``INFO stats``
hits and misses, one per key a command reads). Both must be exactly a fixed table per
site, plus a fixed amount per call: a per-ack HGET of revisit state, one more key, a
counter of tracked pages would each show. ``test_the_measure_sees_tracking_work`` acks
the same pages as tracked pages and shows the measure tells them apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.scripts import ack as ack_script
from streams_sched.frontier.seeding.seeder import Seeder

SITES = 6
WEIGHTS = (8, 3, 1)

#: What a lease of a one-page site costs, per site: its inbox list read (HGET), moved
#: into a stream (XGROUP CREATE, XADD, HDEL, HINCRBY enqueued), its delayed ZSET counted
#: (ZCARD), its policy read (HMGET), the entry leased (XREADGROUP, HINCRBY leased), the
#: site out of both ready indexes and into the leased one.
LEASE_PER_SITE = {
    "hget": 1, "xgroup|create": 1, "xadd": 1, "hdel": 1, "hincrby": 2, "zcard": 1, "hmget": 1,
    "xreadgroup": 1, "zrem": 2, "zadd": 1,
}
#: per lease call: Redis TIME, the shard's halt mark (set while `move` copies the crawl),
#: and the next not-yet-ready site of each ready index
LEASE_PER_CALL = {"evalsha": 1, "time": 1, "get": 1, "zrangebyscore": 2}
LEASE_KEYS_PER_SITE, LEASE_KEYS_PER_CALL = 5, 3

#: What the ack of an untracked one-page site costs: the entry acked (XACK), its stream
#: found to hold just it (XLEN) and deleted (DEL), the site found to have no stream
#: left (EXISTS of its six streams), out of the leased index, its acked counter.
ACK_PER_SITE = {"xack": 1, "xlen": 1, "del": 1, "exists": 1, "zrem": 1, "hincrby": 1}
ACK_PER_CALL = {"evalsha": 1}
ACK_KEYS_PER_SITE, ACK_KEYS_PER_CALL = 8, 0


def expected(per_site: dict[str, int], per_call: dict[str, int], sites: int) -> dict[str, int]:
    out = {cmd: n * sites for cmd, n in per_site.items()}
    for cmd, n in per_call.items():
        out[cmd] = out.get(cmd, 0) + n
    return out


def _snapshot(client: redis.Redis) -> tuple[dict[str, Any], int]:
    stats = client.info("stats")
    return client.info("commandstats"), int(stats["keyspace_hits"]) + int(stats["keyspace_misses"])


def measure(client: redis.Redis, operation: Callable[[], Any]) -> tuple[dict[str, int], int]:
    """The commands Redis ran (script calls and what they call) and the keys it looked up
    while ``operation`` ran; INFO itself left out."""
    before, keys_before = _snapshot(client)
    operation()
    after, keys_after = _snapshot(client)
    calls = {}
    for name, v in after.items():
        n = int(v["calls"]) - int(before.get(name, {}).get("calls", 0))
        cmd = name.removeprefix("cmdstat_")
        if n and cmd != "info":
            calls[cmd] = n
    return calls, keys_after - keys_before


def one_page_sites(url: str, crawl: str) -> tuple[redis.Redis, Frontier, list[str]]:
    """SITES one-page sites of shard 0, seeded as a user seeds them (Seeder)."""
    client = redis.Redis.from_url(url)
    f = Frontier(client, crawl)
    f.ensure_layout()
    sites = [s for s in (f"s{i}.test" for i in range(1000)) if f.site(s).shard == 0][:SITES]
    Seeder(url, crawl).seed([f"http://{s}/" for s in sites])
    f.load_scripts()
    return client, f, sites


def lease(f: Frontier, sites: list[str]) -> list[list[tuple[int, bytes]]]:
    reply = f.lease_shard(0, "w1", [(s, 2, 2, 0) for s in sites], WEIGHTS, name=0)
    leased = [[(e.stream, e.id) for e in part.entries] for part in reply.sites if part is not None]
    assert [len(entries) for entries in leased] == [1] * len(sites)
    return leased


def test_an_untracked_crawl_does_no_tracking_work(plain_redis_url: str, crawl: str) -> None:
    """The lease and the ack of untracked one-page sites run exactly a fixed set of commands and look up a fixed number of keys per site, and the ack passes no tracking key."""
    client, f, sites = one_page_sites(plain_redis_url, crawl)
    leased: list[list[tuple[int, bytes]]] = []
    calls, keys = measure(client, lambda: leased.extend(lease(f, sites)))
    assert calls == expected(LEASE_PER_SITE, LEASE_PER_CALL, SITES)
    assert keys == LEASE_KEYS_PER_SITE * SITES + LEASE_KEYS_PER_CALL
    acks = [(s, entries, None, ()) for s, entries in zip(sites, leased, strict=True)]
    acked: list[int] = []
    calls, keys = measure(client, lambda: acked.extend(f.ack_shard(acks)))
    assert acked == [1] * SITES
    assert calls == expected(ACK_PER_SITE, ACK_PER_CALL, SITES)
    assert keys == ACK_KEYS_PER_SITE * SITES + ACK_KEYS_PER_CALL
    # no key of the tracking: not passed, not made
    passed = ack_script.keys(f.shard(0), [f.site(s) for s in sites])
    for s in sites:
        k = f.site(s)
        assert k.delayed not in passed and k.revisit_stops not in passed
        assert client.exists(k.delayed, k.revisit_stops) == 0
        assert client.hget(k.stats, "tracked") is None and client.hget(k.stats, "revisits") is None
    client.close()


def test_the_measure_sees_tracking_work(plain_redis_url: str, crawl: str) -> None:
    """Acking the same one-page sites as tracked pages differs from the untracked table: the measure catches tracking work."""
    client, f, sites = one_page_sites(plain_redis_url, crawl)
    leased = lease(f, sites)
    payload = b"\x81\xa1u\xaehttp://x.test/"
    acks = [
        (s, [], None, [(stream, entry_id, 60_000, "n", payload, 60_000, 0) for stream, entry_id in entries])
        for s, entries in zip(sites, leased, strict=True)
    ]
    calls, keys = measure(client, lambda: f.ack_shard(acks))
    untracked = expected(ACK_PER_SITE, ACK_PER_CALL, SITES)
    assert calls != untracked
    # the page back in its delayed ZSET and its site in a ready index, per site
    assert calls.get("zadd", 0) >= 2 * SITES, calls
    assert keys > ACK_KEYS_PER_SITE * SITES + ACK_KEYS_PER_CALL
    for s in sites:
        assert client.zcard(f.site(s).delayed) == 1
    client.close()


@pytest.mark.e2e
def test_a_scrapy_worker_listens_for_answers_from_its_first_tracked_page(
    redis_url: str, dedupe: str, crawl: str, tmp_path: Any
) -> None:
    """A real Scrapy worker connects its answer handler only at its first tracked request, and still sees every revisit's answer: the synthetic web's unchanged pages are counted unchanged."""
    from helpers import Worker, base_settings, wait_for

    settings = base_settings(
        redis_url, crawl, dedupe, tmp_path / "items.jsonl", SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=5,
        CONCURRENT_REQUESTS=8, CONCURRENT_REQUESTS_PER_DOMAIN=4, STREAMS_REVISIT_EVERY_SECONDS=1,
        STREAMS_REVISIT_MIN_SECONDS=1, STREAMS_REVISIT_MAX_SECONDS=1, STREAMS_REVISIT_ADAPTIVE=True,
        STREAMS_REVISIT_JITTER=0,
    )
    f = Frontier(redis.Redis.from_url(redis_url), crawl)

    def counted(field: str) -> int:
        return sum(int(f.status(s).stats.get(field, 0)) for s in f.sites())

    worker = Worker(settings, tmp_path / "worker.log")
    try:
        wait_for(lambda: counted("unchanged") >= 10, timeout=60, what="ten revisits counted unchanged")
    finally:
        worker.close()
    # every revisit had its answer: none rescheduled without knowing whether it changed
    assert counted("changed") == 0
