"""How many crawled pages per second one Redis (or a Redis Cluster) holds as a frontier.

Replays the Redis side of a crawl without Scrapy: client processes do what a
worker's I/O thread does, in one pipeline per cycle and with the real scripts:

- enqueue each processed page's links (per page: 1 new link and 2 that the
  worker's local cache missed, i.e. duplicates Redis must check),
- ack the processed pages,
- lease the next pages (up to 8 per site from 4 sites per cycle).

The backlog stays constant (one new page per page crawled). Reports pages/s
and the Redis CPU time per page (INFO cpu, summed over the nodes), from which
"pages/s at 100% of one Redis core" = 1 / CPU seconds per page. On a machine
where the clients share cores with Redis, that CPU-normalised figure is the
one to trust; pages/s is a lower bound.

    python bench/redis_capacity.py                       # own redis-servers: plain, RedisBloom, 3-master cluster
    python bench/redis_capacity.py --redis-url redis://host:6379/0 --seconds 30 --clients 8
"""

from __future__ import annotations

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import random
import sys
import time
from collections import defaultdict
from typing import Any

from streams_sched.connect.clients import connect, is_cluster_client
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import ack, enqueue, lease
from streams_sched.testing import RedisServer, find_redisbloom
from streams_sched.wire.codec import RequestCodec
from tests.redis_tools import LocalCluster

SITES = 64
SEED_PER_SITE = 200
SITES_PER_CYCLE = 4
PER_SITE = 8


def fp(text: str) -> bytes:
    return hashlib.sha1(text.encode()).digest()


def payload(url: str) -> bytes:
    from scrapy import Request

    return RequestCodec(None).encode(Request(url, headers={"Referer": url}, meta={"depth": 3}))


def nodes(client: Any) -> list[Any]:
    if is_cluster_client(client):
        return [n.redis_connection for n in client.get_primaries()]
    return [client]


def redis_cpu(client: Any) -> float:
    total = 0.0
    for node in nodes(client):
        info = node.info("cpu")
        total += float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return total


def seed(url: str, crawl: str) -> None:
    client = connect(url)
    f = Frontier(client, crawl, crawl_bloom(client, crawl))
    f.scripts.load()
    pipe = client.pipeline(transaction=False)
    sites = [f"s{i}.bench" for i in range(SITES)]
    f.register_sites(sites, pipe)
    for site in sites:
        items = [Entry(fp(f"{site}/seed{j}"), 1, 0, payload(f"http://{site}/seed{j}")) for j in range(SEED_PER_SITE)]
        enqueue.call(f, [(site, items)]).queue(pipe)
    pipe.execute()


def client_loop(url: str, crawl: str, n: int, seconds: float, out: Any) -> None:
    client = connect(url)
    f = Frontier(client, crawl, crawl_bloom(client, crawl))
    rng = random.Random(n)
    sites = [f"s{i}.bench" for i in range(SITES)]
    consumer = f"bench-{n}"
    held: list[Any] = []
    pages = cycles = 0
    known: dict[str, list[bytes]] = defaultdict(list)
    start = time.monotonic()
    end = start + seconds
    while time.monotonic() < end:
        pipe = client.pipeline(transaction=False)
        by_site: dict[str, list[Any]] = defaultdict(list)
        for e in held:
            by_site[e.site].append(e)
        for site, entries in by_site.items():
            links = []
            for e in entries:
                new = f"{site}/{consumer}/{pages}/{e.id.decode()}"
                links.append(Entry(fp(new), 1, 0, payload("http://" + new)))
                dups = known[site][-50:] or [fp(new)]
                links += [Entry(rng.choice(dups), 1, 0, b"dup") for _ in range(2)]
                known[site].append(fp(new))
            enqueue.call(f, [(site, links)]).queue(pipe)
            ack.call(f, [(site, [(e.stream, e.id) for e in entries], None, ())]).queue(pipe)
        asked = rng.sample(sites, SITES_PER_CYCLE)
        leases = [
            lease.call(f, f.site(site).shard or 0, consumer, [(site, PER_SITE, PER_SITE, 0)], (8, 3, 1))
            for site in asked
        ]
        for call in leases:
            call.queue(pipe)
        replies = pipe.execute()
        pages += len(held)
        held = []
        for call, reply in zip(leases, replies[-SITES_PER_CYCLE:], strict=True):
            part = call.parse(reply).sites[0]
            held += part.entries if part is not None else []
        cycles += 1
    out.put({"pages": pages, "cycles": cycles, "seconds": time.monotonic() - start})


def run(url: str, label: str, clients: int, seconds: float) -> dict[str, Any]:
    crawl = f"bench{os.getpid()}{int(time.time())}"
    seed(url, crawl)
    client = connect(url)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=client_loop, args=(url, crawl, n, seconds, out)) for n in range(clients)]
    cpu0 = redis_cpu(client)
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    wall = time.monotonic() - t0
    cpu = redis_cpu(client) - cpu0
    pages = sum(r["pages"] for r in results)
    rate = pages / max(r["seconds"] for r in results)
    per_page_us = cpu / pages * 1e6
    mem = sum(int(n.info("memory")["used_memory"]) for n in nodes(client))
    Frontier(client, crawl).purge()
    return {
        "target": label,
        "clients": clients,
        "pages_per_s": round(rate),
        "redis_cpu_s": round(cpu, 2),
        "redis_cpu_share": round(cpu / wall, 2),
        "redis_cpu_us_per_page": round(per_page_us, 1),
        "pages_per_s_per_redis_core": round(1e6 / per_page_us),
        "used_memory_mb": round(mem / 1e6, 1),
    }


def memory_per_entry(url: str, n: int = 100_000) -> dict[str, Any]:
    """Bytes of Redis memory per queued request (stream entry with a typical payload)
    and per fingerprint in the seen filter, from used_memory before and after."""
    client = connect(url)
    crawl = f"mem{os.getpid()}"
    f = Frontier(client, crawl, crawl_bloom(client, crawl, capacity=n))
    f.scripts.load()
    sample = payload("http://example.com/some/path/page-123456?ref=listing&sort=desc")
    before = int(client.info("memory")["used_memory"])
    for i in range(0, n, 1000):
        f.enqueue("m.bench", [Entry(fp(f"m{j}"), 1, 0, sample) for j in range(i, i + 1000)])
    after_enqueue = int(client.info("memory")["used_memory"])
    seen_bytes = int(client.memory_usage(f.site("m.bench").seen) or 0)
    f.purge()
    return {
        "payload_bytes": len(sample),
        "bytes_per_queued_request": round((after_enqueue - before - seen_bytes) / n),
        "bytes_per_fingerprint": round(seen_bytes / n, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--redis-url", help="measure this Redis instead of starting our own")
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    args = parser.parse_args(argv)
    rows = []
    if args.redis_url:
        rows.append(run(args.redis_url, "given", args.clients, args.seconds))
    else:
        with RedisServer() as plain:
            rows.append(run(plain.url, "redis-server (bitmap Bloom)", args.clients, args.seconds))
            rows.append({"target": "memory, bitmap Bloom", **memory_per_entry(plain.url)})
        if find_redisbloom():
            with RedisServer(bloom=True) as bloom:
                rows.append(run(bloom.url, "redis-server + RedisBloom", args.clients, args.seconds))
                rows.append({"target": "memory, RedisBloom", **memory_per_entry(bloom.url)})
        with LocalCluster(3, bloom=find_redisbloom() is not None) as cluster:
            rows.append(run(cluster.url, "3-master cluster", args.clients, args.seconds))
    for row in rows:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
