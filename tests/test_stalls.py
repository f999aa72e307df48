"""A worker never stalls in silence: a long outage becomes an ERROR that names the servers
tried, then a summary a minute; a cycle that never returns is reported with where it is."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest
import redis

from streams_sched.connect.clients import connect, describe_nodes
from streams_sched.testing import RedisServer, free_port
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.io.trouble import OUTAGE_SUMMARY_S, Trouble
from streams_sched.worker.watchdog import Watchdog

from helpers import Worker, base_settings, crawled_urls, read_items, wait_for


def test_an_outage_longer_than_a_lease_is_an_error_naming_what_was_tried(caplog: Any) -> None:
    """One WARNING at once, one ERROR naming the servers once it lasts a lease, a summary a
    minute after, and the end of the outage said at ERROR too."""
    x = Exchange()
    trouble = Trouble(x, lambda: None, tried=lambda: "cluster nodes a:1, b:2", escalate_after_s=8.0)
    error = redis.ConnectionError("Error 111 connecting to a:1. Connection refused.")
    with caplog.at_level(logging.WARNING, logger="streams_sched.worker.io.trouble"):
        for t in (100.0, 101.0, 107.9):
            trouble.outage(error, now=t)
        assert [r.levelname for r in caplog.records] == ["WARNING"]
        assert x.unreachable_since == 100.0
        trouble.outage(error, now=108.0)
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "for 8s (tried cluster nodes a:1, b:2; last error: Error 111" in errors[0]
        trouble.outage(error, now=108.0 + OUTAGE_SUMMARY_S - 1)
        assert sum(r.levelname == "ERROR" for r in caplog.records) == 1
        trouble.outage(error, now=108.0 + OUTAGE_SUMMARY_S)
        assert "still no Redis after 68s (6 tries; tried cluster nodes a:1, b:2" in caplog.records[-1].getMessage()
        assert trouble.reachable()
        assert caplog.records[-1].levelname == "ERROR" and "reachable again" in caplog.records[-1].getMessage()
    assert x.unreachable_since is None


def test_a_cluster_that_answers_but_is_down_is_said_as_such_once_a_minute(caplog: Any) -> None:
    """CLUSTERDOWN past a lease: the ERROR is the diagnosis (slots, failed master, why), once a
    minute, and never "reached no Redis server"."""
    down = "the Redis Cluster is down (cluster_state:fail): slots 0-5460 have no master"
    trouble = Trouble(Exchange(), lambda: None, tried=lambda: "cluster nodes a:1", escalate_after_s=8.0,
                      diagnose=lambda: down)
    error = redis.exceptions.ClusterDownError("The cluster is down")
    with caplog.at_level(logging.WARNING, logger="streams_sched.worker.io.trouble"):
        for t in (100.0, 108.0, 130.0, 168.0):
            trouble.outage(error, now=t)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 2 and all(down in e for e in errors), errors
    assert "for 8s" in errors[0] and "for 68s" in errors[1]
    assert "reached no Redis" not in caplog.text and "still no Redis" not in caplog.text


def test_a_short_outage_stays_one_warning(caplog: Any) -> None:
    """An outage shorter than a lease logs one WARNING when it starts and one when it ends."""
    trouble = Trouble(Exchange(), lambda: None, escalate_after_s=8.0)
    with caplog.at_level(logging.WARNING, logger="streams_sched.worker.io.trouble"):
        for t in (0.0, 1.0, 2.0):
            trouble.outage(redis.ConnectionError("refused"), now=t)
        trouble.reachable()
    assert [r.levelname for r in caplog.records] == ["WARNING", "WARNING"]


def test_describe_nodes_names_what_each_kind_of_client_tries() -> None:
    """The servers named in outage errors: the address, the sentinels and service."""
    assert describe_nodes(connect("redis://10.1.2.3:6390/0")) == "10.1.2.3:6390"
    assert describe_nodes(connect("redis+sentinel://s1:5000,s2/mymaster/0")) == (
        "the primary of 'mymaster' through sentinels s1:5000, s2:26379"
    )


def test_a_cycle_that_never_returns_is_reported_with_where_it_is(caplog: Any) -> None:
    """The watchdog says when a cycle has run past its limit, with the I/O thread's stack,
    repeats a summary a minute, and says when the thread moves again."""
    x = Exchange()
    release = threading.Event()

    def stuck_cycle() -> None:
        x.io_thread = threading.get_ident()
        x.cycle_started = 50.0
        release.wait(30)
        x.cycle_started = 0.0

    thread = threading.Thread(target=stuck_cycle, name="fake-io")
    thread.start()
    try:
        wait_for(lambda: x.cycle_started, timeout=5, what="the cycle to start")
        dog = Watchdog(x, stuck_after_s=30.0, summary_s=60.0)
        with caplog.at_level(logging.ERROR, logger="streams_sched.worker.watchdog"):
            dog.check(now=79.0)
            assert not caplog.records and dog.stuck_s(now=79.0) == 29.0
            dog.check(now=80.0)
            assert len(caplog.records) == 1
            assert "in one Redis cycle for 30s" in caplog.text and "in stuck_cycle" in caplog.text
            dog.check(now=139.0)
            assert len(caplog.records) == 1
            dog.check(now=140.0)
            assert "still in one Redis cycle after 90s" in caplog.records[-1].getMessage()
            release.set()
            wait_for(lambda: not x.cycle_started, timeout=5, what="the cycle to end")
            dog.check(now=141.0)
            assert "moving again after 91s" in caplog.records[-1].getMessage()
    finally:
        release.set()
        thread.join()


def _scrape(port: int) -> dict[str, float]:
    from urllib.request import urlopen

    values = {}
    for line in urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode().splitlines():
        if line.startswith("streams_sched_worker_") and " " in line:
            name, _, value = line.rpartition(" ")
            values[name.partition("{")[0]] = float(value)
    return values


@pytest.mark.e2e
def test_a_worker_whose_redis_stays_away_says_so_at_error_and_resumes(crawl: str, tmp_path: Path) -> None:
    """Redis SIGKILLed mid-crawl and kept down past a lease: the worker logs an ERROR naming the
    server it tries, its metric counts the seconds, and once Redis is back it crawls every page."""
    server = RedisServer(port=free_port(), appendonly=True).start()
    metrics_port = free_port()
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        server.url, crawl, "auto", items,
        SYNTH_SEED=True, SYNTH_SITES=2, SYNTH_PAGES=120, SYNTH_DELAY_SECONDS=0.05,
        STREAMS_LEASE_SECONDS=3, STREAMS_SOCKET_TIMEOUT_SECONDS=1, STREAMS_METRICS_PORT=metrics_port,
    )
    worker = Worker(settings, tmp_path / "w.log")
    try:
        wait_for(lambda: len(read_items(items)) >= 20, timeout=60, what="the crawl to start")
        server.kill()
        wait_for(lambda: "has reached no Redis server of its crawl" in worker.log(), timeout=30,
                 what="the outage ERROR")
        line = next(ln for ln in worker.log().splitlines() if "has reached no Redis server" in ln)
        assert " ERROR: " in line and f"tried 127.0.0.1:{server.port}" in line, line
        assert _scrape(metrics_port)["streams_sched_worker_redis_unreachable_seconds"] >= 3
        server.start()
        assert worker.wait(120) == 0, worker.log()
    finally:
        worker.close()
        server.cleanup()
    from streams_sched.demo.web import SyntheticWeb

    assert set(crawled_urls(items)) == SyntheticWeb(sites=2, pages=120).all_urls()
    assert "Traceback" not in worker.log()

