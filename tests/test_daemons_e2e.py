"""End-to-end with real Scrapy workers: worker metrics add up to the monitor's, and the
reclaimer hands a SIGKILLed worker's leases to another worker within lease time + one interval."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from streams_sched import seed
from streams_sched.demo.web import SyntheticWeb
from streams_sched.frontier.keys import GROUP
from streams_sched.testing import free_port

from daemons import Daemon, scrape, try_scrape, value
from helpers import Worker, base_settings, crawled_urls, frontier, read_items, wait_for

pytestmark = pytest.mark.e2e


def test_worker_metrics_add_up_to_the_monitor_and_redis(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """Two workers export leased/acked/dedupe/latency; their acks sum to the monitor's and to Redis."""
    items = tmp_path / "items.jsonl"
    ports = [free_port(), free_port()]
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=2, SYNTH_PAGES=60, SYNTH_DELAY_SECONDS=0.1, STREAMS_CLOSE_ON_DRAIN=False
    )

    def start(n: int) -> Worker:
        extra = {"SYNTH_SEED": n == 0, "STREAMS_METRICS_PORT": str(ports[n]), "RECORD_TAG": f"w{n}"}
        return Worker({**settings, **extra}, tmp_path / f"w{n}.log")

    mport = free_port()
    mon = Daemon("monitor", ["--redis-url", plain_redis_url, "--metrics-port", str(mport), "--cache-seconds", "0"], tmp_path / "m.log")
    # The idle worker is up and polling before the seeding one starts, so both take part.
    workers = [start(1)]
    try:
        wait_for(lambda: try_scrape(ports[1]) is not None, timeout=60, what="the idle worker's metrics")
        workers.append(start(0))
        wait_for(lambda: len(read_items(items)) >= 120, timeout=90, what="120 pages")
        f = frontier(plain_redis_url, crawl)

        def settled() -> tuple | None:
            w = [try_scrape(p) for p in ports]
            if None in w:
                return None
            acked = [value(m, "streams_sched_worker_acked_total", crawl=crawl, node=_node(m)) for m in w]
            redis_acked = sum(f.status(s).stats.get("acked", 0) for s in f.sites())
            return (w, acked) if sum(acked) == redis_acked == 120 else None

        w, acked = wait_for(settled, timeout=30, what="the workers' stats to settle")
        m = scrape(mport)
        monitor_acked = sum(v for k, v in m["streams_sched_acked_total"].items() if dict(k)["crawl"] == crawl)
        assert monitor_acked == sum(acked) == 120
        assert all(a > 0 for a in acked), acked  # both took part
        for metrics in w:
            node = _node(metrics)
            leased = value(metrics, "streams_sched_worker_leased_total", crawl=crawl, node=node)
            ack = value(metrics, "streams_sched_worker_acked_total", crawl=crawl, node=node)
            assert leased == ack  # nothing left in flight
            assert value(metrics, "streams_sched_worker_lease_to_ack_seconds_count", crawl=crawl, node=node) == ack
            assert value(metrics, "streams_sched_worker_lease_to_ack_seconds_sum", crawl=crawl, node=node) > 0
            assert value(metrics, "streams_sched_worker_reclaimed_total", crawl=crawl, node=node) == 0
        hits = sum(value(x, "streams_sched_worker_dedupe_hits_total", crawl=crawl, node=_node(x)) for x in w)
        enq = sum(value(x, "streams_sched_worker_enqueued_total", crawl=crawl, node=_node(x)) for x in w)
        assert enq == 120 and hits > 120  # every page links to pages seen before
        assert value(m, "streams_sched_nodes", crawl=crawl, state="alive") == 2
    finally:
        for wk in workers:
            wk.close()
        mon.close()


def _node(metrics: dict) -> str:
    (labels,) = metrics["streams_sched_worker_acked_total"].keys()
    return dict(labels)["node"]


def _ts(event: dict) -> float:
    return datetime.fromisoformat(event["timestamp"].replace("Z", "+00:00")).timestamp()


def test_reclaimer_hands_a_killed_workers_leases_to_another(plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any) -> None:
    """SIGKILL a worker holding leases: the reclaimer requeues them within lease + one interval, another worker crawls them."""
    lease_s, interval_s = 3.0, 1.0
    web = SyntheticWeb(sites=1, pages=6)
    client = redis.Redis.from_url(plain_redis_url)
    seed(client, crawl, sorted(web.all_urls()))
    items = tmp_path / "items.jsonl"
    common = base_settings(plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=1, SYNTH_PAGES=6)
    rec = Daemon("reclaimer", ["--redis-url", plain_redis_url, "--interval", str(interval_s), "--prefix", crawl,
                               "--lease-seconds", str(lease_s)], tmp_path / "r.log")
    # A never finishes a page
    a = Worker({**common, "SYNTH_DELAY_SECONDS": 120, "STREAMS_LEASE_SECONDS": lease_s, "RECORD_TAG": "a"}, tmp_path / "a.log")
    b = None
    f = frontier(plain_redis_url, crawl)
    stream = f.site("site0.test").stream("http", "default")
    try:
        # six seeds wait in the shard's inbox: the stream exists from A's first lease on
        held = wait_for(lambda: client.exists(stream) and (p := client.xpending(stream, GROUP))["pending"] == 6 and p,
                        timeout=60, what="A to lease all 6")
        a_node = held["consumers"][0]["name"].decode()
        idle_ms = max(e["time_since_delivered"] for e in client.xpending_range(stream, GROUP, "-", "+", 10))
        leased_at = time.time() - idle_ms / 1000
        a.kill()
        # B's own lease is 60 s, so B cannot take A's leases by itself: only the reclaimer can hand them over
        b = Worker({**common, "STREAMS_LEASE_SECONDS": 60, "RECORD_TAG": "b"}, tmp_path / "b.log")
        assert b.wait(90) == 0, b.log()
        events = rec.named("reclaimed")
        assert sum(e["requeued"] for e in events) == 6
        requeued_after = _ts(events[-1]) - leased_at
        crawled = [i for i in read_items(items) if i["worker"] == "b"]
        handed_after = max(i["ts"] for i in crawled) - leased_at
        measured(f"leases requeued {requeued_after:.2f}s after A leased them"
                 f" (lease {lease_s:g}s + interval {interval_s:g}s); B finished them {handed_after:.2f}s after")
        assert lease_s - 0.05 <= requeued_after <= lease_s + interval_s + 1.0  # + slack for a loaded machine
        assert handed_after <= lease_s + interval_s + 10  # B takes requeued entries one at a time
        assert set(crawled_urls(items)) == web.all_urls() and len(crawled) == 6
        assert "took over" not in b.log()
        assert a_node in f.nodes()
    finally:
        a.close()
        if b is not None:
            b.close()
        rec.close()
