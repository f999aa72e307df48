"""Redis failover with real processes: a Redis Cluster with one replica per master, and
one primary with a replica under three Sentinels. The current primary is SIGKILLed
mid-crawl, the replica is promoted, and the dead node is either restarted at once or
left down. Every page must be crawled, and every worker must finish by itself with exit 0.

Replication is asynchronous, so these tests prove that the workers hold each ack until
the request's follow-ups are on a replica, follow the new topology, and do not trust
what they remember sending to a primary that is gone."""

from __future__ import annotations

import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import spread_crawl_name
from redis_tools import LocalCluster, LocalSentinel

from streams_sched.connect.clients import connect
from streams_sched.demo.web import SyntheticWeb
from streams_sched.errors import RedisUnavailable
from streams_sched.frontier.seeding import Seeder
from streams_sched.testing import RedisServer, find_redisbloom

from helpers import (
    Worker,
    base_settings,
    crawled_urls,
    first_visits,
    frontier,
    read_items,
    tracked_once_problems,
    wait_for,
)
from spiders import tracked_page

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SITES, PAGES = 8, 450
#: how long a replica lags behind its master when the master dies
LAG_S = 0.5
#: with tracked pages (tests/spiders.py TrackedSpider): one page in TRACK_ONE_IN of a crawl of
#: SITES x PAGES is tracked (a longer crawl tracks as many), back every TRACK_EVERY_S, so the
#: early ones are revisited several times around each failover. At most 45 revisits a second
#: at the end of the crawl, against about 100 pages a second on 2 cores.
TRACK_ONE_IN, TRACK_EVERY_S = 20, 4.0


@pytest.fixture
def replicated_cluster() -> Iterator[LocalCluster]:
    with LocalCluster(3, replicas=1, node_timeout_ms=1500, appendonly=True, bloom=find_redisbloom() is not None) as cluster:
        yield cluster


def check_tracked_once(url: str, crawl: str, want: set[str], timeout: float = 60.0, mid_crawl: bool = False) -> list[str]:
    """tracked_once_problems, read again while a node is still failing over (the map of a
    cluster that just lost a node, a sentinel still electing)."""
    import redis

    deadline = time.monotonic() + timeout
    while True:
        try:
            return tracked_once_problems(url, crawl, want, mid_crawl=mid_crawl)
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def stop_tracking_at(url: str, crawl: str) -> None:
    """streams-sched revisits --stop: the waiting visits go, the crawl drains."""
    from streams_sched.admin.revisits import stop_tracking

    stop_tracking(frontier(url, crawl))


def crawl_through_failovers(
    url: str, crawl: str, tmp_path: Path, failovers: int, fail_over: Any, measured: Any, *, longer: bool = False,
    within_bound: bool | None = None, tracked: bool = False, check_url: Any = None,
) -> None:
    """Two workers crawl SITES x PAGES (more for more failovers); ``fail_over(i)`` is called at
    evenly spread moments of the crawl. Asserts that every failover came while both workers
    were crawling, that every page is crawled, that both workers exit 0 by themselves, and
    (``within_bound``, by default for one failover; several in a row are reported against
    it) that a failover crawled twice no more than what was in flight at the kill plus one
    second of the crawl. ``tracked``: one page in TRACK_ONE_IN is tracked; once every page
    was crawled, each tracked page must be in the frontier exactly once (waiting in its
    site's delayed ZSET or queued in a stream), then tracking is stopped so the crawl
    drains; pages crawled twice count first visits only. ``check_url()``: a URL to read the
    frontier through after the failovers (by default ``url``; a cluster's must name a live node)."""
    check_url = check_url or (lambda: url)
    pages = PAGES if failovers <= 2 and not longer else PAGES * 2
    total = SITES * pages
    every = SyntheticWeb(sites=SITES, pages=pages).all_urls()
    one_in = TRACK_ONE_IN * pages // PAGES
    want = {u for u in every if tracked_page(u, one_in)} if tracked else set()
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        url, crawl, "bitmap", items,
        SYNTH_SEED=True, SYNTH_SITES=SITES, SYNTH_PAGES=pages, SYNTH_DELAY_SECONDS=0.02,
        STREAMS_LEASE_SECONDS=10, STREAMS_SOCKET_TIMEOUT_SECONDS=2,
        CONCURRENT_REQUESTS=16, CONCURRENT_REQUESTS_PER_DOMAIN=4,
        TRACK_ONE_IN=one_in, TRACK_EVERY_SECONDS=TRACK_EVERY_S,
    )
    spider = "spiders.TrackedSpider" if tracked else "streams_sched.demo.spider.SyntheticSpider"
    crawled = first_visits if tracked else crawled_urls
    workers = [Worker({**settings, "RECORD_TAG": "w0", "STREAMS_NODE_ID": "w0"}, tmp_path / "w0.log", spider=spider)]
    moments: list[int] = []
    mid_crawl: list[bool] = []
    problems: list[str] = []
    revisits_during = 0
    started = time.monotonic()
    try:
        wait_for(lambda: len(read_items(items)) >= 5, timeout=60, what="the crawl to start")
        workers.append(Worker(
            {**settings, "SYNTH_SEED": False, "RECORD_TAG": "w1", "STREAMS_NODE_ID": "w1"}, tmp_path / "w1.log",
            spider=spider,
        ))
        for i in range(failovers):
            threshold = total * (i + 1) // (failovers + 2)
            wait_for(lambda t=threshold: sum(crawled(items).values()) >= t, timeout=180, what=f"{threshold} pages")
            moments.append(sum(crawled(items).values()))
            mid_crawl.append(all(w.alive() for w in workers) and len(crawled(items)) < total)
            fail_over(i)
            if tracked:  # right after the failover: none there twice
                problems += check_tracked_once(check_url(), crawl, want, mid_crawl=True)
        if tracked:
            wait_for(lambda: set(first_visits(items)) == every, timeout=180, what="every page crawled once")
            revisits_during = len(read_items(items)) - sum(first_visits(items).values())
            problems += check_tracked_once(check_url(), crawl, want)
            stop_tracking_at(check_url(), crawl)
        codes = [w.wait(240) for w in workers]
    finally:
        for w in workers:
            w.close()
    elapsed = time.monotonic() - started
    seen = crawled(items)
    missing = every - set(seen)
    repeats = sum(n - 1 for n in seen.values())
    # what one failover may crawl twice: every request in flight or prefetched at the kill
    # (CONCURRENT_REQUESTS, and a prefetch as large, per worker), plus one second of the crawl
    bound = failovers * (len(workers) * 2 * 16 + int(total / elapsed))
    measured(
        f"{failovers} failovers at pages {moments}: crawled {len(seen)}/{total}, never crawled {len(missing)},"
        f" crawled twice {repeats} (bound {bound}), in {elapsed:.0f}s"
        + (f"; {revisits_during} revisits of {len(want)} tracked pages, each in the frontier once"
           f" after the crawl: {not problems}" if tracked else "")
    )
    assert not problems, problems
    assert codes == [0, 0], [w.log()[-3000:] for w in workers]
    assert all(mid_crawl), f"failovers {mid_crawl} came after the crawl was done: make it longer"
    assert not missing, (len(missing), sorted(missing)[:10])
    if within_bound if within_bound is not None else failovers == 1:
        assert repeats <= bound, f"{repeats} pages crawled twice, more than {bound} for {failovers} failover(s)"
    for w in workers:
        assert "Traceback" not in w.log(), w.log()[-5000:]
    if tracked:
        f = frontier(check_url(), crawl)
        statuses = {s: f.status(s) for s in f.sites()}
        left = {s: (st.backlog, st.pending, st.delayed) for s, st in statuses.items() if st.delayed or st.backlog}
        assert not left, left


@pytest.mark.parametrize(
    ("restart", "failovers", "pages"),
    # three shards with one replica each: left down, a third failover would leave a shard without
    # any. Restarted at once is run three times in a row, each after the node restarted last
    # time is back in sync; Sentinel below runs restarted-at-once with a single replica, as
    # most run it. Left down runs with one page in 20 tracked (continuous crawling), which
    # the rest of the crawl does not notice beyond their revisits.
    [("left_down", 2, "tracked"), ("at_once", 3, "untracked")],
)
def test_cluster_failovers_lose_no_page(
    replicated_cluster: LocalCluster, restart: str, failovers: int, pages: str, tmp_path: Path, measured: Any
) -> None:
    """SIGKILLs of the busiest cluster master mid-crawl, its replica lagging and then promoted,
    the dead node restarted at once or left down: every page is crawled, both workers exit 0,
    and each tracked page is in the frontier exactly once."""
    cluster = replicated_cluster
    crawl = spread_crawl_name(connect(cluster.url), tuple(f"site{i}.test" for i in range(SITES)))

    def fail_over(_: int) -> None:
        # the node restarted last time rejoins while the crawl goes on; a failover needs it in sync
        wait_for(lambda: any(cluster.has_replica(m) for m in cluster.masters()), timeout=90, what="a master with a replica in sync")
        candidates = [m for m in cluster.masters() if cluster.has_replica(m)]
        victim = max(candidates, key=lambda n: int(cluster.client(n).dbsize()))
        cluster.kill(victim, lag_s=LAG_S)
        cluster.wait_failover(victim)
        if restart == "at_once":
            cluster.restart(victim)

    def check_url() -> str:  # the node the URL names may be the one left down
        return cluster.url_naming([n for n in cluster.nodes if n.proc is not None and n.proc.poll() is None])

    crawl_through_failovers(
        cluster.url, crawl, tmp_path, failovers, fail_over, measured, tracked=pages == "tracked", check_url=check_url
    )


def cut_off_and_kill(master_client: Any, replicas: list[Any], kill: Any) -> None:
    """The replicas miss LAG_S of the master's writes, then the master is SIGKILLed
    (as LocalCluster.kill with lag_s)."""
    for r in replicas:
        r.pause()
    try:
        master_client.execute_command("CLIENT", "KILL", "TYPE", "replica")
        time.sleep(LAG_S)
        kill()
    finally:
        for r in replicas:
            r.resume()


@pytest.mark.parametrize(
    ("restart", "failovers", "pages"),
    # the single replica restarted at once: it must be demoted and resync before the next
    # failover. Left down and three failovers in a row run on the cluster above. One page in
    # 20 tracked: the sentinel tests below crawl without.
    [("at_once", 2, "tracked")],
)
def test_sentinel_failovers_lose_no_page(restart: str, failovers: int, pages: str, tmp_path: Path, measured: Any) -> None:
    """SIGKILLs of the Sentinel-managed primary mid-crawl, its replica lagging and then
    promoted, the dead node restarted at once or left down: every page is crawled, both
    workers exit 0, and each tracked page is in the frontier exactly once."""
    # One replica, as most run it: before the next failover, the restarted node must be demoted
    # and resync (Sentinel takes 7-18 s), so the crawl is longer. Left down, each failover uses a
    # replica up.
    replicas = 1 if restart == "at_once" else 2
    # AOF on, as Redis advises for primaries that restart by themselves
    with LocalSentinel(replicas=replicas, bloom=find_redisbloom() is not None, appendonly=True) as sentinel:

        def fail_over(_: int) -> None:
            # the node restarted last time is demoted and resyncs while the crawl goes on
            sentinel.wait_replicas(1, timeout=120)
            old = sentinel.master()
            cut_off_and_kill(sentinel.node_client(old), sentinel.replicas(), old.kill)
            sentinel.wait_failover(old.port)
            if restart == "at_once":
                sentinel.restart(old)

        crawl_through_failovers(
            sentinel.url, "t" + uuid.uuid4().hex[:8], tmp_path, failovers, fail_over, measured, longer=replicas == 1,
            tracked=pages == "tracked",
        )


@pytest.fixture
def primary_and_replica() -> Iterator[tuple[RedisServer, RedisServer]]:
    primary = RedisServer().start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        client = connect(primary.url, decode_responses=True)
        wait_for(
            lambda: client.info("replication").get("slave0", {}).get("state") == "online",
            timeout=30, what="the replica to sync",
        )
        yield primary, replica
    finally:
        replica.cleanup()
        primary.cleanup()


def test_seeder_returns_only_once_a_replica_has_the_seeds(primary_and_replica: tuple[RedisServer, RedisServer]) -> None:
    """What Seeder.seed reports as added is already on the replica when it returns."""
    primary, replica = primary_and_replica
    crawl = "t" + uuid.uuid4().hex[:8]
    urls = [f"http://site{i % 3}.test/p/{i}" for i in range(300)]
    with Seeder(primary.url, crawl) as seeder:
        result = seeder.seed(urls)
    assert len(result.added) == 300
    on_replica = frontier(replica.url, crawl)
    assert sum(on_replica.status(s).backlog for s in on_replica.sites()) == 300
    assert int(connect(primary.url).info("commandstats").get("cmdstat_wait", {}).get("calls", 0)) >= 1


def test_seeder_refuses_to_report_seeds_no_replica_has(primary_and_replica: tuple[RedisServer, RedisServer]) -> None:
    """With the replica cut off, seed() raises after its deadline instead of reporting seeds a
    failover would lose; seeding again once the replica is back reports them added or duplicate."""
    primary, replica = primary_and_replica
    crawl = "t" + uuid.uuid4().hex[:8]
    urls = [f"http://site0.test/p/{i}" for i in range(50)]
    with Seeder(primary.url, crawl, replica_timeout_s=1.0) as seeder:
        assert len(seeder.seed(["http://site0.test/"]).added) == 1  # it has seen the replica
        replica.pause()
        try:
            connect(primary.url).execute_command("CLIENT", "KILL", "TYPE", "replica")
            with pytest.raises(RedisUnavailable, match="none of its replicas"):
                seeder.seed(urls)
        finally:
            replica.resume()
        again = seeder.seed(urls)
    assert len(again.added) + len(again.duplicates) == 50


def test_seeder_sends_a_lost_batch_again_with_its_sites_sent_again() -> None:
    """A batch the master took but no replica got, with a registered site that went in a second
    call, is all on the new master when seed() returns after the master is SIGKILLed."""
    with LocalSentinel(replicas=2) as sentinel:
        crawl = "t" + uuid.uuid4().hex[:8]
        seeder = Seeder(sentinel.url, crawl, connect_timeout_s=10, replica_timeout_s=120)
        # registered by this first seed: the batch's 'seed' keys leave it for a call with all keys
        assert len(seeder.seed(["http://known.test/0"]).added) == 1
        urls = [f"http://n{i}.test/" for i in range(200)] + [f"http://known.test/{i}" for i in range(1, 6)]
        old = sentinel.master()
        on_old = frontier(old.url, crawl)
        outcome: dict[str, Any] = {}

        def seed() -> None:
            try:
                outcome["result"] = seeder.seed(urls)
            except Exception as e:  # noqa: BLE001  # reported by the assertion below
                outcome["error"] = e

        thread = threading.Thread(target=seed)

        def seed_then_kill() -> None:
            thread.start()
            # both calls are on the master (the sent-again one last) and seed() waits for a replica
            wait_for(lambda: on_old.status("known.test").backlog == 6, timeout=60, what="the batch on the master")
            assert thread.is_alive(), outcome
            old.kill()

        try:
            cut_off_and_kill(connect(old.url), sentinel.replicas(), seed_then_kill)
            sentinel.wait_failover(old.port)
            thread.join(timeout=150)
        finally:
            seeder.close()
        assert not thread.is_alive() and "error" not in outcome, outcome
        assert sorted(outcome["result"].added) == sorted(urls)
        new = sentinel.master()
        on_new = frontier(new.url, crawl)
        assert new.port != old.port
        assert on_new.status("known.test").backlog == 6
        assert sum(on_new.status(f"n{i}.test").backlog for i in range(200)) == 200


def test_cluster_url_node_killed_and_left_down_loses_no_page(
    replicated_cluster: LocalCluster, tmp_path: Path, measured: Any
) -> None:
    """SIGKILL of the very node REDIS_URL names, left down: the workers follow its promoted
    replica through the other nodes, crawl every page and exit 0 by themselves."""
    cluster = replicated_cluster
    crawl = spread_crawl_name(connect(cluster.url), tuple(f"site{i}.test" for i in range(SITES)))
    named = cluster.nodes[0]
    assert cluster.role(named) == "master"

    def fail_over(_: int) -> None:
        cluster.kill(named, lag_s=LAG_S)
        cluster.wait_failover(named)

    crawl_through_failovers(cluster.url, crawl, tmp_path, 1, fail_over, measured)


def test_a_url_naming_several_nodes_starts_through_the_others_while_the_first_is_down(
    replicated_cluster: LocalCluster, tmp_path: Path
) -> None:
    """REDIS_URL names three cluster nodes, the first of them dead: a worker, the CLI and the
    reclaimer start through the other two, and the worker crawls every page."""
    import subprocess
    import sys

    cluster = replicated_cluster
    first = cluster.nodes[0]
    url = cluster.url_naming([first, *cluster.nodes[1:3]])
    cluster.kill(first)
    cluster.wait_failover(first)
    crawl = spread_crawl_name(connect(url), ("site0.test", "site1.test", "site2.test"))
    items = tmp_path / "items.jsonl"
    worker = Worker(base_settings(url, crawl, "bitmap", items, SYNTH_SEED=True, SYNTH_PAGES=60), tmp_path / "w.log")
    try:
        assert worker.wait(120) == 0, worker.log()
    finally:
        worker.close()
    assert set(crawled_urls(items)) == SyntheticWeb(sites=3, pages=60).all_urls()
    env = {"REDIS_URL": url, "PATH": "/usr/bin:/bin"}
    status = subprocess.run(
        [sys.executable, "-m", "streams_sched.cli", "status", "-c", crawl], capture_output=True, text=True, env=env,
        timeout=60,
    )
    assert status.returncode == 0, status.stderr
    check = subprocess.run(
        [sys.executable, "-m", "reclaimer", "--prefix", crawl, "--burst"], capture_output=True, text=True,
        env={**env, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}, timeout=60,
    )
    assert check.returncode == 0, check.stderr


def test_a_primary_that_rejoins_empty_is_warned_of_at_start_and_called_a_loss(tmp_path: Path, measured: Any) -> None:
    """Cluster primaries with replicas and no persistence: the workers warn at start; the busiest
    one SIGKILLed and restarted at once comes back empty as the primary, which the workers report
    at ERROR as lost data; the crawl still ends with every page and exit 0."""
    with LocalCluster(3, replicas=1, node_timeout_ms=3000, bloom=find_redisbloom() is not None) as cluster:
        crawl = spread_crawl_name(connect(cluster.url), tuple(f"site{i}.test" for i in range(SITES)))
        wiped: list[int] = []

        def restart_at_once(_: int) -> None:
            victim = cluster.busiest_master()
            keys_before = int(cluster.client(victim).dbsize())
            cluster.kill(victim)
            cluster.restart(victim)  # within cluster-node-timeout: no failover, it is still the primary
            wait_for(lambda: cluster.role(victim) == "master", timeout=30, what="the restarted primary")
            wiped.append(keys_before)

        # Redis threw the primary's data away: what is crawled again is not the workers' to bound
        crawl_through_failovers(cluster.url, crawl, tmp_path, 1, restart_at_once, measured, within_bound=False)
        logs = [(tmp_path / f"w{i}.log").read_text(errors="replace") for i in range(2)]
    assert all("has 1 replica(s) but appendonly is no" in log for log in logs[:1])
    assert any("restarted empty (appendonly no, nothing loaded)" in log for log in logs), logs[0][-3000:]
    measured(f"the restarted primary held {wiped[0]} keys before it came back empty")


def test_sentinel_url_first_sentinel_and_the_primary_killed_and_left_down(tmp_path: Path, measured: Any) -> None:
    """The sentinel the URL names first and the primary are SIGKILLed and left down: the workers
    ask the other sentinels, follow the promoted replica, crawl every page and exit 0."""
    with LocalSentinel(replicas=2, bloom=find_redisbloom() is not None, appendonly=True) as sentinel:

        def fail_over(_: int) -> None:
            sentinel.sentinels[0].kill()
            old = sentinel.master()
            cut_off_and_kill(sentinel.node_client(old), sentinel.replicas(), old.kill)
            sentinel.wait_failover(old.port)

        crawl_through_failovers(sentinel.url, "t" + uuid.uuid4().hex[:8], tmp_path, 1, fail_over, measured)


def test_a_primary_that_rejoins_empty_while_only_revisits_run_is_called_a_loss(tmp_path: Path, measured: Any) -> None:
    """Revisits only: a cluster primary without AOF restarted at once loses its tracked pages, and a worker says so at ERROR."""
    sites = tuple(f"site{i}.test" for i in range(3))
    with LocalCluster(3, replicas=1, node_timeout_ms=3000, bloom=find_redisbloom() is not None) as cluster:
        crawl = spread_crawl_name(connect(cluster.url), sites)
        items = tmp_path / "items.jsonl"
        every = SyntheticWeb(sites=3, pages=30).all_urls()
        settings = base_settings(
            cluster.url, crawl, "bitmap", items, SYNTH_SEED=True, SYNTH_SITES=3, SYNTH_PAGES=30,
            STREAMS_LEASE_SECONDS=10, STREAMS_SOCKET_TIMEOUT_SECONDS=2, TRACK_ONE_IN=1, TRACK_EVERY_SECONDS=1.0,
        )
        w = Worker({**settings, "RECORD_TAG": "w0"}, tmp_path / "w0.log", spider="spiders.TrackedSpider")
        try:
            wait_for(lambda: set(first_visits(items)) == every, timeout=60, what="every page crawled once")
            wait_for(lambda: len(read_items(items)) >= 2 * len(every), timeout=60, what="a round of revisits")
            f = frontier(cluster.url, crawl)
            owner = {s: f.client.get_node_from_key(f.site(s).delayed).port for s in sites}
            port = Counter(owner.values()).most_common(1)[0][0]  # the master with most of the sites
            victim = next(n for n in cluster.nodes if n.port == port)
            held = sorted(s for s, p in owner.items() if p == port)
            cluster.kill(victim)
            cluster.restart(victim)  # within cluster-node-timeout: no failover, it is still the primary
            wait_for(lambda: cluster.role(victim) == "master", timeout=30, what="the restarted primary")
            wait_for(lambda: "Redis is reachable again" in w.log(), timeout=30, what="the worker back")
            lost = check_tracked_once(cluster.url, crawl, {u for u in every if tracked_page(u, 1)})
            assert lost and "lost" in lost[0], lost  # Redis threw them away: the loss to report
            reported = "restarted empty (appendonly no, nothing loaded)"
            try:
                wait_for(lambda: reported in w.log(), timeout=10, what="a worker to report the empty primary")
            finally:
                measured(f"the primary of {held} restarted empty: {lost[0].split(', e.g.')[0]};"
                         f" reported at ERROR: {reported in w.log()}")
        finally:
            w.close()
