"""A short seeded fault campaign (tests/campaign.py): each run draws several faults from its
seed (node SIGKILL or SIGSTOP, the URL's node included, maxmemory reached, connections cut,
workers killed, stopped or with a clock off) over one crawl on a 3+3 Redis Cluster or under
Sentinel, then checks that every page was crawled, every worker exited 0 by itself with no
traceback, no worker logged a loss ERROR that no fault of the run could cause (every node
keeps an AOF: only a node restarted empty loses data, only a node killed or stopped can be
replaced by a replica without writes), and nothing was left in Redis. A seed of TRACKED_SEEDS runs with one page in 20
tracked (continuous crawling), and checks too that, after the first pass, each tracked page
is in the frontier exactly once. A failure prints the seed and the schedule.

Replay a seed: ``STREAMS_CAMPAIGN_SEED=SEED STREAMS_CAMPAIGN_SETUP=cluster pytest
tests/test_campaign.py`` (several seeds: comma-separated; ``STREAMS_CAMPAIGN_TRACKED=1``
with tracked pages); ``python -m bench faults`` runs many seeds for a given time."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from campaign import SETUPS, Fault, Fired, RunResult, draw_schedule, run_campaign

from streams_sched.testing import redis_server_binary

from helpers import missing

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: the seeds CI runs: between them every kind of fault, the URL's node killed on both set-ups;
#: cluster 215 starts a worker while a master it has just read is dead, not yet failed over
CI_SEEDS = {"cluster": [474, 800, 215], "sentinel": [1819, 4670]}
#: the CI seeds run with tracked pages: both stop a worker with SIGTERM (its tracked leases
#: handed back) and cut connections; cluster 474 stops the URL's node, refuses writes (acks
#: that carry next visits among them) and kills a master that lags behind, Sentinel 4670
#: kills the primary (restarted), then the first sentinel, and stops the new primary
TRACKED_SEEDS = {("cluster", 474), ("sentinel", 4670)}


def seeds(setup: str) -> list[int]:
    """CI_SEEDS, or the seeds of STREAMS_CAMPAIGN_SEED for the set-up STREAMS_CAMPAIGN_SETUP (both when unset)."""
    wanted = os.environ.get("STREAMS_CAMPAIGN_SEED")
    if not wanted:
        return CI_SEEDS[setup]
    chosen = os.environ.get("STREAMS_CAMPAIGN_SETUP", setup)
    return [int(s) for s in wanted.split(",") if s.strip()] if chosen == setup else []


def tracked(setup: str, seed: int) -> bool:
    """Whether the run has tracked pages: a seed of TRACKED_SEEDS, or any replayed with STREAMS_CAMPAIGN_TRACKED=1."""
    if os.environ.get("STREAMS_CAMPAIGN_SEED"):
        return os.environ.get("STREAMS_CAMPAIGN_TRACKED", "") not in ("", "0")
    return (setup, seed) in TRACKED_SEEDS


def check(setup: str, seed: int, tmp_path: Path, measured: Any) -> None:
    if redis_server_binary() is None:
        missing("the fault campaign needs redis-server")
    result = run_campaign(setup, seed, tmp_path, say=print, tracked=tracked(setup, seed))
    measured(result.summary())
    assert not result.failures(), result.report()


def params(setup: str) -> list[Any]:
    """seeds(setup), each named with "-tracked" when it runs with tracked pages."""
    return [pytest.param(s, id=f"{s}-tracked" if tracked(setup, s) else str(s)) for s in seeds(setup)]


@pytest.mark.parametrize("seed", params("cluster"))
def test_cluster_campaign(seed: int, tmp_path: Path, measured: Any) -> None:
    """A seed's faults over one crawl on a 3+3 Redis Cluster lose no page, leave no worker failed and nothing in Redis, and (tracked) each tracked page once."""
    check("cluster", seed, tmp_path, measured)


@pytest.mark.parametrize("seed", params("sentinel"))
def test_sentinel_campaign(seed: int, tmp_path: Path, measured: Any) -> None:
    """A seed's faults over one crawl under Sentinel lose no page, leave no worker failed and nothing in Redis, and (tracked) each tracked page once."""
    check("sentinel", seed, tmp_path, measured)


def test_a_schedule_depends_on_its_seed_alone() -> None:
    """The same seed draws the same schedule; faults come in crawl order, within what the set-up survives."""
    for setup in SETUPS:
        for seed in range(200):
            schedule = draw_schedule(seed, setup)
            assert schedule == draw_schedule(seed, setup)
            assert [f.at for f in schedule] == sorted(f.at for f in schedule)
            assert 3 <= len(schedule) <= 5
            left_down = [f.target for f in schedule if f.kind == "kill-node" and f.then == "down"]
            assert len(left_down) == len(set(left_down))
            for a, b in zip(schedule, schedule[1:], strict=False):
                assert not (a.with_next and a.kind in ("kill-node", "stop-node") and b.kind in ("kill-node", "stop-node"))
    assert draw_schedule(1, "cluster") != draw_schedule(2, "cluster")


def test_a_loss_error_that_no_fault_explains_fails_the_run() -> None:
    """A "restarted empty" ERROR fails a run without a node restarted empty, and a "promoted
    without" ERROR fails a run without a node killed or stopped; the same lines after such a
    fault are true and pass."""
    empty = "ERROR: Redis primary 127.0.0.1:7000 restarted empty (appendonly no, nothing loaded) and took writes"
    rolled = "ERROR: Redis primary 127.0.0.1:7003 was promoted without the last 4,096 bytes of writes"

    def run(*faults: Fault) -> RunResult:
        result = RunResult("cluster", 1, list(faults), fired=[Fired(f) for f in faults])
        result.loss_errors = {"w1": [empty, rolled]}
        return result

    quiet = run(Fault("kill-worker", 0.3, "worker:1"))
    assert len(quiet.false_loss_errors()) == 2 and len(quiet.failures()) == 2
    restarted = run(Fault("kill-node", 0.3, "master:0", then="restart"))
    assert [line for line in restarted.false_loss_errors()] == [
        f"a loss ERROR in w1's log that no fault of this run explains: {empty}"]
    assert run(Fault("kill-node", 0.3, "master:0", then="restart-empty")).false_loss_errors() == []
    skipped = run(Fault("kill-node", 0.3, "master:0", then="restart-empty"))
    skipped.fired[0].skipped = "the crawl ended before it was due"
    assert len(skipped.false_loss_errors()) == 2
