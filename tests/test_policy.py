"""Scheduling policy with real worker processes: global rate limits, weights, bands,
browser routing and caps, live changes, pause/resume, revisits."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis

from streams_sched import seed
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.records import BloomParams, Entry
from streams_sched.politeness.policy import get_policy, pause_site, resume_site

from helpers import (
    Worker,
    base_settings,
    crawl_to_end,
    crawled_urls,
    max_in_window,
    read_items,
    subscribe_events,
    wait_for,
    wait_heartbeats,
)

pytestmark = pytest.mark.e2e


def downloads(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def test_rate_limit_holds_across_workers(plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any) -> None:
    """Two workers together never send a rate-limited site more than rate + burst in any second,
    and keep serving an unlimited site meanwhile."""
    rec = tmp_path / "downloads.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl",
        SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=60, SYNTH_RECORD_FILE=str(rec),
        STREAMS_SITES={"site0.test": {"rate": 8, "burst": 4}},
    )
    workers = [Worker({**settings, "RECORD_TAG": f"w{i}"}, tmp_path / f"w{i}.log") for i in range(2)]
    crawl_to_end(*workers, timeout=180)
    rows = downloads(rec)
    limited = [r["t"] for r in rows if "site0.test" in r["url"]]
    free = [r["t"] for r in rows if "site1.test" in r["url"]]
    assert len(limited) == 60 and len(free) == 60
    duration = max(limited) - min(limited)
    measured(f"rate 8/s + burst 4 over 2 workers: busiest 1 s window {max_in_window(limited)} requests (bound 12);"
             f" 60 pages in {duration:.1f}s ({59 / duration:.1f}/s); the unlimited site done {max(limited) - max(free):.1f}s earlier")
    assert max_in_window(limited) <= 8 + 4
    assert duration >= (60 - 4) / 8 * 0.9  # it really was held to the rate
    assert {r["worker"] for r in rows if "site0.test" in r["url"]} == {"w0", "w1"}
    assert max(free) < max(limited) - 2  # the unlimited site did not wait for the limited one


def test_weights_share_a_busy_worker(plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any) -> None:
    """With weights 3:1 and both sites backlogged, a worker serves them within 10% of 3:1 once it knows the weights."""
    rec = tmp_path / "downloads.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl",
        SYNTH_SITES=2, SYNTH_PAGES=800, SYNTH_RECORD_FILE=str(rec), SYNTH_DELAY_SECONDS=0.01,
        CONCURRENT_REQUESTS=4, CONCURRENT_REQUESTS_PER_DOMAIN=4, CLOSESPIDER_ITEMCOUNT=400,
        STREAMS_SITES={"site0.test": {"weight": 3}, "site1.test": {"weight": 1}},
    )
    client = redis.Redis.from_url(plain_redis_url)
    # both sites backlogged before the worker starts
    from streams_sched.demo.web import SyntheticWeb

    web = SyntheticWeb(sites=2, pages=800)
    seed(client, crawl, [web.url(s, p) for s in range(2) for p in range(400)])
    w = Worker(settings, tmp_path / "w.log")
    crawl_to_end(w, timeout=180)
    # The first lease round goes out before the worker has read either site's weight (a
    # lease reply carries it), so it leases both alike: the share is measured after it, over
    # 360 downloads, where a few early or late ones move the ratio by less than its bounds.
    after_start = [r["url"] for r in downloads(rec)][20:380]
    counts = Counter("site0" if "site0.test" in u else "site1" for u in after_start)
    ratio = counts["site0"] / counts["site1"]
    measured(f"weights 3:1, downloads 21-380: {counts['site0']}:{counts['site1']} = {ratio:.2f}:1 (allowed 2.7-3.3)")
    assert 2.7 <= ratio <= 3.3, counts


def test_band_ratio_serves_every_band(plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any) -> None:
    """With STREAMS_BAND_RATIO 5:3:2 and all bands backlogged, low is served from the start."""
    rec = tmp_path / "downloads.jsonl"
    client = redis.Redis.from_url(plain_redis_url)
    from streams_sched.demo.web import SyntheticWeb

    web = SyntheticWeb(sites=1, pages=300)
    for prio, pages in ((5, range(0, 100)), (0, range(100, 200)), (-5, range(200, 300))):
        seed(client, crawl, [web.url(0, p) for p in pages], priority=prio)
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl",
        SYNTH_SITES=1, SYNTH_PAGES=300, SYNTH_RECORD_FILE=str(rec), STREAMS_BAND_RATIO="5:3:2",
        CONCURRENT_REQUESTS=2, STREAMS_PREFETCH=2, CLOSESPIDER_ITEMCOUNT=60,
        SYNTH_EXTRA_LINKS=0,
    )
    w = Worker(settings, tmp_path / "w.log")
    crawl_to_end(w, timeout=180)
    first = [int(r["url"].rsplit("/", 1)[1]) for r in downloads(rec)][:50]
    bands = Counter("high" if p < 100 else "default" if p < 200 else "low" for p in first)
    measured(f"band ratio 5:3:2, first 50 downloads: high {bands['high']}, default {bands['default']}, low {bands['low']}")
    assert bands["low"] >= 5 and bands["default"] >= 8 and bands["high"] >= 15, bands
    assert bands["high"] > bands["default"] > bands["low"]


def test_browser_requests_go_only_to_capable_workers_within_the_cap(plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any) -> None:
    """A browser site's requests reach only the worker with the browser capability, never more
    than STREAMS_BROWSER_MAX at once; the other worker does the http site."""
    rec = tmp_path / "downloads.jsonl"
    base = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl",
        SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=40, SYNTH_RECORD_FILE=str(rec), SYNTH_DELAY_SECONDS=0.05,
        STREAMS_SITES={"site1.test": {"task_type": "browser"}},
    )
    plain = Worker({**base, "RECORD_TAG": "http-only", "STREAMS_CAPABILITIES": ["http"]}, tmp_path / "a.log")
    browser = None
    try:
        # The http-only worker starts alone, so the browser site's requests must wait in Redis
        # until a capable worker comes, and the http site is provably served by the other worker
        # (started together, one worker can finish a 40-page site before the other is up).
        wait_for(lambda: any(r["worker"] == "http-only" for r in downloads(rec)),
                 timeout=120, what="the http-only worker's first download")
        assert not any("site1.test" in r["url"] for r in downloads(rec))
        browser = Worker({**base, "RECORD_TAG": "browser", "STREAMS_CAPABILITIES": ["http", "browser"], "STREAMS_BROWSER_MAX": 2}, tmp_path / "b.log")
        for w in (plain, browser):
            assert w.wait(180) == 0, w.log()
    finally:
        plain.close()
        if browser is not None:
            browser.close()
    rows = downloads(rec)
    site1 = [r for r in rows if "site1.test" in r["url"]]
    assert len(site1) == 40
    measured(f"browser site: {len(site1)} requests, workers {sorted({r['worker'] for r in site1})},"
             f" most at once {max(r['browser_inflight'] for r in site1)} (cap 2)")
    assert {r["worker"] for r in site1} == {"browser"}
    assert all(r["browser"] for r in site1)
    assert max(r["browser_inflight"] for r in site1) <= 2
    assert any(r["worker"] == "http-only" for r in rows if "site0.test" in r["url"])


def test_live_site_set_changes_the_rate(plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any) -> None:
    """`streams-sched site set --rate` on a running crawl changes the observed rate within seconds."""
    from click.testing import CliRunner

    from streams_sched.cli import main

    rec = tmp_path / "downloads.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl",
        SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=400, SYNTH_RECORD_FILE=str(rec),
        STREAMS_SITES={"site0.test": {"rate": 40, "burst": 5}},
        CONCURRENT_REQUESTS_PER_DOMAIN=2, STREAMS_PREFETCH_PER_SITE=2,
    )
    w = Worker(settings, tmp_path / "w.log")
    try:
        wait_for(lambda: len(downloads(rec)) >= 80, timeout=60, what="80 downloads at the fast rate")
        result = CliRunner().invoke(main, ["site", "set", "-c", crawl, "--redis-url", plain_redis_url, "site0.test", "--rate", "4", "--burst", "1"])
        assert result.exit_code == 0, result.output
        # Counted in downloads, with the worker's own clock: what was leased before the change
        # (at most CONCURRENT_REQUESTS_PER_DOMAIN + the site's prefetch, 2 + 2, and the old
        # burst of 5) may still go out fast; every download after those obeys the new rate.
        changed_at = len(downloads(rec))
        old_leases = 2 + 2 + 5
        wait_for(lambda: len(downloads(rec)) >= changed_at + old_leases + 8, timeout=60, what="downloads after the change")
        times = sorted(r["t"] for r in downloads(rec))
        after = times[changed_at + old_leases:]
        rate = (len(after) - 1) / (after[-1] - after[0])
        before = times[:changed_at][-40:]
        measured(f"site set --rate 4 on a live crawl: {(len(before) - 1) / (before[-1] - before[0]):.1f}/s before,"
                 f" {rate:.1f}/s over the {len(after)} downloads after the old leases")
        assert rate <= 4 * 1.5, rate
    finally:
        w.close()


def test_paused_site_keeps_its_backlog_until_resumed(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """A paused site is not leased (its backlog stays, the worker keeps waiting); resume crawls it."""
    items = tmp_path / "items.jsonl"
    client = redis.Redis.from_url(plain_redis_url)
    seed(client, crawl, ["http://site0.test/p/0", "http://site1.test/p/0"])
    f = Frontier(client, crawl)
    pause_site(f, "site1.test")
    assert get_policy(f, "site1.test")["paused"] == "1"
    events = subscribe_events(plain_redis_url, crawl)
    w = Worker(base_settings(plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=2, SYNTH_PAGES=20), tmp_path / "w.log")
    try:
        wait_for(lambda: len([i for i in read_items(items) if "site0.test" in i["url"]]) == 20, timeout=60)
        wait_heartbeats(events, 3, w)  # I/O cycles with only the paused site's backlog left
        assert not [i for i in read_items(items) if "site1.test" in i["url"]]
        assert f.status("site1.test").backlog >= 1 and w.alive()  # site0 pages link to site1 too
        resume_site(f, "site1.test")
        assert w.wait(60) == 0, w.log()
    finally:
        w.close()
    assert len(crawled_urls(items)) == 40


def test_default_policy_applies_to_unlisted_sites(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """The "*" policy (from STREAMS_SITES or `site set "*"`) routes and limits sites without their own."""
    rec = tmp_path / "downloads.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl",
        SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=30, SYNTH_RECORD_FILE=str(rec),
        STREAMS_CAPABILITIES=["http", "browser"],
        STREAMS_SITES={"*": {"task_type": "browser", "rate": 20, "burst": 2}, "site0.test": {"task_type": "http"}},
    )
    w = Worker(settings, tmp_path / "w.log")
    crawl_to_end(w)
    rows = downloads(rec)
    assert all(r["browser"] for r in rows if "site1.test" in r["url"])
    assert not any(r["browser"] for r in rows if "site0.test" in r["url"])
    assert max_in_window([r["t"] for r in rows if "site1.test" in r["url"]]) <= 22


@pytest.mark.parametrize("backend", ["bitmap", "redisbloom"])
def test_revisit_window_lets_a_page_come_back(redis_source: Any, backend: str, crawl: str) -> None:
    """With revisits on, a fingerprint is a duplicate inside the window and new again after it."""
    url = redis_source.url(backend)
    client = redis.Redis.from_url(url)
    mode = "bf" if backend == "redisbloom" else "bitmap"
    f = Frontier(client, crawl, BloomParams(mode=mode, revisit_s=1.5, revisit_buckets=3))
    fp = b"\x01" * 20
    item = [Entry(fp, 1, 0, b"x")]
    t0 = time.time()
    assert f.enqueue("a.test", item)[0] == 1
    assert f.enqueue("a.test", item)[1] == 1
    # still a duplicate for at least the window, new again within window + one bucket
    wait_for(lambda: f.enqueue("a.test", item)[0] == 1, timeout=10, interval=0.05)
    elapsed = time.time() - t0
    assert 1.5 - 0.05 <= elapsed <= 1.5 + 0.5 + 0.3, elapsed
    current_filter = f.filters("a.test")[0]
    bloom_keys = list(client.scan_iter(f"{f.site('a.test').seen}:*"))
    assert current_filter.encode() in bloom_keys
    assert [k for k in bloom_keys if client.ttl(k) <= 0] == []  # every bucket expires on its own
