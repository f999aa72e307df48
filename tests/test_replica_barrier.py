"""The replica barrier against a real primary and replica (the decisions without Redis are
in test_replicas.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
import redis
from conftest import _missing

from streams_sched.connect.replicas import ReplicaBook, ReplicaGuard, Verdict, parse_replication
from streams_sched.testing import RedisServer, redis_server_binary

from helpers import wait_for


@pytest.fixture
def primary() -> Iterator[RedisServer]:
    """A server of its own: the test attaches a replica to it and takes it away."""
    if redis_server_binary() is None:
        _missing("redis-server is not installed (apt-get install redis-server)")
    with RedisServer() as server:
        yield server


def online_replicas(client: redis.Redis) -> int:
    return parse_replication(client.info("replication")).connected


@pytest.mark.e2e
def test_a_replica_back_after_auto_gave_up_holds_the_acks_of_the_very_next_write(primary: RedisServer) -> None:
    """After auto gave up on a primary, a replica back from a resync holds the very next write's acks until it has it."""
    client = redis.Redis.from_url(primary.url)
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
    replica.start()
    try:
        guard = ReplicaGuard(client, ReplicaBook(grace_s=0.5), wait_ms=50, node_id="test")
        wait_for(lambda: online_replicas(client) == 1, timeout=30, what="the replica to sync")
        assert guard.required("", time.monotonic()) == 1
        replica.stop()
        wait_for(lambda: online_replicas(client) == 0, timeout=30, what="the primary to see its replica gone")
        # held through the grace, then auto gives up: the acks go without a replica
        wait_for(lambda: guard.barrier("", "sync", time.monotonic()) is Verdict.PASS, timeout=30,
                 what="auto to stop waiting")
        assert guard.book.required("") == 0

        replica.start()
        wait_for(lambda: online_replicas(client) == 1, timeout=30, what="the replica to resync")
        replica.pause()  # it stays online to the primary but takes no more writes
        # a moment just after the last count of the replicas: no recount is due
        now = guard.book.primaries[""].checked_at
        assert not guard.book.needs_look("", now)
        client.set("follow-ups", "1")
        assert guard.checks_writes("", now)
        assert guard.barrier("", "sync", now) is Verdict.HOLD
        assert guard.book.required("") == 1
        replica.resume()
        wait_for(lambda: guard.barrier("", "sync", time.monotonic()) is Verdict.PASS, timeout=30,
                 what="the replica to take the write")
    finally:
        replica.resume()
        replica.stop()
        client.close()
