"""(c) Raw frontier operations per second, without Scrapy.

streams-sched goes through ``Frontier.enqueue/lease/ack`` with a pipeline the
way the I/O thread batches them: per cycle one pipeline holding one
``enqueue.lua`` call per site (or one ``lease.lua`` per site plus the acks of
the previous batch). scrapy-redis is measured with the exact Redis calls its
scheduler makes per request, one round trip each: ``SADD`` of the 40-hex
fingerprint (dupefilter), ``ZADD`` of the pickled request (PriorityQueue.push)
and ``MULTI ZRANGE ZREMRANGEBYRANK EXEC`` (PriorityQueue.pop); it has no ack.
Payloads are pre-encoded and fingerprints precomputed on both sides: the codec
is measured in (e). Half of every enqueue batch repeats fingerprints that are
already in the filter, so both dedupe paths run.
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

import msgpack
import redis

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.records import BloomParams, Entry, ShardLease
from streams_sched.frontier.scripts import Call, ack, enqueue, lease
from streams_sched.frontier.scripts.lease import LeaseOptions

__all__ = ["run_frontier_ops"]

SITES = 10
PAYLOAD = msgpack.packb({"u": "http://site3.test/p/123456", "c": "parse", "mt": {"depth": 7}})
PICKLED = os.urandom(260)  # what scrapy-redis stores: a pickled Request.to_dict(), ~260 bytes


def _fps(n: int, salt: bytes) -> list[bytes]:
    return [hashlib.sha1(salt + i.to_bytes(8, "big")).digest() for i in range(n)]


def streams_enqueue(client: redis.Redis, mode: str, n: int, per_site_batch: int) -> float:
    """Enqueue ``n`` requests (half duplicates); return requests offered per second."""
    f = Frontier(client, f"ops{mode}", BloomParams(mode=mode, capacity=max(n, 1000)))
    f.scripts.load()
    sites = [f"site{i}.test" for i in range(SITES)]
    fresh = _fps(n // 2, b"new" + mode.encode())
    # the duplicates: insert them first, outside the timed part
    dups = _fps(n - n // 2, b"dup" + mode.encode())
    _enqueue_all(f, sites, dups, per_site_batch, payload=b"x")
    client.delete(*[k for s in sites for k in f.site(s).streams])
    mixed = [fp for pair in zip(fresh, dups, strict=False) for fp in pair]
    t = time.perf_counter()
    _enqueue_all(f, sites, mixed, per_site_batch, payload=PAYLOAD)
    return len(mixed) / (time.perf_counter() - t)


def _enqueue_all(f: Frontier, sites: list[str], fps: list[bytes], per_site_batch: int, payload: bytes) -> None:
    step = per_site_batch * len(sites)
    for start in range(0, len(fps), step):
        pipe = f.client.pipeline(transaction=False)
        chunk = fps[start : start + step]
        for i, site in enumerate(sites):
            items = [Entry(fp, 1, 0, payload) for fp in chunk[i :: len(sites)]]
            if items:
                enqueue.call(f, [(site, items)]).queue(pipe)
        pipe.execute()


def streams_lease_ack(client: redis.Redis, n: int, per_site_batch: int) -> float:
    """Lease ``n`` entries in batches and ack each batch in the next pipeline; entries per second."""
    f = Frontier(client, "opslease", BloomParams(mode="bitmap", capacity=max(n, 1000)))
    f.scripts.load()
    sites = [f"site{i}.test" for i in range(SITES)]
    _enqueue_all(f, sites, _fps(n, b"lease"), 256, payload=PAYLOAD)
    weights = (8, 3, 1)
    done = 0
    acks: dict[str, list[tuple[int, bytes]]] = {}
    t = time.perf_counter()
    while True:
        pipe = client.pipeline(transaction=False)
        for site, entries in acks.items():
            ack.call(f, [(site, entries, None, ())]).queue(pipe)
        leases = [_lease_one(f, site, "bench", per_site_batch, weights) for site in sites]
        for call in leases:
            call.queue(pipe)
        replies = pipe.execute()[len(acks) :]
        acks = {}
        for site, call, reply in zip(sites, leases, replies, strict=True):
            r = call.parse(reply).sites[0]
            if r is not None and r.entries:
                acks[site] = [(e.stream, e.id) for e in r.entries]
                done += len(r.entries)
        if not acks:
            break
    return done / (time.perf_counter() - t)


def _lease_one(f: Frontier, site: str, consumer: str, n: int, weights: tuple[int, int, int]) -> Call[ShardLease]:
    """A lease.lua call for up to ``n`` http entries of one site."""
    return lease.call(f, f.site(site).shard or 0, consumer, [(site, n, n, 0)], weights, LeaseOptions(max_suspects=0))


def scrapy_redis_enqueue(client: redis.Redis, n: int) -> float:
    """SADD per request, ZADD per new one, as scrapy-redis' scheduler does; requests per second."""
    dkey, qkey = "sr:dupefilter", "sr:requests"
    fresh = [fp.hex() for fp in _fps(n // 2, b"srnew")]
    dups = [fp.hex() for fp in _fps(n - n // 2, b"srdup")]
    pipe = client.pipeline(transaction=False)
    for fp in dups:
        pipe.sadd(dkey, fp)
    pipe.execute()
    mixed = [fp for pair in zip(fresh, dups, strict=False) for fp in pair]
    t = time.perf_counter()
    for i, fp in enumerate(mixed):
        if client.sadd(dkey, fp):
            client.execute_command("ZADD", qkey, 0, PICKLED + i.to_bytes(8, "big"))
    return len(mixed) / (time.perf_counter() - t)


def scrapy_redis_pop(client: redis.Redis, n: int) -> float:
    """Pop ``n`` requests as PriorityQueue.pop does (one MULTI/EXEC each); requests per second."""
    qkey = "sr:pop"
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.execute_command("ZADD", qkey, 0, PICKLED + i.to_bytes(8, "big"))
    pipe.execute()
    t = time.perf_counter()
    got = 0
    while True:
        pipe = client.pipeline()
        pipe.multi()
        pipe.zrange(qkey, 0, 0).zremrangebyrank(qkey, 0, 0)
        results, _ = pipe.execute()
        if not results:
            break
        got += 1
    return got / (time.perf_counter() - t)


def round_trip_us(client: redis.Redis, n: int = 2000) -> float:
    t = time.perf_counter()
    for _ in range(n):
        client.ping()
    return 1e6 * (time.perf_counter() - t) / n


def run_frontier_ops(bloom_url: str, n: int, per_site_batch: int = 64, lease_batch: int = 16) -> dict[str, Any]:
    client = redis.Redis.from_url(bloom_url)
    client.flushall()
    out: dict[str, Any] = {"n": n, "enqueue_batch_per_site": per_site_batch, "lease_batch_per_site": lease_batch}
    out["ping_round_trip_us"] = round_trip_us(client)
    out["streams_enqueue_bf"] = streams_enqueue(client, "bf", n, per_site_batch)
    client.flushall()
    out["streams_enqueue_bitmap"] = streams_enqueue(client, "bitmap", n, per_site_batch)
    client.flushall()
    out["streams_lease_ack"] = streams_lease_ack(client, n, lease_batch)
    client.flushall()
    out["scrapy_redis_enqueue"] = scrapy_redis_enqueue(client, n)
    client.flushall()
    out["scrapy_redis_pop"] = scrapy_redis_pop(client, n)
    client.flushall()
    client.close()
    return out
