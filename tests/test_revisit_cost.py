"""What runs every round costs the same with 100 or 100,000 tracked pages waiting.

A tracked page waiting for its next visit is one member of its site's delayed ZSET
(worker/revisits.py, ack.lua). A lease round (lease.lua on the sites it names), a
reclaimer pass (its claim and promote passes) and the drain check must cost what the due
pages and the sites cost, never what waits: the same state is built twice, once with
100 pages waiting and once with 100,000 (1,000x more, on the same 4 sites, with the same
due pages), and each operation's Redis work is compared.

The work of an operation is read from Redis itself, around the operation:

- ``INFO commandstats``: the calls of every command, those a script makes with
  ``redis.call`` included (Redis counts them under their own names), so a loop over
  the waiting pages (a ZSCORE or a ZREM per member) shows as 1,000x the calls;
- ``INFO stats`` keyspace hits and misses: the keys looked up, so a key read per page
  shows;
- the microseconds Redis spent in each command (commandstats ``usec``), the least of
  three builds: one command that reads every waiting member (a ZRANGE 0 -1 of the
  delayed ZSET, a ZRANGEBYSCORE without a LIMIT, ZCARD-sized loops in Lua) has the same
  call count at both sizes, but reading 25,000 members of about 130 bytes takes
  milliseconds against the few microseconds of a bounded read, far above the bound used
  here (twice the small state's time plus 100 µs a call).
  ``test_the_measure_catches_a_scan`` runs such a scan to show the comparison fails it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from scrapy import Request

from reclaimer.core import Reclaimer
from reclaimer.settings import ReclaimerSettings
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.indexes import server_ms
from streams_sched.frontier.keys import stream_code
from streams_sched.wire.codec import RequestCodec

SITES = tuple(f"shop{i}.test" for i in range(4))
SMALL, BIG = 100, 100_000
#: due pages per site: the lease round promotes two, the reclaimer's promote pass the rest
DUE = 4
WEIGHTS = (8, 3, 1)
HTTP_DEFAULT = 1  # the stream of an ordinary page (http, default band)
REPEATS = 3
#: a command may take twice its time in the small state plus this much a call
SLACK_US_PER_CALL = 100


def tracked_payloads(codec: RequestCodec, site: str, n: int) -> list[bytes]:
    """Payloads of ``n`` tracked pages of ``site`` as ack.lua stores them: the request with
    its tracking meta and its state (interval, last signature)."""
    meta = {"revisit": {"every": 3600, "adaptive": True}, "_rv": [3_600_000, 2_670_437_610]}
    return [codec.encode(Request(f"https://{site}/products/item-{i:06d}?ref=catalog", meta=meta)) for i in range(n)]


@dataclass
class Built:
    """The payloads of the waiting and due pages, encoded once for the three builds."""

    waiting: dict[str, list[bytes]]
    due: dict[str, list[bytes]]


def payloads(waiting: int) -> Built:
    codec = RequestCodec(None)
    per_site = waiting // len(SITES)
    return Built(
        {s: tracked_payloads(codec, s, per_site) for s in SITES},
        {s: tracked_payloads(codec, s + ".due", DUE) for s in SITES},
    )


def build(client: redis.Redis, crawl: str, built: Built) -> Frontier:
    """An emptied Redis, then the crawl's tracked pages as ack.lua leaves them: members
    ``<stream>:<seq>:<payload>`` scored by their due time, the site in both ready indexes
    at its soonest due time, its stats; written with a pipeline, not page by page through
    the scripts, so 100,000 pages take a second."""
    client.flushall()
    client.script_flush()
    f = Frontier(client, crawl)
    f.ensure_layout()
    f.register()
    f.load_scripts()
    now = server_ms(client)
    code = stream_code(HTTP_DEFAULT)
    pipe = client.pipeline(transaction=False)
    for site in SITES:
        k = f.site(site)
        seq = 0
        members: dict[bytes, int] = {}
        for i, p in enumerate(built.waiting[site]):
            seq += 1
            # not due: from an hour to a day from now
            members[f"{code}::".encode() + p] = now + 3_600_000 + i * 1000
        for p in built.due[site]:
            seq += 1
            members[f"{code}::".encode() + p] = now - 1000
        items = list(members.items())
        for i in range(0, len(items), 2000):
            pipe.zadd(k.delayed, dict(items[i : i + 2000]))
        pipe.hset(k.stats, mapping={"tracked": seq, "revisits": seq})
        for ready in k.index.readies:
            pipe.zadd(ready, {site: now - 1000}, lt=True)
        f.register_sites([site], pipe=pipe)
        pipe.execute()
    return f


@dataclass
class Work:
    """What Redis did during one operation."""

    calls: dict[str, int] = field(default_factory=dict)
    usec: dict[str, int] = field(default_factory=dict)
    keys_looked_up: int = 0


def _snapshot(client: redis.Redis) -> tuple[dict[str, Any], int]:
    stats = client.info("stats")
    return client.info("commandstats"), int(stats["keyspace_hits"]) + int(stats["keyspace_misses"])


def measure(client: redis.Redis, operation: Callable[[], Any]) -> Work:
    """The commands (script calls and what they call), their time and the keys looked up
    while ``operation`` runs; INFO and CONFIG themselves left out."""
    before, keys_before = _snapshot(client)
    operation()
    after, keys_after = _snapshot(client)
    w = Work(keys_looked_up=keys_after - keys_before)
    for name, v in after.items():
        cmd = name.removeprefix("cmdstat_")
        if cmd == "info" or cmd.startswith("config"):
            continue
        calls = int(v["calls"]) - int(before.get(name, {}).get("calls", 0))
        if calls:
            w.calls[cmd] = calls
            w.usec[cmd] = int(v["usec"]) - int(before.get(name, {}).get("usec", 0))
    return w


def lease_round(f: Frontier) -> None:
    """One lease call per shard on the tracked sites, as a worker's round makes it: it
    promotes two due pages per site, leases them and names the shard's ready sites."""
    by_shard: dict[int, list[tuple[str, int, int, int]]] = {}
    for site in SITES:
        by_shard.setdefault(f.site(site).shard, []).append((site, 8, 8, 0))
    for shard, plans in sorted(by_shard.items()):
        reply = f.lease_shard(shard, "w1", plans, WEIGHTS, name=8, spread=0, promote_limit=2)
        assert [len(part.entries) for part in reply.sites if part is not None] == [2] * len(plans)


def leases_expired(client: redis.Redis, leased_at_ms: int) -> None:
    """Wait (on Redis TIME, with a deadline) until a lease taken at ``leased_at_ms`` is
    older than the reclaimer's 1 ms lease."""
    deadline = time.monotonic() + 5
    while server_ms(client) <= leased_at_ms + 2:
        assert time.monotonic() < deadline, "Redis TIME did not move"


def reclaimer_round(client: redis.Redis, crawl: str) -> None:
    """One reclaimer pass, in-process: with a 1 ms lease, its claim pass requeues what
    the lease round leased, and its promote pass moves the due pages the lease round left."""
    settings = ReclaimerSettings(crawls=(crawl,), lease_s=0.001, burst=True, prune_interval_s=3600.0)
    result = Reclaimer(settings, client).run_pass()
    [c] = result.crawls
    assert c.requeued == 2 * len(SITES) and c.promoted == (DUE - 2) * len(SITES), c


def drain_check(f: Frontier) -> None:
    """What a worker's drain check reads (io/drain_check.py): the shards' counts."""
    f.shard_counts()


def round_works(client: redis.Redis, crawl: str, built: Built,
                extra: Callable[[Frontier], Any] | None = None) -> list[dict[str, Work]]:
    """Each operation's work, in order, for each of REPEATS fresh builds."""
    out = []
    for _ in range(REPEATS):
        f = build(client, crawl, built)
        works = {"lease round": measure(client, lambda: lease_round(f))}
        leases_expired(client, server_ms(client))
        works |= {
            "reclaimer pass": measure(client, lambda: reclaimer_round(client, crawl)),
            "drain check": measure(client, lambda: drain_check(f)),
        }
        if extra is not None:
            works["extra"] = measure(client, lambda: extra(f))
        out.append(works)
    return out


def differences(small: list[dict[str, Work]], big: list[dict[str, Work]]) -> list[str]:
    """How the big state's work exceeds the small one's, per operation ([] = the same):
    the calls and keys of each build must be equal, and each command's least time over
    the builds within SLACK of the small state's."""
    out = []
    for op in small[0]:
        for i, (s, b) in enumerate(zip(small, big, strict=True)):
            if s[op].calls != b[op].calls:
                out.append(f"{op}, build {i}: commands {s[op].calls} with {SMALL} waiting, {b[op].calls} with {BIG}")
            if s[op].keys_looked_up != b[op].keys_looked_up:
                out.append(f"{op}, build {i}: {s[op].keys_looked_up} keys looked up with {SMALL} waiting,"
                           f" {b[op].keys_looked_up} with {BIG}")
        for cmd, calls in big[0][op].calls.items():
            t_small = min(w[op].usec.get(cmd, 0) for w in small)
            t_big = min(w[op].usec.get(cmd, 0) for w in big)
            if t_big > 2 * t_small + SLACK_US_PER_CALL * calls:
                out.append(f"{op}: {cmd} took {t_big} µs with {BIG} waiting, {t_small} µs with {SMALL}"
                           f" ({calls} calls)")
    return out


@pytest.fixture(scope="module")
def built() -> dict[int, Built]:
    return {SMALL: payloads(SMALL), BIG: payloads(BIG)}


def test_a_round_costs_the_same_whatever_waits(plain_redis_url: str, crawl: str, built: dict[int, Built]) -> None:
    """A lease round, a reclaimer pass and the drain check make the same commands, look up the same keys and take about the same time with 100 and 100,000 tracked pages waiting."""
    client = redis.Redis.from_url(plain_redis_url)
    small = round_works(client, crawl, built[SMALL])
    big = round_works(client, crawl, built[BIG])
    assert differences(small, big) == []
    # the rounds did their work: the due pages moved, the waiting ones stayed
    f = Frontier(client, crawl)
    for site in SITES:
        assert client.zcard(f.site(site).delayed) == BIG // len(SITES)
    assert small[0]["lease round"].calls.get("evalsha") == len({f.site(s).shard for s in SITES})
    client.close()


def test_the_measure_catches_a_scan(plain_redis_url: str, crawl: str, built: dict[int, Built]) -> None:
    """One read of every waiting member per site (a ZRANGE 0 -1 in a script, as an O(tracked) scan would make) fails the comparison."""
    client = redis.Redis.from_url(plain_redis_url)
    scan = client.register_script("return #redis.call('ZRANGE', KEYS[1], 0, -1)")

    def read_every_member(f: Frontier) -> None:
        for site in SITES:
            scan(keys=[f.site(site).delayed])

    small = round_works(client, crawl, built[SMALL], read_every_member)
    big = round_works(client, crawl, built[BIG], read_every_member)
    found = differences(small, big)
    # only the scan differs, and by far: its ZRANGE (and the script around it) take
    # milliseconds against microseconds, with the same calls at both sizes
    assert any(d.startswith("extra: zrange took") for d in found), found
    assert all(d.startswith("extra: ") and " took " in d for d in found), found
    client.close()
