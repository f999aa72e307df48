"""A Redis Cluster whose nodes answer but which is down is reported as down, with why.

The pure diagnosis over CLUSTER NODES and INFO replication, then the real case: a master
killed before its only replica finished its first full sync. Redis does not promote that
replica, so its slots stay uncovered; the worker, the reclaimer and ``streams-sched status``
name the slots, the failed master and the unsynced replica, and never say "unreachable"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from redis_tools import LocalCluster, wipe_data

from streams_sched.connect.cluster_health import describe, diagnose, parse_cluster_nodes

from helpers import Worker, base_settings, wait_for

NODES = """\
a1 127.0.0.1:7000@17000 master,fail - 1700000000000 1700000000000 1 disconnected 0-5460
b2 127.0.0.1:7001@17001 myself,master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7002@17002 master - 0 1700000000000 3 connected 10923-16383
d4 127.0.0.1:7003@17003 slave a1 0 1700000000000 1 connected
e5 127.0.0.1:7004@17004 slave b2 0 1700000000000 2 connected
"""


def test_the_diagnosis_names_the_uncovered_slots_the_failed_master_and_why_its_replica_is_not_promoted() -> None:
    """Pure: a failed master whose replica never synced gives its slots, its address and the replica's reason."""
    nodes = parse_cluster_nodes(NODES)
    assert [n.address for n in nodes if n.failed] == ["127.0.0.1:7000"]
    unsynced = {"role": "slave", "master_link_status": "down", "master_sync_in_progress": 0,
                "slave_repl_offset": 0, "master_link_down_since_seconds": -1}
    down = diagnose(nodes, {"127.0.0.1:7003": unsynced})
    assert down is not None and down.uncovered == ((0, 5460),)
    text = describe(down)
    assert "slots 0-5460 have no master" in text
    assert "master 127.0.0.1:7000 (slots 0-5460) failed" in text
    assert "its replica 127.0.0.1:7003 is not promoted: it never finished its first full sync" in text
    lagging = {**unsynced, "slave_repl_offset": 9000, "master_link_down_since_seconds": 40}
    assert "link to its master has been down 40s" in describe(diagnose(nodes, {"127.0.0.1:7003": lagging}))  # type: ignore[arg-type]
    assert "it did not answer" in describe(diagnose(nodes, {"127.0.0.1:7003": None}))  # type: ignore[arg-type]
    up = parse_cluster_nodes(NODES.replace("master,fail", "master").replace("disconnected", "connected"))
    assert diagnose(up, {}) is None


@pytest.mark.e2e
@pytest.mark.slow
def test_a_master_killed_before_its_replica_synced_is_reported_as_a_cluster_down_with_why(
    crawl: str, tmp_path: Path
) -> None:
    """A replica in its first full sync (repl-diskless-sync-delay 60), its master killed: the worker,
    the reclaimer and status say which slots have no master, which node failed and that its replica
    never synced, and none says "reached no Redis server"."""
    with LocalCluster(3, replicas=1, node_timeout_ms=1000) as cluster:
        master = cluster.nodes[0]
        (replica,) = cluster.replicas_of(master)
        items = tmp_path / "items.jsonl"
        worker = Worker(base_settings(
            cluster.url_naming(cluster.nodes[1:]), crawl, "bitmap", items, SYNTH_SEED=True, SYNTH_SITES=6,
            SYNTH_PAGES=100_000, SYNTH_DELAY_SECONDS=0.05, STREAMS_LEASE_SECONDS=3, STREAMS_SOCKET_TIMEOUT_SECONDS=1,
        ), tmp_path / "w.log")
        try:
            wait_for(lambda: items.exists() and items.stat().st_size > 0, timeout=60, what="the crawl to start")
            with cluster.client(master) as c:
                c.config_set("repl-diskless-sync", "yes")
                c.config_set("repl-diskless-sync-delay", 60)
            # the replica starts again with no data: its full sync waits the 60 s
            replica.kill()
            wipe_data(replica)
            replica.start()

            def syncing() -> bool:
                info = cluster.client(replica).info("replication")
                return info.get("role") == "slave" and info.get("master_link_status") == "down"

            wait_for(syncing, timeout=30, what="the replica waiting for its first full sync")
            master.kill()
            said = "the Redis Cluster is down (cluster_state:fail)"
            wait_for(lambda: said in worker.log(), timeout=60, what="the worker to say the cluster is down")
            line = next(ln for ln in worker.log().splitlines() if said in ln)
            slots = cluster.client(cluster.nodes[1]).execute_command("CLUSTER", "NODES")
            first = next(ln for ln in str(slots).splitlines() if f":{master.port}@" in ln).split()[8]
            assert f"slots {first} have no master" in line, line
            assert f"master 127.0.0.1:{master.port}" in line and "failed" in line, line
            assert f"its replica 127.0.0.1:{replica.port} is not promoted: it never finished its first full sync" in line
            assert "reached no Redis server" not in worker.log()
            env = {"REDIS_URL": cluster.url_naming(cluster.nodes[1:]), "PATH": "/usr/bin:/bin",
                   "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
            status = subprocess.run([sys.executable, "-m", "streams_sched.cli", "status", "-c", crawl],
                                    capture_output=True, text=True, env=env, timeout=120)
            assert status.returncode != 0 and said in status.stderr, status.stderr
            assert f"127.0.0.1:{replica.port} is not promoted" in status.stderr
            reclaimer = subprocess.run([sys.executable, "-m", "reclaimer", "--prefix", crawl, "--burst"],
                                       capture_output=True, text=True, env=env, timeout=120)
            out = reclaimer.stdout + reclaimer.stderr
            # at start (it cannot connect) or in its pass (redis_cluster_down), the same diagnosis
            assert reclaimer.returncode != 0 and said in out, out[-3000:]
            assert f"127.0.0.1:{replica.port} is not promoted" in out and "reached no Redis" not in out
        finally:
            worker.close()
