"""The autoscaling signal: workers a crawl can use now, from what its sites allow and have work for (monitor/scaling.py)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus import Prometheus

from monitor.scaling import (
    DEFAULT_WORKER_RATE,
    Demand,
    WorkerRates,
    crawl_demand,
    site_demand,
    workers_wanted,
)
from monitor.snapshot import CrawlSnapshot
from streams_sched.frontier.indexes import ShardSizes
from streams_sched.frontier.records import SiteStatus, StreamStatus
from streams_sched.frontier.seeding.seeder import Seeder
from streams_sched.politeness.policy import set_policy
from streams_sched.testing import free_port

from daemons import Daemon, try_scrape
from helpers import ROOT, frontier, wait_for

SCALED_OBJECT = ROOT / "deploy" / "kubernetes" / "components" / "keda" / "scaledobject.yaml"
NOW_MS = 1_800_000_000_000


def _status(site: str, backlog: int, **policy: str) -> SiteStatus:
    streams = {("http", "default"): StreamStatus(backlog=backlog, pending=0, oldest_pending_ms=-1)} if backlog else {}
    return SiteStatus(site, NOW_MS, streams, 0, 0, 0, {}, dict(policy))


def test_a_limited_site_asks_for_its_rate_and_no_more_than_its_backlog_allows() -> None:
    """A site at 1/s with a big backlog asks for 1/s; with 6 requests over a 60 s horizon, 0.1/s."""
    assert site_demand(_status("a", 100_000, rate="1"), default_rate=0, horizon_s=60) == 1.0
    assert site_demand(_status("a", 6, rate="1"), default_rate=0, horizon_s=60) == pytest.approx(0.1)


def test_an_unlimited_site_asks_for_its_backlog_over_the_horizon_and_a_paused_one_for_nothing() -> None:
    """Unlimited: backlog / horizon; paused by an operator or a Retry-After: 0; no backlog: 0."""
    assert site_demand(_status("a", 120), default_rate=0, horizon_s=60) == 2.0
    assert site_demand(_status("a", 120, paused="1"), default_rate=0, horizon_s=60) == 0.0
    assert site_demand(_status("a", 120, a_until=str(NOW_MS + 5000)), default_rate=0, horizon_s=60) == 0.0
    assert site_demand(_status("a", 0, rate="5"), default_rate=0, horizon_s=60) == 0.0
    assert site_demand(_status("a", 600), default_rate=2.0, horizon_s=60) == 2.0  # the crawl default applies


def test_the_demand_of_sites_not_read_is_scaled_from_those_read() -> None:
    """When the shards count more ready sites than the monitor read, the read ones stand for the rest."""
    snap = CrawlSnapshot("c", NOW_MS / 1000, sites=[_status(f"s{i}", 60) for i in range(10)],
                         shards=ShardSizes(sites=1000, ready_http=100))
    d = crawl_demand(snap, horizon_s=60)
    assert (d.sites_read, d.sites_ready) == (10, 100) and d.requests_per_s == pytest.approx(100.0)


def test_workers_wanted_rounds_up_keeps_one_while_leased_and_caps() -> None:
    """ceil(demand / worker rate); 1 while something is leased even with no demand; 0 otherwise; --max-workers caps."""
    assert workers_wanted(Demand(10.0, 10, 10, False), 20.0) == 1
    assert workers_wanted(Demand(41.0, 10, 10, False), 20.0) == 3
    assert workers_wanted(Demand(0.0, 0, 0, True), 20.0) == 1
    assert workers_wanted(Demand(0.0, 0, 0, False), 20.0) == 0
    assert workers_wanted(Demand(1000.0, 10, 10, False), 20.0, max_workers=5) == 5


def test_the_worker_rate_is_measured_from_heartbeats_and_configured_wins() -> None:
    """Two heartbeats 10 s apart with 500 more acks measure 50/s; a configured rate wins; none yet: the default."""
    rates = WorkerRates()
    assert rates.rate(0) == DEFAULT_WORKER_RATE
    rates.observe({"w1": {"acked": 100, "last_seen": 1000.0}}, ["w1"])
    rates.observe({"w1": {"acked": 600, "last_seen": 1010.0}}, ["w1"])
    assert rates.rate(0) == 50.0 and rates.rate(7.5) == 7.5
    rates.observe({"w1": {"acked": 700, "last_seen": 1020.0}}, ["w1"])  # slower now: the best is kept
    assert rates.rate(0) == 50.0


# -- against a real Prometheus scraping the monitor ------------------------------------


def _scaled_object_query(crawl: str) -> str:
    """The KEDA ScaledObject's PromQL, for ``crawl`` (the manifests name crawl "example")."""
    doc = yaml.safe_load(SCALED_OBJECT.read_text())
    query = doc["spec"]["triggers"][0]["metadata"]["query"]
    assert 'crawl="example"' in query, query
    return query.replace('crawl="example"', f'crawl="{crawl}"')


@pytest.fixture
def watched(plain_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Daemon, Prometheus, int]]:
    """A monitor (worker rate unset: measured or the default) and a Prometheus scraping it every second."""
    port = free_port()
    # a read of 10,000 sites takes a second or more on 2 cores: scrapes reuse the loop's reads
    monitor = Daemon("monitor", ["--redis-url", plain_redis_url, "--metrics-port", str(port), "--interval", "0.5",
                                 "--cache-seconds", "4", "--no-events"], tmp_path_factory.mktemp("monitor") / "m.log")
    try:
        wait_for(lambda: try_scrape(port), timeout=20, what="the monitor's /metrics")
        with Prometheus([f"127.0.0.1:{port}"], interval="2s") as prom:
            yield monitor, prom, port
    finally:
        monitor.close()


def _asks(prom: Prometheus, crawl: str, n: int, timeout: float = 30) -> None:
    query = _scaled_object_query(crawl)
    wait_for(lambda: prom.value(query) == n, timeout=timeout, what=f"{query} == {n} (now {prom.value(query)})")


@pytest.mark.e2e
def test_a_million_requests_on_ten_sites_at_one_per_second_ask_for_one_worker(
    plain_redis_url: str, crawl: str, watched: tuple[Daemon, Prometheus, int]
) -> None:
    """1,000,000 requests queued on 10 sites limited to 1 request/s each: the ScaledObject's query asks for 1 worker, not a hundred."""
    _, prom, _ = watched
    with Seeder(plain_redis_url, crawl, batch=5000) as seeder:
        f = seeder.frontier
        for i in range(10):
            set_policy(f, f"slow{i}.test", {"rate": 1})
        # dont_filter: exactly a million queued (the seen filter would take a few as false positives)
        result = seeder.seed((f"http://slow{i % 10}.test/p/{i}" for i in range(1_000_000)), dont_filter=True)
    assert len(result.added) == 1_000_000
    _asks(prom, crawl, 1, timeout=60)
    demand = prom.value(f'streams_sched_demand_requests_per_second{{crawl="{crawl}"}}')
    assert demand == pytest.approx(10.0)


@pytest.mark.e2e
def test_ten_thousand_unlimited_sites_ask_for_what_the_measured_worker_rate_needs(
    plain_redis_url: str, crawl: str, watched: tuple[Daemon, Prometheus, int], tmp_path: Path
) -> None:
    """10,000 one-page unlimited sites: the query asks ceil(demand / worker rate) workers, the rate measured from a worker's heartbeats once one has run."""
    from streams_sched.demo.web import SyntheticWeb

    from helpers import Worker, base_settings

    _, prom, _ = watched
    web = SyntheticWeb(sites=10_000, pages=1)
    with Seeder(plain_redis_url, crawl) as seeder:
        seeder.seed(web.seeds())
    demand_q = f'streams_sched_demand_requests_per_second{{crawl="{crawl}"}}'
    rate_q = f'streams_sched_worker_rate_requests_per_second{{crawl="{crawl}"}}'
    # generous deadlines: the monitor reads 10,000 sites each pass, slow on two loaded cores
    wait_for(lambda: (prom.value(demand_q) or 0) > 150, timeout=120, what="the demand of 10,000 pages over 60 s")
    assert prom.value(rate_q) == DEFAULT_WORKER_RATE  # no worker has run yet
    _asks(prom, crawl, 9, timeout=60)  # ceil(10,000 / 60 s / 20 per s)
    # a worker crawls for a while, heartbeating every 0.5 s: the monitor measures its rate
    w = Worker(base_settings(plain_redis_url, crawl, "bitmap", tmp_path / "items.jsonl", SYNTH_SITES=10_000, SYNTH_PAGES=1),
               tmp_path / "w.log")
    try:
        wait_for(lambda: (prom.value(rate_q) or 0) not in (0, DEFAULT_WORKER_RATE), timeout=120, what="a measured worker rate")
        w.proc.send_signal(signal.SIGTERM)  # as a scale-in does: it hands back what it has not started
        assert w.wait(60) == 0, w.log()
    finally:
        w.close()

    def consistent() -> bool:
        demand, rate = prom.value(demand_q), prom.value(rate_q)
        wanted = prom.value(_scaled_object_query(crawl))
        return None not in (demand, rate, wanted) and wanted == -(-demand // rate) and wanted >= 1  # type: ignore[operator]

    wait_for(consistent, timeout=60, what="workers wanted = ceil(demand / measured rate)")


@pytest.mark.e2e
def test_a_crawl_whose_work_is_all_delayed_asks_for_no_worker_until_it_falls_due(
    plain_redis_url: str, crawl: str, watched: tuple[Daemon, Prometheus, int], tmp_path: Path
) -> None:
    """Requests delayed 8 s: the query asks for 0 workers (scale to zero); once the reclaimer promotes them as they fall due, it asks again."""
    _, prom, _ = watched
    f = frontier(plain_redis_url, crawl)
    now = f.clock.now()
    with Seeder(plain_redis_url, crawl) as seeder:
        seeder.seed([f"http://later{i}.test/" for i in range(50)], meta={"not_before": now + 8})
    assert f.status("later0.test").delayed == 1
    _asks(prom, crawl, 0)
    reclaimer = Daemon("reclaimer", ["--redis-url", plain_redis_url, "--interval", "0.5"], tmp_path / "r.log")
    try:
        assert prom.value(_scaled_object_query(crawl)) == 0  # nothing is due yet
        _asks(prom, crawl, 1, timeout=40)
        assert f.clock.now() >= now + 8
    finally:
        reclaimer.close()
