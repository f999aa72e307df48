"""streams-sched move as processes: two Scrapy workers crawling, the crawl moved to a 3-master cluster under them, the workers restarted there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streams_sched.connect.clients import redact

from helpers import Worker, base_settings, crawl_to_end, crawled_urls, read_items, wait_for
from transfer_helpers import fresh

pytestmark = [pytest.mark.e2e]

ROOT = Path(__file__).resolve().parent.parent

#: the moved workers' lease time: the longest the move waits for their requests in flight
LEASE_S = 5


def _cli(url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "streams_sched.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.cluster
def test_a_crawl_moved_under_two_workers_to_a_cluster_finishes_there_with_every_page(
    plain_redis_url: str, redis_source: Any, tmp_path: Path, measured: Any
) -> None:
    """`move` with two workers crawling: they stop with exit code 6 and one line naming the cluster, leasing stops for at most the copy plus one lease time, and two workers started with the new REDIS_URL finish the crawl with the pages of Scrapy's in-memory scheduler; only requests still leased when the copy began are crawled twice."""
    crawl = "moving"
    source = plain_redis_url
    target = fresh(redis_source.cluster_url())
    web = {"SYNTH_SEED": True, "SYNTH_SITES": 4, "SYNTH_PAGES": 150}
    memory_items = tmp_path / "memory.jsonl"
    crawl_to_end(Worker(base_settings(source, "memory", "bitmap", memory_items, **web,
                                      SCHEDULER="scrapy.core.scheduler.Scheduler"), tmp_path / "memory.log"))
    want = set(crawled_urls(memory_items))
    assert len(want) == 600

    items = tmp_path / "items.jsonl"
    settings = base_settings(source, crawl, "bitmap", items, **web, SYNTH_DELAY_SECONDS=0.03,
                             STREAMS_LEASE_SECONDS=LEASE_S, CONCURRENT_REQUESTS=8, CONCURRENT_REQUESTS_PER_DOMAIN=4)
    old = [Worker({**settings, "RECORD_TAG": f"old{i}"}, tmp_path / f"old{i}.log") for i in range(2)]
    try:
        wait_for(lambda: len(read_items(items)) >= 150, timeout=90, what="150 pages crawled before the move")
        moved = _cli(source, "move", "-c", crawl, "--to", target)
        assert moved.returncode == 0, moved.stderr
        at_move = len(read_items(items))
        codes = [w.wait(60) for w in old]
        logs = [w.log() for w in old]
    finally:
        for w in old:
            w.close()
    assert codes == [6, 6], logs
    for log in logs:
        said = [line for line in log.splitlines() if "has moved to" in line]
        assert len(said) == 1 and f"REDIS_URL={redact(target)}" in said[0], log
    report = moved.stderr
    stopped = float(re.search(r"leasing stopped for ([\d.]+)s", report).group(1))  # type: ignore[union-attr]
    copy = float(re.search(r"([\d.]+)s copying", report).group(1))  # type: ignore[union-attr]
    leased = int(re.search(r"(\d+) request\(s\) still leased were copied", report).group(1))  # type: ignore[union-attr]
    assert stopped <= copy + LEASE_S + 1.0, report  # the wait is bounded by one lease time; 1 s for the seal

    # a producer that meets the mark stops too, naming the new place
    pushed = _cli(source, "push", "-c", crawl, "http://site0.test/p/1")
    assert pushed.returncode == 6 and f"REDIS_URL={redact(target)}" in pushed.stderr, pushed.stderr
    reclaimer = subprocess.run([sys.executable, "-m", "reclaimer", "--redis-url", source, "--prefix", crawl, "--burst"],
                               env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=60)
    assert reclaimer.returncode == 6 and "has moved to" in reclaimer.stderr, reclaimer.stderr

    new = [Worker({**settings, "REDIS_URL": target, "RECORD_TAG": f"new{i}"}, tmp_path / f"new{i}.log")
           for i in range(2)]
    crawl_to_end(*new, timeout=180)
    seen = crawled_urls(items)
    assert set(seen) == want
    twice = sum(n - 1 for n in seen.values())
    assert twice <= leased, (twice, leased)
    workers = {i["worker"] for i in read_items(items)}
    assert workers & {"old0", "old1"} and workers & {"new0", "new1"}  # the crawl went on where it moved
    measured(f"moved at {at_move}/600 pages under two workers: leasing stopped {stopped:.2f} s ({copy:.2f} s copying,"
             f" lease time {LEASE_S} s), {leased} request(s) still leased copied as queued, {twice} page(s) crawled twice;"
             " both workers exited 6 with one line, and two new ones finished on the cluster")
