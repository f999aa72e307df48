"""Every loss ERROR is true: failovers that lose nothing log none, and those that lose data log one.

Real clusters and Sentinel set-ups, SIGKILLs mid-crawl, two workers. Where nothing was lost
(a master left down, one killed twice and restarted as a replica, a Sentinel primary
restarted empty that synced before it was promoted) no worker logs "restarted empty" or
"was promoted without"; where Redis did throw writes away (a Sentinel replica promoted
before its first full sync ended) a worker says so at ERROR with the bytes. The real empty
restarts are in test_failover.py and test_faults.py."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from conftest import spread_crawl_name
from redis_tools import LocalCluster, LocalSentinel
from test_failover import LAG_S, crawl_through_failovers, cut_off_and_kill

from streams_sched.connect.clients import connect
from streams_sched.testing import find_redisbloom

from helpers import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: the words of the loss ERRORs
LOSSES = ("restarted empty", "was promoted without")


def loss_lines(tmp_path: Path) -> list[str]:
    """The loss ERROR lines of both workers' logs."""
    out = []
    for i in range(2):
        log = tmp_path / f"w{i}.log"
        if log.exists():
            out += [ln for ln in log.read_text(errors="replace").splitlines() if "ERROR" in ln and any(w in ln for w in LOSSES)]
    return out


def no_persistence_cluster() -> LocalCluster:
    """3 masters with a replica each and no persistence, as the cluster tutorials run them."""
    return LocalCluster(3, replicas=1, node_timeout_ms=1500, bloom=find_redisbloom() is not None)


def test_a_cluster_master_killed_and_left_down_is_no_loss(tmp_path: Path, measured: Any) -> None:
    """No persistence, a cluster a minute old: the URL's master killed and left down, its replica promoted; no loss ERROR."""
    with no_persistence_cluster() as cluster:
        crawl = spread_crawl_name(connect(cluster.url), tuple(f"site{i}.test" for i in range(8)))
        named = cluster.nodes[0]

        def fail_over(_: int) -> None:
            cluster.kill(named, lag_s=LAG_S)
            cluster.wait_failover(named)

        crawl_through_failovers(cluster.url, crawl, tmp_path, 1, fail_over, measured)
    assert not loss_lines(tmp_path), loss_lines(tmp_path)


def test_a_cluster_master_killed_twice_and_restarted_as_a_replica_is_no_loss(tmp_path: Path, measured: Any) -> None:
    """No persistence: the busiest master killed twice, each time restarted empty after its replica
    was promoted (it answers as a master until the cluster demotes it); no loss ERROR."""
    with no_persistence_cluster() as cluster:
        crawl = spread_crawl_name(connect(cluster.url), tuple(f"site{i}.test" for i in range(8)))

        def fail_over(_: int) -> None:
            wait_for(lambda: any(cluster.has_replica(m) for m in cluster.masters()), timeout=90,
                     what="a master with a replica in sync")
            victim = max((m for m in cluster.masters() if cluster.has_replica(m)),
                         key=lambda n: int(cluster.client(n).dbsize()))
            cluster.kill(victim, lag_s=LAG_S)
            cluster.wait_failover(victim)
            cluster.restart(victim)
            wait_for(lambda: cluster.role(victim) == "slave", timeout=30, what="the restarted master demoted")

        def check_url() -> str:
            return cluster.url_naming([n for n in cluster.nodes if n.proc is not None and n.proc.poll() is None])

        crawl_through_failovers(cluster.url, crawl, tmp_path, 2, fail_over, measured, check_url=check_url)
    assert not loss_lines(tmp_path), loss_lines(tmp_path)


def test_a_sentinel_primary_restarted_empty_that_synced_before_its_promotion_is_no_loss(
    tmp_path: Path, measured: Any
) -> None:
    """No persistence, one replica: the primary killed twice; the old primary restarts empty, is made a
    replica, syncs fully and is promoted by the second failover; no loss ERROR."""
    with LocalSentinel(replicas=1, bloom=find_redisbloom() is not None) as sentinel:

        def fail_over(_: int) -> None:
            sentinel.wait_replicas(1, timeout=120)  # the restarted node has synced
            old = sentinel.master()
            cut_off_and_kill(sentinel.node_client(old), sentinel.replicas(), old.kill)
            sentinel.wait_failover(old.port)
            sentinel.restart(old)

        crawl_through_failovers(sentinel.url, "t" + uuid.uuid4().hex[:8], tmp_path, 2, fail_over, measured,
                                longer=True)
    assert not loss_lines(tmp_path), loss_lines(tmp_path)


def promote_before_sync(sentinel: LocalSentinel) -> None:
    """Two failovers a few seconds apart, AOF on: the primary is killed, its replica promoted; the
    old primary restarts from its AOF and is made a replica of the new one, which holds its full
    sync back (repl-diskless-sync-delay 60); the new primary is killed, and the sentinels
    promote the old one, at replication offset 0 of a history of its own."""
    sentinel.wait_replicas(1, timeout=120)
    first = sentinel.master()
    cut_off_and_kill(sentinel.node_client(first), sentinel.replicas(), first.kill)
    second = sentinel.node_on(sentinel.wait_failover(first.port))
    with sentinel.node_client(second) as c:
        c.config_set("repl-diskless-sync", "yes")
        c.config_set("repl-diskless-sync-delay", 60)
    sentinel.restart(first)

    def syncing() -> bool:
        try:  # the restarted node may still be loading its AOF, or drop the link as it turns replica
            with sentinel.node_client(first) as c:
                info = c.info("replication")
        except redis.RedisError:
            return False
        return info.get("role") == "slave" and info.get("master_port") == second.port and info.get(
            "master_link_status") == "down"

    # the sentinels convert a restarted old primary at their next INFO of it (every 10 s), later
    # on a loaded machine; the held-back sync leaves 60 s after that
    wait_for(syncing, timeout=90, what="the old primary made a replica, its full sync held back")
    with sentinel.sentinel_client(sentinel.sentinels[0]) as s:
        wait_for(lambda: any(int(r["port"]) == first.port for r in s.sentinel_slaves(sentinel.service)),
                 timeout=30, what="the sentinels to know the old primary as a replica")
    second.kill()
    assert sentinel.wait_failover(second.port, timeout=60) == first.port


def test_a_sentinel_replica_promoted_before_its_first_sync_is_an_error_with_the_bytes(
    tmp_path: Path, measured: Any
) -> None:
    """AOF on: the old primary promoted before its full sync ended serves its own older data; a
    worker says at ERROR that the promotion never descended from what it wrote, with the bytes."""
    with LocalSentinel(replicas=1, bloom=find_redisbloom() is not None, appendonly=True) as sentinel:
        crawl_through_failovers(
            sentinel.url, "t" + uuid.uuid4().hex[:8], tmp_path, 1, lambda _: promote_before_sync(sentinel), measured,
            within_bound=False,
        )
    lines = loss_lines(tmp_path)
    errors = [ln for ln in lines if "was promoted without the last" in ln and "never descended" in ln]
    assert errors, lines or (tmp_path / "w0.log").read_text(errors="replace")[-4000:]
    measured(f"loss ERROR: {errors[0].split('ERROR: ')[-1][:200]}")
