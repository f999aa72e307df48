"""Fault injection with real processes: workers SIGKILLed at random moments, Redis
killed and restarted, Redis stalled, Redis missing at start, workers stopped with
SIGTERM / Ctrl-C. Every test checks that no page is lost and that repeats stay
within what the fault can explain."""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streams_sched.connect.clients import connect
from streams_sched.demo.web import SyntheticWeb
from streams_sched.testing import RedisServer, find_redisbloom, free_port
from streams_sched.worker.io.recovery import find_orphans

from helpers import (
    Worker,
    base_settings,
    crawl_to_end,
    crawled_urls,
    first_visits,
    frontier,
    read_items,
    tracked_once_problems,
    wait_for,
)

pytestmark = pytest.mark.e2e


def expected(sites: int, pages: int) -> set[str]:
    return SyntheticWeb(sites=sites, pages=pages).all_urls()


def leases_of(url: str, crawl: str, node: str) -> int:
    """How many entries Redis has leased to consumer ``node`` right now."""
    f = frontier(url, crawl)
    return sum(len(v) for v in find_orphans(f, node, f.sites(), set()).values())


def assert_drained(url: str, crawl: str, *, balanced: bool = True) -> dict[str, int]:
    """Nothing left anywhere in the crawl; returns the summed Redis counters. ``balanced``:
    every request enqueued was acked or dead-lettered once (not so with tracked pages, whose
    revisits are acked again and were never enqueued)."""
    f = frontier(url, crawl)
    totals: dict[str, int] = {}
    for site in f.sites():
        st = f.status(site)
        assert (st.backlog, st.pending, st.delayed) == (0, 0, 0), (site, st)
        for k, v in st.stats.items():
            totals[k] = totals.get(k, 0) + v
    if balanced:
        assert totals.get("enqueued", 0) == totals.get("acked", 0) + totals.get("dead", 0), totals
    return totals


def no_tracebacks(*workers: Worker) -> None:
    for w in workers:
        assert "Traceback" not in w.log(), w.log()


@pytest.mark.cluster
# on the cluster only: a worker killed on a single Redis is in test_e2e and test_zoo
@pytest.mark.slow
@pytest.mark.targets("cluster")
def test_five_sigkills_at_random_moments_lose_no_page(
    redis_url: str, dedupe: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """Workers SIGKILLed five times at random moments of one crawl: every page is crawled,
    and pages crawled twice are at most what the killed workers held when they died."""
    seed = int(os.environ.get("FAULT_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    sites, pages = 4, 200
    total = sites * pages
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items,
        SYNTH_SEED=True, SYNTH_SITES=sites, SYNTH_PAGES=pages, SYNTH_DELAY_SECONDS=0.03,
        STREAMS_LEASE_SECONDS=3, STREAMS_MAX_DELIVERIES=10,
        CONCURRENT_REQUESTS=8, CONCURRENT_REQUESTS_PER_DOMAIN=4,
    )
    workers: dict[str, Worker] = {}
    serial = 0

    def start() -> None:
        nonlocal serial
        serial += 1
        node = f"w{serial}"
        # only the first worker seeds; the others join the crawl
        workers[node] = Worker(
            {**settings, "SYNTH_SEED": serial == 1, "STREAMS_NODE_ID": node, "RECORD_TAG": node},
            tmp_path / f"{node}.log",
        )

    kills: list[tuple[str, int, int]] = []  # (node, pages crawled by then, leases it held)
    # one random moment in each fifth of 10%..80% of the crawl
    span = total * 7 // 10 // 5
    thresholds = [total // 10 + i * span + rng.randrange(span) for i in range(5)]
    try:
        start()
        # the others join once the crawl has work (a worker that finds a crawl with no work
        # at all closes at once, as a spider without start requests does)
        wait_for(lambda: len(read_items(items)) >= 5, timeout=60, what="the crawl to start")
        start()
        start()
        for threshold in thresholds:
            wait_for(lambda t=threshold: len(read_items(items)) >= t, timeout=90, what=f"{threshold} pages")
            alive = [n for n, w in workers.items() if w.alive()]
            busy = [n for n in alive if leases_of(redis_url, crawl, n) > 0]
            victim = rng.choice(busy or alive)  # a worker that holds something, if any does
            workers[victim].kill()
            kills.append((victim, len(read_items(items)), leases_of(redis_url, crawl, victim)))
            start()
        for node, w in workers.items():
            if node not in {k[0] for k in kills}:
                assert w.wait(120) == 0, w.log()
    finally:
        for w in workers.values():
            w.close()
    seen = crawled_urls(items)
    missing = expected(sites, pages) - set(seen)
    repeats = sum(n - 1 for n in seen.values())
    held = sum(k[2] for k in kills)
    measured(
        f"seed={seed} kills at pages {[k[1] for k in kills]} holding {[k[2] for k in kills]} leases;"
        f" crawled {len(seen)}/{total}, crawled twice: {repeats} (bound {held}), never crawled: {len(missing)}"
    )
    assert not missing, sorted(missing)[:10]
    assert repeats <= held, (repeats, kills)
    assert_drained(redis_url, crawl)
    no_tracebacks(*(w for n, w in workers.items() if n not in {k[0] for k in kills}))


def redis_with_aof(**kwargs: Any) -> RedisServer:
    return RedisServer(bloom=find_redisbloom() is not None, appendonly=True, appendfsync="always", **kwargs)


def test_redis_killed_and_restarted_mid_crawl_loses_nothing(crawl: str, tmp_path: Path, measured: Any) -> None:
    """Redis (AOF, appendfsync always) is SIGKILLed mid-crawl and restarted: workers retry with
    back-off, nobody crashes, the crawl completes with nothing lost or crawled twice."""
    server = redis_with_aof().start()
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        server.url, crawl, "auto", items,
        SYNTH_SEED=True, SYNTH_SITES=3, SYNTH_PAGES=150, SYNTH_DELAY_SECONDS=0.05,
        STREAMS_LEASE_SECONDS=60, STREAMS_SOCKET_TIMEOUT_SECONDS=2,
    )
    workers = [Worker({**settings, "RECORD_TAG": "w0"}, tmp_path / "w0.log")]
    try:
        wait_for(lambda: len(read_items(items)) >= 5, timeout=60, what="the crawl to start")
        workers.append(Worker({**settings, "SYNTH_SEED": False, "RECORD_TAG": "w1"}, tmp_path / "w1.log"))
        wait_for(lambda: " opened: crawl=" in workers[1].log(), timeout=60, what="the second worker")
        wait_for(lambda: len(read_items(items)) >= 120, timeout=60, what="120 pages before the outage")
        server.kill()
        killed_at = len(read_items(items))
        wait_for(
            lambda: all("Redis unreachable" in w.log() for w in workers), timeout=30,
            what="both workers to notice the outage",
        )
        server.start()
        restarted = time.monotonic()
        for w in workers:
            assert w.wait(120) == 0, w.log()
        after_restart = time.monotonic() - restarted
    finally:
        for w in workers:
            w.close()
    try:
        seen = crawled_urls(items)
        repeats = sum(n - 1 for n in seen.values())
        measured(
            f"Redis killed at {killed_at} pages, restarted; crawl done {after_restart:.1f}s later;"
            f" crawled {len(seen)}/450, crawled twice: {repeats}"
        )
        assert set(seen) == expected(3, 150)
        assert repeats == 0
        assert_drained(server.url, crawl)
        for w in workers:
            assert "Redis is reachable again" in w.log()
        no_tracebacks(*workers)
        assert after_restart < 60  # nothing waited for a lease to expire
    finally:
        server.cleanup()


#: continuous crawling: every page of a small crawl tracked, back every second
TRACKED_SPIDER = "spiders.TrackedSpider"
TRACKED_SITES, TRACKED_PAGES = 2, 30


def tracked_settings(url: str, crawl: str, items: Path, **extra: Any) -> dict[str, Any]:
    return base_settings(url, crawl, "bitmap", items, **{
        "SYNTH_SEED": True, "SYNTH_SITES": TRACKED_SITES, "SYNTH_PAGES": TRACKED_PAGES, "TRACK_ONE_IN": 1,
        "TRACK_EVERY_SECONDS": 1.0, "CONCURRENT_REQUESTS": 8, "CONCURRENT_REQUESTS_PER_DOMAIN": 4, **extra,
    })


def revisits_and_held(f: Any) -> tuple[int, int]:
    """The crawl's revisits scheduled so far (each site's stats field ``revisits``, bumped by
    the ack that schedules one) and the leases held now (leased less acked: with one worker
    alive, that worker's)."""
    revisits = held = 0
    for site in f.sites():
        r, leased, acked = f.client.hmget(f.site(site).stats, "revisits", "leased", "acked")
        revisits += int(r or 0)
        held += int(leased or 0) - int(acked or 0)
    return revisits, held


def revisits_scheduled(url: str, crawl: str) -> int:
    return revisits_and_held(frontier(url, crawl))[0]


def revisited_by(items: Path, worker: str) -> set[str]:
    return {i["url"] for i in read_items(items) if i.get("revisit") and i.get("worker") == worker}


def stop_and_drain(url: str, crawl: str, *workers: Worker) -> dict[str, int]:
    """Stop the crawl's tracking, let the workers drain and exit 0; nothing may be left."""
    from streams_sched.admin.revisits import stop_tracking

    stop_tracking(frontier(url, crawl))
    crawl_to_end(*workers, timeout=60)
    totals = assert_drained(url, crawl, balanced=False)
    assert totals.get("tracked", 0) == 0, totals
    return totals


@pytest.mark.targets("bitmap")
def test_a_worker_killed_right_after_acking_revisits_leaves_each_tracked_page_once(
    redis_url: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """Only revisits left: a worker SIGKILLed right after an ack scheduled a next visit leaves every tracked page once in the frontier, and the next worker revisits them all."""
    items = tmp_path / "items.jsonl"
    # slow answers: the worker has revisits in progress when one of its acks lands (8 at a
    # time at 0.2 s: 40 pages/s, for 20 revisits due a second)
    settings = tracked_settings(redis_url, crawl, items, STREAMS_LEASE_SECONDS=2, SYNTH_DELAY_SECONDS=0.2,
                                TRACK_EVERY_SECONDS=3.0)
    want = expected(TRACKED_SITES, TRACKED_PAGES)
    first = Worker({**settings, "STREAMS_NODE_ID": "first", "RECORD_TAG": "first"}, tmp_path / "first.log",
                   spider=TRACKED_SPIDER)
    second = None
    try:
        wait_for(lambda: set(first_visits(items)) == want, timeout=60, what="every page crawled once")
        # the crawl is over but for the revisits: wait for a round of them, then for an ack
        at_least = revisits_scheduled(redis_url, crawl) + len(want)
        wait_for(lambda: revisits_scheduled(redis_url, crawl) >= at_least, timeout=60, what="a round of revisits")
        f = frontier(redis_url, crawl)
        last = [revisits_and_held(f)[0]]

        def just_acked_holding_more() -> bool:
            revisits, held = revisits_and_held(f)
            acked, last[0] = revisits > last[0], revisits
            return acked and held > 0

        wait_for(just_acked_holding_more, timeout=30, interval=0.001,
                 what="an ack that schedules a next visit while the worker holds more revisits")
        first.kill()
        held = leases_of(redis_url, crawl, "first")  # the dead worker's, pending until taken over
        assert held > 0
        assert tracked_once_problems(redis_url, crawl, want) == []
        second = Worker({**settings, "SYNTH_SEED": False, "STREAMS_NODE_ID": "second", "RECORD_TAG": "second"},
                        tmp_path / "second.log", spider=TRACKED_SPIDER)
        wait_for(lambda: revisited_by(items, "second") == want, timeout=60, what="every page revisited by the second")
        assert tracked_once_problems(redis_url, crawl, want) == []
        assert "took over" in second.log()
        totals = stop_and_drain(redis_url, crawl, second)
    finally:
        first.close()
        if second is not None:
            second.close()
    measured(f"killed right after an ack, holding {held} revisits, taken over; {totals.get('revisits', 0)} revisits"
             f" scheduled over the crawl; each of the {len(want)} tracked pages in the frontier once after the kill")
    assert set(first_visits(items)) == want
    no_tracebacks(second)


def test_redis_restarted_from_aof_keeps_each_waiting_tracked_page_once(
    crawl: str, tmp_path: Path, measured: Any
) -> None:
    """Redis (AOF, appendfsync always) SIGKILLed and restarted while tracked pages wait for their next visit: each is in the frontier once after the restart, and each is revisited."""
    server = redis_with_aof().start()
    items = tmp_path / "items.jsonl"
    want = expected(TRACKED_SITES, TRACKED_PAGES)
    w = Worker({**tracked_settings(server.url, crawl, items, STREAMS_LEASE_SECONDS=10, STREAMS_SOCKET_TIMEOUT_SECONDS=2),
                "RECORD_TAG": "w"}, tmp_path / "w.log", spider=TRACKED_SPIDER)
    try:
        wait_for(lambda: set(first_visits(items)) == want, timeout=60, what="every page crawled once")
        at_least = revisits_scheduled(server.url, crawl) + len(want)
        wait_for(lambda: revisits_scheduled(server.url, crawl) >= at_least, timeout=60, what="a round of revisits")
        server.kill()
        wait_for(lambda: "Redis unreachable" in w.log(), timeout=30, what="the worker to notice the outage")
        server.start()
        after_aof = tracked_once_problems(server.url, crawl, want)  # before the worker is back, or as it comes back
        since = len(read_items(items))
        wait_for(lambda: "Redis is reachable again" in w.log(), timeout=30, what="the worker back")
        wait_for(lambda: {i["url"] for i in read_items(items)[since:] if i.get("revisit")} == want, timeout=60,
                 what="every page revisited after the restart")
        assert after_aof == [] and tracked_once_problems(server.url, crawl, want) == []
        totals = stop_and_drain(server.url, crawl, w)
        measured(f"Redis killed with {len(want)} tracked pages waiting, restarted from its AOF: each once,"
                 f" each revisited; {totals.get('revisits', 0)} revisits scheduled over the crawl")
        assert set(first_visits(items)) == want and max(first_visits(items).values()) == 1
        no_tracebacks(w)
    finally:
        w.close()
        server.cleanup()


def test_redis_without_persistence_restarted_empty_under_tracked_pages_is_reported_at_error(
    crawl: str, tmp_path: Path, measured: Any
) -> None:
    """The same restart with no AOF and no RDB, once only revisits run: every waiting page is gone, and the worker says so at ERROR instead of idling on an empty frontier."""
    server = RedisServer(port=free_port()).start()
    items = tmp_path / "items.jsonl"
    want = expected(TRACKED_SITES, TRACKED_PAGES)
    w = Worker({**tracked_settings(server.url, crawl, items, STREAMS_LEASE_SECONDS=10, STREAMS_SOCKET_TIMEOUT_SECONDS=2),
                "RECORD_TAG": "w"}, tmp_path / "w.log", spider=TRACKED_SPIDER)
    try:
        wait_for(lambda: set(first_visits(items)) == want, timeout=60, what="every page crawled once")
        server.kill()
        wait_for(lambda: "Redis unreachable" in w.log(), timeout=30, what="the worker to notice the outage")
        server.start()
        wait_for(lambda: "Redis is reachable again" in w.log(), timeout=30, what="the worker back")
        reported = "restarted empty (appendonly no, nothing loaded)"
        wait_for(lambda: reported in w.log(), timeout=10, what="the worker to report the empty restart")
        measured(f"no persistence, restarted with {len(want)} tracked pages: {len(tracked_once_problems(server.url, crawl, want))}"
                 " problem line(s) (pages lost), reported at ERROR")
        assert "ERROR" in w.log().split(reported)[0].splitlines()[-1]
    finally:
        w.close()
        server.cleanup()


def test_worker_waits_for_redis_that_is_not_up_yet(crawl: str, tmp_path: Path) -> None:
    """A worker started before Redis waits with back-off (one warning) and crawls once Redis is up."""
    server = RedisServer(port=free_port())
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        server.url, crawl, "auto", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=30,
        STREAMS_CONNECT_TIMEOUT_SECONDS=60,
    )
    w = Worker(settings, tmp_path / "w.log")
    try:
        wait_for(lambda: "is not answering" in w.log(), timeout=30, what="the worker to wait for Redis")
        server.start()
        assert w.wait(120) == 0, w.log()
        assert w.log().count("is not answering") == 1 and "answers now" in w.log()
        assert set(crawled_urls(items)) == expected(1, 30)
    finally:
        w.close()
        server.cleanup()


def _debug_sleep(server: RedisServer, seconds: float) -> None:
    client = connect(server.url, socket_timeout=seconds + 30)
    client.execute_command("DEBUG", "SLEEP", seconds)


@pytest.mark.parametrize("stall", ["debug-sleep", "sigstop"])
def test_redis_stall_does_not_crash_or_leak_leases(stall: str, crawl: str, tmp_path: Path, measured: Any) -> None:
    """Redis stops answering for 4s (DEBUG SLEEP, or SIGSTOP of the server) mid-crawl: socket
    timeouts are retried, leases granted while the worker had given up are handed back at once,
    and the crawl completes without waiting for any lease to expire."""
    server = RedisServer(extra_args=["--enable-debug-command", "yes"]).start()
    items = tmp_path / "items.jsonl"
    lease_s = 60
    settings = base_settings(
        server.url, crawl, "auto", items,
        SYNTH_SEED=True, SYNTH_SITES=3, SYNTH_PAGES=150, SYNTH_DELAY_SECONDS=0.02,
        STREAMS_LEASE_SECONDS=lease_s, STREAMS_SOCKET_TIMEOUT_SECONDS=1,
    )
    w = Worker(settings, tmp_path / "w.log")
    sleeper: threading.Thread | None = None
    try:
        wait_for(lambda: len(read_items(items)) >= 100, timeout=60, what="100 pages before the stall")
        stalled = time.monotonic()
        if stall == "debug-sleep":
            sleeper = threading.Thread(target=_debug_sleep, args=(server, 4))
            sleeper.start()
        else:
            server.pause()
        wait_for(lambda: "Redis unreachable" in w.log(), timeout=30, what="a socket timeout")
        if stall == "sigstop":
            wait_for(lambda: time.monotonic() - stalled >= 4, timeout=10, interval=0.1, what="4s of stall")
            server.resume()
        assert w.wait(120) == 0, w.log()
        elapsed = time.monotonic() - stalled
    finally:
        server.resume()
        if sleeper is not None:
            sleeper.join(30)
        w.close()
    try:
        seen = crawled_urls(items)
        released = w.log().count("whose replies were lost")
        measured(f"{stall}: crawl done {elapsed:.1f}s after the stall began; lost-reply hand-backs: {released}")
        assert set(seen) == expected(3, 150) and max(seen.values()) == 1
        assert_drained(server.url, crawl)
        no_tracebacks(w)
        assert "took over an expired lease" not in w.log()
        assert elapsed < lease_s
    finally:
        server.cleanup()


def _announced(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


@pytest.mark.slow
@pytest.mark.scrapy_matrix
def test_sigterm_hands_back_unstarted_leases_at_once_and_finishes_in_flight(crawl: str, tmp_path: Path, measured: Any) -> None:
    """SIGTERM: the worker stops leasing, hands back its prefetched leases at once, finishes the
    requests in progress, acks them and exits 0; another worker finishes the crawl, no page twice."""
    server = RedisServer().start()
    try:
        url = server.url
        items, announce = tmp_path / "items.jsonl", tmp_path / "announce.txt"
        settings = base_settings(
            url, crawl, "bitmap", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=40,
            STREAMS_LEASE_SECONDS=120, CONCURRENT_REQUESTS=2, CONCURRENT_REQUESTS_PER_DOMAIN=2,
            STREAMS_PREFETCH=6, STREAMS_PREFETCH_PER_SITE=6,
        )
        slow = Worker(
            {**settings, "SYNTH_DELAY_SECONDS": 3.0, "STREAMS_NODE_ID": "slow", "RECORD_TAG": "slow",
             "ANNOUNCE_FILE": str(announce), "DOWNLOADER_MIDDLEWARES": {"spiders.AnnounceMiddleware": 50}},
            tmp_path / "slow.log",
        )
        try:
            wait_for(lambda: len(read_items(items)) >= 2 and leases_of(url, crawl, "slow") >= 6,
                     timeout=60, what="the slow worker to hold its prefetch")
            in_progress = set(_announced(announce)) - set(crawled_urls(items))
            held = leases_of(url, crawl, "slow")
            slow.proc.send_signal(signal.SIGTERM)
            # the unstarted leases come back at once, long before the 3s downloads end
            wait_for(lambda: leases_of(url, crawl, "slow") <= len(in_progress), timeout=2.5,
                     what="the unstarted leases to be handed back")
            assert slow.wait(30) == 0, slow.log()
        finally:
            slow.close()
        assert leases_of(url, crawl, "slow") == 0
        finished = {i["url"] for i in read_items(items) if i["worker"] == "slow"}
        assert in_progress <= finished  # requests in progress were allowed to finish
        started = time.monotonic()
        fast = Worker({**settings, "SYNTH_SEED": False, "SYNTH_DELAY_SECONDS": 0.0, "RECORD_TAG": "fast"}, tmp_path / "fast.log")
        crawl_to_end(fast, timeout=60)
        seen = crawled_urls(items)
        measured(
            f"SIGTERM with {held} leases ({len(in_progress)} in progress): handed back {held - len(in_progress)} at once;"
            f" the next worker finished in {time.monotonic() - started:.1f}s; crawled twice: {sum(n - 1 for n in seen.values())}"
        )
        assert set(seen) == expected(1, 40) and max(seen.values()) == 1
        assert "took over an expired lease" not in fast.log()
        assert "handed back" in slow.log()
        assert_drained(url, crawl)
    finally:
        server.cleanup()


@pytest.mark.scrapy_matrix
def test_ctrl_c_hands_back_requests_still_in_progress_after_the_timeout(crawl: str, tmp_path: Path) -> None:
    """Ctrl-C (SIGINT) with downloads that would take 60s: after STREAMS_SHUTDOWN_TIMEOUT_SECONDS
    the worker hands their leases back and exits; the next worker crawls them at once."""
    server = RedisServer().start()
    try:
        url = server.url
        items, announce = tmp_path / "items.jsonl", tmp_path / "announce.txt"
        settings = base_settings(
            url, crawl, "bitmap", items, SYNTH_SEED=True, SYNTH_SITES=1, SYNTH_PAGES=20,
            STREAMS_LEASE_SECONDS=300, CONCURRENT_REQUESTS=2, CONCURRENT_REQUESTS_PER_DOMAIN=2,
        )
        stuck = Worker(
            {**settings, "SYNTH_DELAY_SECONDS": 60.0, "STREAMS_NODE_ID": "stuck", "STREAMS_SHUTDOWN_TIMEOUT_SECONDS": 1,
             "ANNOUNCE_FILE": str(announce), "DOWNLOADER_MIDDLEWARES": {"spiders.AnnounceMiddleware": 50}},
            tmp_path / "stuck.log",
        )
        try:
            wait_for(lambda: len(_announced(announce)) >= 1, timeout=60, what="a download in progress")
            sent = time.monotonic()
            stuck.proc.send_signal(signal.SIGINT)
            assert stuck.wait(30) == 0, stuck.log()
            assert time.monotonic() - sent < 20
        finally:
            stuck.close()
        assert leases_of(url, crawl, "stuck") == 0
        assert "still in progress after STREAMS_SHUTDOWN_TIMEOUT_SECONDS=1" in stuck.log()
        started = time.monotonic()
        fast = Worker({**settings, "SYNTH_SEED": False, "SYNTH_DELAY_SECONDS": 0.0}, tmp_path / "fast.log")
        crawl_to_end(fast, timeout=60)
        assert time.monotonic() - started < 60  # nobody waited for the 300s lease
        assert set(crawled_urls(items)) == expected(1, 20)
        assert "took over an expired lease" not in fast.log()
        assert_drained(url, crawl)
    finally:
        server.cleanup()


def test_leases_whose_replies_were_lost_are_handed_back_at_once(crawl: str, tmp_path: Path, measured: Any) -> None:
    """Redis runs a batch with lease calls but its replies are lost (a proxy drops them, then
    everything for 3s): the leases granted are handed back as soon as Redis answers again,
    instead of blocking the end of the crawl until they expire."""
    from redis_tools import TcpProxy

    from streams_sched import seed
    from streams_sched.frontier.scripts import source

    server = RedisServer().start()
    proxy = TcpProxy(server.port)
    # every page is in the backlog from the start, so the worker leases in every cycle
    seed(connect(server.url), crawl, sorted(expected(3, 150)))
    items = tmp_path / "items.jsonl"
    lease_s = 60
    settings = base_settings(
        proxy.url(), crawl, "auto", items,
        SYNTH_SITES=3, SYNTH_PAGES=150, SYNTH_DELAY_SECONDS=0.02,
        STREAMS_LEASE_SECONDS=lease_s, STREAMS_SOCKET_TIMEOUT_SECONDS=0.5,
    )
    w = Worker(settings, tmp_path / "w.log")
    try:
        wait_for(lambda: len(read_items(items)) >= 100, timeout=60, what="100 pages before the replies are lost")
        proxy.drop_after(hashlib.sha1(source("lease").encode()).hexdigest().encode())
        wait_for(proxy.dropping.is_set, timeout=30, what="a batch with a lease call")
        lost_at = time.monotonic()
        wait_for(lambda: "Redis unreachable" in w.log() and time.monotonic() - lost_at >= 3,
                 timeout=30, interval=0.1, what="3s of lost replies")
        proxy.dropping.clear()
        assert w.wait(120) == 0, w.log()
        elapsed = time.monotonic() - lost_at
    finally:
        w.close()
        proxy.close()
    try:
        seen = crawled_urls(items)
        handed_back = [line.split("WARNING: ")[-1] for line in w.log().splitlines() if "whose replies were lost" in line]
        measured(f"{proxy.dropped_bytes} reply bytes dropped; {handed_back or 'nothing handed back'}; done {elapsed:.1f}s after")
        assert set(seen) == expected(3, 150) and max(seen.values()) == 1
        assert handed_back, w.log()
        assert "took over an expired lease" not in w.log()
        assert elapsed < lease_s
        assert_drained(server.url, crawl)
        no_tracebacks(w)
    finally:
        server.cleanup()


_BOUNDED_WAIT_ON_TWISTED = """
from twisted.internet import epollreactor
epollreactor.install()
from twisted.internet import defer, reactor, task
from streams_sched.worker.engine import _finished_within

async def slow():
    await task.deferLater(reactor, 30, lambda: None)

async def fast():
    await task.deferLater(reactor, 0.01, lambda: None)

async def main():
    t0 = reactor.seconds()
    late = await _finished_within(slow(), 0.2)
    waited = reactor.seconds() - t0
    on_time = await _finished_within(fast(), 5)
    print(late, on_time, waited < 5)

def run():
    d = defer.ensureDeferred(main())
    d.addBoth(lambda r: (print(r) if r is not None else None, reactor.stop()))

reactor.callWhenRunning(run)
reactor.run()
"""


@pytest.mark.scrapy_matrix
def test_close_wait_is_bounded_on_a_plain_twisted_reactor() -> None:
    """The bounded wait for requests in progress also works without asyncio (Twisted's epoll reactor)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _BOUNDED_WAIT_ON_TWISTED], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["False", "True", "True"], done.stdout + done.stderr


@pytest.mark.scrapy_matrix
def test_a_browser_task_whose_download_raises_is_delivered_again_then_dead_lettered(
    plain_redis_url: str, crawl: str, tmp_path: Path
) -> None:
    """A browser task whose download raises is handed back to the frontier with the delivery
    counted and dead-lettered with the error after STREAMS_MAX_DELIVERIES, through the
    engine hook of every supported Scrapy (no browser needed); an http task failing the same
    way is Scrapy's to handle, once."""
    rec, items = tmp_path / "downloads.jsonl", tmp_path / "items.jsonl"
    broken = {"http://site0.test/p/1": {"raise": "ConnectionRefusedError"},
              "http://site1.test/p/1": {"raise": "ConnectionRefusedError"}}
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=12,
        SYNTH_RECORD_FILE=str(rec), SYNTH_SPECIAL=broken, RETRY_ENABLED=False, STREAMS_MAX_DELIVERIES=3,
        STREAMS_SITES={"site1.test": {"task_type": "browser"}}, STREAMS_CAPABILITIES=["http", "browser"],
    )
    worker = Worker(settings, tmp_path / "w.log")
    crawl_to_end(worker, timeout=60)
    log = worker.log_path.read_text()
    downloads = [json.loads(line)["url"] for line in rec.read_text().splitlines()]
    assert downloads.count("http://site1.test/p/1") == 3 and downloads.count("http://site0.test/p/1") == 1
    f = frontier(plain_redis_url, crawl)
    [letter] = f.dead_letters("site1.test")
    assert letter["reason"] == (b"delivered 3 times (STREAMS_MAX_DELIVERIES=3), the last failed:"
                                b" ConnectionRefusedError: synthetic failure") and letter["deliveries"] == b"3"
    assert f.dead_letters("site0.test") == []
    assert log.count("failed on its delivery") == 3 and log.count("back to the frontier for another delivery") == 2
    assert log.count("Error downloading") == 2  # Scrapy's own line: the http task's one failure, the last delivery's
    assert set(crawled_urls(items)) == expected(2, 12) - set(broken)
    totals = assert_drained(plain_redis_url, crawl)
    assert (totals["failed"], totals["dead"]) == (2, 1)
