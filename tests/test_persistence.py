"""Which primaries would come back empty after a quick restart, and which just did."""

from __future__ import annotations

from typing import Any

import pytest

from streams_sched.connect.persistence import (
    RECENT_RESTART_S,
    NodePersistence,
    came_back_empty,
    check_persistence,
    parse_persistence,
    read_persistence,
    start_warning,
)
from streams_sched.testing import RedisServer


def node() -> NodePersistence:
    """A primary with one replica, no persistence, up for a while."""
    return NodePersistence("10.0.0.1:7000", "master", 1, False, 5000, 0)


def _replace(base: NodePersistence, changes: dict[str, Any]) -> NodePersistence:
    from dataclasses import replace

    return replace(base, **changes)


def test_a_primary_with_replicas_and_no_aof_is_warned_of_naming_the_option() -> None:
    """Replicas and appendonly no: one warning naming the option and the fix."""
    text = start_warning(_replace(node(), {}))
    assert text is not None
    assert "10.0.0.1:7000 has 1 replica(s) but appendonly is no" in text
    assert "Set appendonly yes" in text


def test_aof_or_no_replica_or_a_replica_needs_no_warning() -> None:
    """AOF, no replica (a restart loses everything anyway, visibly) or a replica: no warning."""
    assert start_warning(_replace(node(), {"aof": True})) is None
    assert start_warning(_replace(node(), {"aof": None})) is None  # INFO did not say
    assert start_warning(_replace(node(), {"replicas": 0})) is None
    assert start_warning(_replace(node(), {"role": "slave"})) is None


def test_came_back_empty_only_for_a_fresh_primary_that_keeps_and_loaded_nothing() -> None:
    """Just started, AOF off, no key loaded: empty. Long up, AOF on, keys loaded or unknown: not."""
    fresh = _replace(node(), {"uptime_s": 3})
    assert came_back_empty(fresh)
    assert not came_back_empty(_replace(fresh, {"uptime_s": RECENT_RESTART_S}))  # a promoted replica
    assert not came_back_empty(_replace(fresh, {"aof": True}))
    assert not came_back_empty(_replace(fresh, {"keys_loaded": 120}))
    assert not came_back_empty(_replace(fresh, {"keys_loaded": None}))
    assert not came_back_empty(_replace(fresh, {"role": "slave"}))


def test_parse_reads_info_fields() -> None:
    """INFO server, persistence and replication fields become a NodePersistence."""
    info = {"role": "master", "connected_slaves": 2, "aof_enabled": 0, "uptime_in_seconds": 7,
            "rdb_last_load_keys_loaded": 0}
    assert parse_persistence("n", info) == NodePersistence("n", "master", 2, False, 7, 0)
    assert parse_persistence("n", {}) == NodePersistence("n", "", 0, None, None, None)


@pytest.mark.e2e
def test_a_real_primary_with_a_replica_and_no_persistence_is_warned_of(caplog: Any) -> None:
    """Against real servers: a primary with an attached replica and no persistence warns; with AOF it does not."""
    import logging

    from streams_sched.connect.clients import connect

    from helpers import wait_for

    for aof, warned in ((False, True), (True, False)):
        primary = RedisServer(appendonly=aof).start()
        replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
        try:
            client = connect(primary.url, decode_responses=True)
            wait_for(lambda c=client: c.info("replication").get("connected_slaves", 0) >= 1, timeout=30,
                     what="the replica")
            (found,) = read_persistence(client)
            assert found.name == f"127.0.0.1:{primary.port}" and found.replicas == 1 and found.aof is aof
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="streams_sched.connect.persistence"):
                assert bool(check_persistence(client)) is warned
            assert ("appendonly is no" in caplog.text) is warned
        finally:
            replica.cleanup()
            primary.cleanup()


@pytest.mark.e2e
def test_a_primary_that_restarted_empty_is_reported_once_per_restart() -> None:
    """A fresh primary with no AOF that loaded nothing is a loss once; asking again about the same process is not."""
    from streams_sched.connect.clients import connect
    from streams_sched.connect.replicas import ReplicaBook, ReplicaGuard

    server = RedisServer().start()
    try:
        guard = ReplicaGuard(connect(server.url), ReplicaBook(), 10, "test")
        assert guard.came_back_empty("")
        assert not guard.came_back_empty("")
    finally:
        server.cleanup()
