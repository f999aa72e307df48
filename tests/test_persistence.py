"""Which primaries would come back empty after a quick restart, and which just did."""

from __future__ import annotations

from typing import Any

import pytest

from streams_sched.connect.persistence import (
    NodePersistence,
    came_back_empty,
    check_persistence,
    parse_persistence,
    read_persistence,
    start_warning,
    sync_warning,
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


def test_came_back_empty_only_for_a_new_primary_that_keeps_loaded_and_copied_nothing() -> None:
    """A new run id, AOF off, no key loaded, no history copied: empty. Anything else, or the same process: not."""
    fresh = _replace(node(), {"uptime_s": 3, "run_id": "new"})
    assert came_back_empty(fresh, "old", 600.0)
    assert not came_back_empty(fresh, "new", 600.0)  # the process this worker saw: not restarted
    # a cluster created a minute ago: young, but the process this worker saw from its start
    assert not came_back_empty(_replace(fresh, {"uptime_s": 60}), "new", 30.0)
    # an address never seen: restarted only if its process started while the worker watched
    assert came_back_empty(fresh, None, 10.0)
    assert not came_back_empty(_replace(fresh, {"uptime_s": 60}), None, 30.0)
    # a replica that copied its primary's data and was then promoted holds that data
    assert not came_back_empty(_replace(fresh, {"replid2": "a" * 40, "second_offset": 5001}), "old", 600.0)
    assert came_back_empty(_replace(fresh, {"replid2": "0" * 40, "second_offset": -1}), "old", 600.0)
    assert not came_back_empty(_replace(fresh, {"loading": True}), "old", 600.0)
    assert not came_back_empty(_replace(fresh, {"aof": True}), "old", 600.0)
    assert not came_back_empty(_replace(fresh, {"keys_loaded": 120}), "old", 600.0)
    assert not came_back_empty(_replace(fresh, {"keys_loaded": None}), "old", 600.0)
    assert not came_back_empty(_replace(fresh, {"role": "slave"}), "old", 600.0)


def test_parse_reads_info_fields() -> None:
    """INFO server, persistence and replication fields become a NodePersistence."""
    info = {"role": "master", "connected_slaves": 2, "aof_enabled": 0, "uptime_in_seconds": 7,
            "rdb_last_load_keys_loaded": 0, "run_id": "r", "loading": 0, "master_replid2": "b" * 40,
            "second_repl_offset": 91}
    assert parse_persistence("n", info) == NodePersistence("n", "master", 2, False, 7, 0, "r", False, "b" * 40, 91)
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
            # in sync: a replica still in its first sync is warned of too (another test)
            wait_for(lambda c=client: c.info("replication").get("slave0", {}).get("state") == "online", timeout=30,
                     what="the replica in sync")
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
    """A primary seen once, restarted with no AOF and nothing loaded, is a loss once; the process seen first is not."""
    from streams_sched.connect.clients import connect
    from streams_sched.connect.replicas import ReplicaBook, ReplicaGuard

    server = RedisServer().start()
    try:
        guard = ReplicaGuard(connect(server.url), ReplicaBook(), 10, "test")
        guard.note_primaries()
        assert not guard.came_back_empty("")  # young, empty, but the process seen at start
        assert not guard.restarted_empty()
        server.kill()
        server.start()
        assert guard.came_back_empty("")
        assert not guard.came_back_empty("")
        assert not guard.restarted_empty()
    finally:
        server.cleanup()


def test_a_replica_not_in_sync_yet_is_warned_of_naming_it() -> None:
    """A primary whose replica is still in its first full sync: one warning naming the replica and its state."""
    info = {"role": "master", "connected_slaves": 1, "aof_enabled": 1,
            "slave0": {"ip": "10.0.0.2", "port": 7001, "state": "wait_bgsave", "offset": 0, "lag": 0}}
    found = parse_persistence("10.0.0.1:7000", info)
    assert found.unsynced == (("10.0.0.2:7001", "wait_bgsave"),)
    text = sync_warning(found)
    assert text is not None and "replica 10.0.0.2:7001 (state=wait_bgsave) is not in sync yet" in text
    online = {**info, "slave0": {**info["slave0"], "state": "online"}}  # type: ignore[dict-item]
    assert sync_warning(parse_persistence("10.0.0.1:7000", online)) is None


@pytest.mark.e2e
def test_a_real_replica_still_in_its_first_sync_is_warned_of_at_start(caplog: Any) -> None:
    """Against real servers: a replica whose full sync the primary holds back (repl-diskless-sync-delay 60) is named at start."""
    import logging

    from streams_sched.connect.clients import connect

    from helpers import wait_for

    primary = RedisServer(appendonly=True, extra_args=["--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "60"]).start()
    replica = RedisServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]).start()
    try:
        client = connect(primary.url, decode_responses=True)
        wait_for(lambda: client.info("replication").get("connected_slaves", 0) >= 1, timeout=30, what="the replica")
        with caplog.at_level(logging.WARNING, logger="streams_sched.connect.persistence"):
            warnings = check_persistence(client)
        assert any(f"replica 127.0.0.1:{replica.port} (state=wait_bgsave) is not in sync yet" in w for w in warnings), warnings
    finally:
        replica.cleanup()
        primary.cleanup()
