"""The replica wait without Redis: what a barrier's result means (replicas.ReplicaBook), and
how the AckGate holds acks while enqueues are confirmed by a primary but not yet by a replica."""

from __future__ import annotations

from typing import Any

from streams_sched.connect.replicas import NodeView, ReplicaBook, Verdict, parse_replication, rolled_back
from streams_sched.frontier.records import Entry, LeasedEntry, payload_digest
from streams_sched.worker.ops import Ack, AckGate

PRIMARY = "10.0.0.1:7000"


def view(connected: int = 1, replid: str = "a" * 40, offset: int = 100, role: str = "master") -> NodeView:
    return NodeView(role, connected, replid, offset)


def enqueue(n: int) -> Entry:
    return Entry(bytes([n]) * 20, 0, 0, b"p", site="s")


def ack(n: int) -> Ack:
    return Ack(LeasedEntry("s", 0, f"{n}-0".encode(), None, 0))


def test_parse_replication_counts_only_replicas_in_sync() -> None:
    """A replica still loading its first sync does not count as one the acks may wait for."""
    info = {
        "role": "master", "master_replid": "r" * 40, "master_repl_offset": 42,
        "slave0": {"ip": "127.0.0.1", "port": 1, "state": "online", "offset": 42, "lag": 0},
        "slave1": {"ip": "127.0.0.1", "port": 2, "state": "wait_bgsave", "offset": 0, "lag": 0},
    }
    assert parse_replication(info) == NodeView("master", 1, "r" * 40, 42, replica_offset=42)


def test_auto_waits_for_one_replica_where_there_is_one_and_none_elsewhere() -> None:
    """auto: a primary with a replica needs 1, one without needs 0; never-seen primaries are unknown."""
    book = ReplicaBook()
    assert book.required(PRIMARY) is None
    book.look(PRIMARY, view(connected=2), 0.0)
    book.look("other", view(connected=0), 0.0)
    assert book.required(PRIMARY) == 1
    assert book.required("other") == 0


def test_a_barrier_that_reached_enough_replicas_passes() -> None:
    """WAIT reached the required replicas on the same primary: the acks may go."""
    book = ReplicaBook()
    book.look(PRIMARY, view(), 0.0)
    assert book.judge(PRIMARY, 1, view(), 1.0) is Verdict.PASS


def test_a_lagging_replica_holds_the_acks() -> None:
    """WAIT timed out but the replica is connected: hold and try again, never drop."""
    book = ReplicaBook()
    book.look(PRIMARY, view(), 0.0)
    assert book.judge(PRIMARY, 0, view(), 1.0) is Verdict.HOLD


def test_a_node_that_is_no_longer_primary_or_cannot_answer_means_resend() -> None:
    """A replica now (demoted) or no answer at all: what it confirmed may be wiped, so send it again."""
    book = ReplicaBook()
    book.look(PRIMARY, view(), 0.0)
    assert book.judge(PRIMARY, None, None, 1.0) is Verdict.RESEND
    assert book.judge(PRIMARY, 1, view(role="slave"), 1.0) is Verdict.RESEND


def test_a_restarted_or_replaced_primary_means_resend_even_if_wait_passed() -> None:
    """Another replication id at the same address: its earlier writes may be gone, so they are sent again."""
    book = ReplicaBook()
    book.look(PRIMARY, view(replid="a" * 40), 0.0)
    assert book.judge(PRIMARY, 1, view(replid="b" * 40), 1.0) is Verdict.RESEND
    assert book.take_changed() == {PRIMARY}
    assert book.judge(PRIMARY, 1, view(replid="b" * 40), 2.0) is Verdict.PASS


def test_an_offset_that_went_back_counts_as_another_primary() -> None:
    """Same replication id but less data than before: it lost writes, so they are sent again."""
    book = ReplicaBook()
    book.look(PRIMARY, view(offset=500), 0.0)
    assert book.judge(PRIMARY, 1, view(offset=10), 1.0) is Verdict.RESEND


def test_auto_stops_waiting_only_after_the_grace_without_any_replica() -> None:
    """A primary that lost its replica (or a stale one that came back at its old address)
    holds the acks for the grace period, then auto lets them through."""
    book = ReplicaBook(grace_s=10.0)
    book.look(PRIMARY, view(connected=1), 0.0)
    assert book.judge(PRIMARY, 0, view(connected=0), 1.0) is Verdict.HOLD
    assert book.judge(PRIMARY, 0, view(connected=0), 10.5) is Verdict.HOLD
    assert book.judge(PRIMARY, 0, view(connected=0), 11.5) is Verdict.PASS
    assert book.required(PRIMARY) == 0
    book.look(PRIMARY, view(connected=1), 12.0)  # a replica is back: wait for it again
    assert book.required(PRIMARY) == 1


def test_an_explicit_number_of_replicas_holds_acks_for_as_long_as_they_are_missing() -> None:
    """STREAMS_MIN_REPLICAS=1 never gives up waiting, however long the replica is away."""
    book = ReplicaBook(min_replicas=1)
    book.look(PRIMARY, view(connected=0), 0.0)
    assert book.required(PRIMARY) == 1
    assert book.judge(PRIMARY, 0, view(connected=0), 3600.0) is Verdict.HOLD


def test_zero_replicas_never_waits() -> None:
    """STREAMS_MIN_REPLICAS=0: a primary with replicas still needs none."""
    book = ReplicaBook(min_replicas=0)
    book.look(PRIMARY, view(connected=2), 0.0)
    assert book.required(PRIMARY) == 0


def test_gate_holds_acks_while_enqueues_await_replicas() -> None:
    """An ack queued after enqueues that a primary confirmed goes out only once its replicas have them."""
    gate = AckGate()
    enq, after = gate.plan([enqueue(1), ack(1)])
    assert enq and not after
    gate.await_replicas(PRIMARY, enq)
    enq, after = gate.plan([])
    assert not enq and not after and gate
    gate.replicated(PRIMARY)
    enq, after = gate.plan([])
    assert after == [ack(1)]


def test_gate_sends_the_enqueues_of_a_lost_primary_again_before_any_ack() -> None:
    """RESEND: the enqueues a gone primary confirmed go out again, and the acks wait for them."""
    gate = AckGate()
    enq, _ = gate.plan([enqueue(1), ack(1)])
    gate.await_replicas(PRIMARY, enq)
    assert gate.resend(PRIMARY) == enq
    enq, after = gate.plan([])
    assert enq == [enqueue(1)] and not after
    enq, after = gate.plan([])
    assert after == [ack(1)]


def test_a_resend_leaves_out_the_requests_this_worker_has_crawled_since() -> None:
    """RESEND after a primary was replaced: an enqueue whose request this worker leased, crawled and
    acked since (the ack waits behind it) is not sent again; the others and every ack are."""
    gate = AckGate()
    first, second = Entry(b"1" * 20, 0, 0, b"page-1", site="s"), Entry(b"2" * 20, 0, 0, b"page-2", site="s")
    enq, _ = gate.plan([first, second])
    gate.await_replicas(PRIMARY, enq)
    crawled = Ack(LeasedEntry("s", 0, b"7-0", None, 0, digest=payload_digest(b"page-1")))
    follow_up = Entry(b"3" * 20, 0, 0, b"page-3", site="s")
    enq, after = gate.plan([follow_up, crawled])
    assert enq == [follow_up] and not after
    gate.await_replicas(PRIMARY, enq)
    assert gate.resend(PRIMARY) == [second, follow_up]
    assert gate.skipped == 1
    enq, after = gate.plan([])
    assert enq == [second, follow_up] and not after
    enq, after = gate.plan([])
    assert after == [crawled]


def test_after_auto_gave_up_each_write_still_gets_a_barrier_that_sees_a_returning_replica() -> None:
    """After auto gave up on a primary its writes still pass a barrier, which holds if a replica is back."""
    book = ReplicaBook(grace_s=10.0)
    book.look(PRIMARY, view(connected=1), 0.0)
    assert book.judge(PRIMARY, 0, view(connected=0), 1.0) is Verdict.HOLD
    assert book.judge(PRIMARY, 0, view(connected=0), 11.5) is Verdict.PASS
    assert book.required(PRIMARY) == 0 and book.checks_writes(PRIMARY)
    assert book.judge(PRIMARY, 0, view(connected=0), 12.0) is Verdict.PASS
    # the replica resynced: WAIT 0 saw no replica ack these writes yet, INFO shows it online
    assert book.judge(PRIMARY, 0, view(connected=1), 12.5) is Verdict.HOLD
    assert book.required(PRIMARY) == 1
    assert book.judge(PRIMARY, 1, view(connected=1), 13.0) is Verdict.PASS


def test_a_primary_that_never_had_a_replica_sends_its_acks_without_a_barrier() -> None:
    """auto on a server without replicas: no barrier per write (a failover needs a replica to promote)."""
    book = ReplicaBook()
    assert book.checks_writes(PRIMARY)  # not seen yet: the first barrier counts its replicas
    book.look(PRIMARY, view(connected=0), 0.0)
    assert not book.checks_writes(PRIMARY)


def test_a_standalone_or_sentinel_primary_is_named_by_its_address_in_warnings(caplog: Any) -> None:
    """The replica warnings name a standalone or Sentinel primary by host:port, never by an empty name."""
    import logging

    from streams_sched.connect.clients import connect
    from streams_sched.connect.replicas import ReplicaGuard

    guard = ReplicaGuard(connect("redis://10.9.8.7:6390/0"), ReplicaBook(min_replicas=1), 10, "test")
    with caplog.at_level(logging.WARNING, logger="streams_sched.connect.replicas"):
        guard.book.look("", view(connected=1), 0.0)
        assert guard.book.judge("", 0, view(connected=0), 1.0) is Verdict.HOLD
    assert "Redis primary 10.9.8.7:6390 has 0 of the 1 replica(s)" in caplog.text
    sentinel = ReplicaGuard(connect("redis+sentinel://127.0.0.1:1/mymaster/0"), ReplicaBook(), 10, "test")
    assert sentinel.shown("") == "(primary of 'mymaster')"  # no sentinel answers: the service is named
    assert sentinel.shown("10.0.0.1:7000") == "10.0.0.1:7000"


def test_a_promotion_that_drops_acknowledged_writes_is_an_error_with_the_bytes(caplog: Any) -> None:
    """A replica promoted behind what another replica had acknowledged: the bytes lost are counted
    and logged at ERROR; a promotion of the freshest replica is the usual warning."""
    import logging

    old = "a" * 40
    book = ReplicaBook()
    book.look(PRIMARY, NodeView("master", 2, old, 5000, replica_offset=4800), 0.0)
    fresh = NodeView("master", 1, "b" * 40, 4900, replid2=old, second_offset=4801)
    with caplog.at_level(logging.WARNING, logger="streams_sched.connect.replicas"):
        assert book.look(PRIMARY, fresh, 1.0)
    assert book.lost_bytes == 0 and caplog.records[-1].levelname == "WARNING"
    book.look(PRIMARY, NodeView("master", 1, "b" * 40, 6000, replica_offset=5900), 2.0)
    lagging = NodeView("master", 0, "c" * 40, 5500, replid2="b" * 40, second_offset=5501)
    with caplog.at_level(logging.WARNING, logger="streams_sched.connect.replicas"):
        assert book.look(PRIMARY, lagging, 3.0)
    assert book.lost_bytes == 400
    assert caplog.records[-1].levelname == "ERROR" and "without the last 400 bytes" in caplog.text
    restarted = NodeView("master", 0, "d" * 40, 10)  # continues no history: cannot say
    assert rolled_back("c" * 40, 5500, restarted) is None


def test_on_a_cluster_a_promoted_replica_is_compared_with_the_primary_it_took_over_from() -> None:
    """A cluster replica promoted under its own name still shows writes its old primary's replicas had acknowledged."""
    book = ReplicaBook()
    book.look("10.0.0.1:7000", NodeView("master", 1, "a" * 40, 9000, replica_offset=8000), 0.0)
    book.look("10.0.0.2:7001", NodeView("master", 0, "b" * 40, 7600, replid2="a" * 40, second_offset=7501), 1.0)
    assert book.lost_bytes == 500


def test_a_promotion_that_never_descended_from_the_primary_written_to_is_an_error_with_the_bytes(caplog: Any) -> None:
    """A replica promoted at offset 0, or from a history the worker never wrote to, lacks every
    write the known primary took in its own history: ERROR with those bytes, even when no
    replica had acknowledged any; a primary restarted with its AOF (no history copied) stays a warning."""
    import logging

    book = ReplicaBook()
    # the primary this worker writes to was itself promoted at offset 12,000 of history a; no
    # replica of it in sync (the old primary is still in its full sync)
    book.look(PRIMARY, NodeView("master", 0, "b" * 40, 20_000, replid2="a" * 40, second_offset=12_001), 0.0)
    # the old primary, restarted from its AOF, took id b in its full-sync handshake and was
    # promoted before the transfer ended: history d, second_repl_offset 1
    unsynced = NodeView("master", 0, "d" * 40, 0, replid2="b" * 40, second_offset=1)
    with caplog.at_level(logging.WARNING, logger="streams_sched.connect.replicas"):
        assert book.look(PRIMARY, unsynced, 1.0)
    assert book.lost_bytes == 8_000
    assert caplog.records[-1].levelname == "ERROR"
    assert "without the last 8000 bytes" in caplog.text and "never descended" in caplog.text
    # the same from a history of its own (a replica of another primary)
    other = ReplicaBook()
    other.look(PRIMARY, NodeView("master", 1, "b" * 40, 20_000, replica_offset=19_500, replid2="a" * 40,
                                 second_offset=12_001), 0.0)
    other.look(PRIMARY, NodeView("master", 0, "e" * 40, 0, replid2="c" * 40, second_offset=1), 1.0)
    assert other.lost_bytes == 8_000
    # a primary restarted with its AOF: never promoted, nothing to compare it with
    fresh = ReplicaBook()
    fresh.look(PRIMARY, NodeView("master", 1, "a" * 40, 9_000, replica_offset=9_000), 0.0)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streams_sched.connect.replicas"):
        assert fresh.look(PRIMARY, NodeView("master", 0, "f" * 40, 0, replid2="0" * 40, second_offset=-1), 1.0)
    assert fresh.lost_bytes == 0 and caplog.records[-1].levelname == "WARNING"
    # a replica in sync promoted where its history began: what a replica acknowledged past it
    synced = ReplicaBook()
    synced.look(PRIMARY, NodeView("master", 1, "a" * 40, 9_200, replica_offset=9_200), 0.0)
    synced.look(PRIMARY, NodeView("master", 0, "g" * 40, 9_200, replid2="a" * 40, second_offset=9_201), 1.0)
    assert synced.lost_bytes == 0
