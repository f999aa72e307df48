"""The I/O thread's pure bookkeeping: the ack-ordering gate and the lease book (no Redis)."""

from __future__ import annotations

import pytest

from streams_sched.frontier.keys import BROWSER_FIRST_STREAM
from streams_sched.frontier.records import Entry, LeasedEntry
from streams_sched.worker.io.refusals import Refusals
from streams_sched.worker.leasebook import LeaseBook
from streams_sched.worker.ops import ENDS_LEASE, Ack, AckGate, DeadLetter, Extend, Release


def _entry(n: int, site: str = "a.test", stream: int = 1, suspect: bool = False) -> LeasedEntry:
    return LeasedEntry(site, stream, f"{n}-0".encode(), None, 1 if suspect else 0, suspect)


def _enq(n: int) -> Entry:
    return Entry(bytes([n]) * 20, 1, 0, b"p", site="a.test")


def test_an_ack_waits_one_cycle_behind_the_enqueues_queued_before_it() -> None:
    """A follow-up and its parent's ack queued together: the follow-up goes now, the ack next cycle."""
    gate = AckGate()
    child, ack = _enq(1), Ack(_entry(1))
    enqueues, after = gate.plan([child, ack])
    assert enqueues == [child] and after == []
    enqueues, after = gate.plan([])
    assert enqueues == [] and after == [ack]
    assert not gate


def test_a_failed_enqueue_holds_back_every_later_ack_until_it_succeeds() -> None:
    """An enqueue Redis refused is sent again, and no lease op goes out until it is confirmed."""
    gate = AckGate()
    child, ack1 = _enq(1), Ack(_entry(1))
    enqueues, _ = gate.plan([child, ack1])
    gate.enqueue_failed(enqueues)
    ack2 = Ack(_entry(2))
    enqueues, after = gate.plan([ack2])
    assert enqueues == [child] and after == []  # resent; acks still held
    enqueues, after = gate.plan([])
    assert enqueues == [] and after == [ack1, ack2]


def test_a_failed_cycle_puts_everything_back_in_order() -> None:
    """When the whole pipeline fails, its enqueues and lease ops come back first, in order."""
    gate = AckGate()
    gate.plan([_enq(1), Ack(_entry(1))])
    enqueues, after = gate.plan([_enq(2), Release(_entry(2))])
    assert [op.entry for op in after] == [_entry(1)]
    gate.not_sent(enqueues, after)
    assert gate.unconfirmed == enqueues
    assert gate.behind == [after[0], Release(_entry(2))]
    assert len(gate) == 3


def test_own_dead_letters_go_out_at_once_even_behind_unconfirmed_enqueues() -> None:
    """Entries this worker could not decode follow no enqueue: their dead letters are not held."""
    gate = AckGate()
    gate.unconfirmed = [_enq(1)]
    dead = DeadLetter(_entry(3), "payload is not msgpack")
    gate.own_dead.append(dead)
    _, after = gate.plan([])
    assert after == [dead]


def test_failed_lease_ops_are_retried_before_newer_ones() -> None:
    """A lease op Redis refused goes back to the front of the queue."""
    gate = AckGate()
    gate.plan([Extend(_entry(1))])
    _, after = gate.plan([Ack(_entry(2))])
    gate.after_failed(after)
    _, again = gate.plan([])
    assert again == after + [Ack(_entry(2))]


def test_lease_book_counts_sites_browser_leases_and_suspects() -> None:
    """Taking and ending leases keeps per-site, browser and suspect counts exact, with no empty keys."""
    book = LeaseBook()
    http, browser, suspect = _entry(1), _entry(2, stream=BROWSER_FIRST_STREAM), _entry(3, "b.test", suspect=True)
    for e in (http, browser, suspect):
        book.take(e)
    assert book.total == 3 and dict(book.by_site) == {"a.test": 2, "b.test": 1}
    assert book.browser == 1 and dict(book.browser_by_site) == {"a.test": 1}
    assert book.suspects == 1 and len(book.ids) == 3
    assert book.end(suspect) is True
    assert book.end(browser) is False
    assert book.browser == 0 and dict(book.browser_by_site) == {}
    book.end(http)
    assert book.total == 0 and dict(book.by_site) == {} and not book.ids and book.suspects == 0


def test_only_acks_dead_letters_and_releases_end_a_lease() -> None:
    """An extend keeps the lease; the three others end it (the lease book forgets the entry)."""
    e = _entry(1)
    assert [isinstance(op, ENDS_LEASE) for op in (Ack(e), DeadLetter(e, "x"), Release(e), Extend(e))] == [
        True, True, True, False,
    ]


def test_refusals_say_log_once_per_distinct_error_and_count_until_accepted() -> None:
    """Each distinct refusal is new once; repeats are counted, and the count is handed back when the command goes through."""
    refusals = Refusals()
    assert refusals.note("enqueue to site a", "WRONGTYPE x") is True
    assert [refusals.note("enqueue to site a", "WRONGTYPE x") for _ in range(5)] == [False] * 5
    assert refusals.note("enqueue to site a", "NOPERM y") is True  # another error: logged too
    assert refusals.note("ack of site b", "NOPERM z") is True
    assert sorted(refusals.accepted("enqueue to site a")) == [("NOPERM y", 1), ("WRONGTYPE x", 6)]
    assert refusals.accepted("enqueue to site a") == []
    assert refusals  # the ack is still refused
    assert refusals.accepted("ack of site b") == [("NOPERM z", 1)] and not refusals
    assert refusals.note("enqueue to site a", "WRONGTYPE x") is True  # back again: logged again


def test_oom_is_one_refusal_for_every_command_until_quiet() -> None:
    """OOM refusals of any command are logged once; the episode ends only when a refused command
    goes through quiet_s after the last OOM, not when memory dips below the limit for a moment."""
    oom = "command not allowed when used memory > 'maxmemory'."
    refusals = Refusals(quiet_s=30.0)
    assert refusals.note("enqueue to site a", oom + " script: 1", now=0.0) is True
    assert refusals.note("enqueue to site b", oom + " script: 1", now=1.0) is False
    assert refusals.note("heartbeat", oom, now=2.0) is False
    assert refusals.note("ack of site a", "NOPERM no right", now=2.0) is True  # another error: its own line
    assert refusals.accepted("heartbeat", now=3.0) == []  # a dip below the limit: still the same episode
    assert refusals.note("heartbeat", oom, now=8.0) is False
    assert refusals.accepted("lease of site a", now=60.0) == []  # never refused: ends nothing
    assert refusals.accepted("enqueue to site a", now=60.0) == [(oom + " script: 1", 4)]
    assert refusals.accepted("ack of site a", now=61.0) == [("NOPERM no right", 1)] and not refusals
    assert refusals.note("heartbeat", oom, now=100.0) is True  # a new episode: logged again


@pytest.mark.parametrize(
    ("code", "message"),
    [
        ("MISCONF", "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist to disk."),
        ("READONLY", "You can't write against a read only replica."),
    ],
)
def test_every_refusal_of_all_writes_is_one_refusal_until_quiet(code: str, message: str) -> None:
    """A failed snapshot's MISCONF and a replica's READONLY are, like OOM, one refusal for every command, ended only when quiet."""
    refusals = Refusals(quiet_s=30.0)
    assert refusals.note("enqueue to site a", message, now=0.0) is True
    assert refusals.note("ack of site b", message, now=1.0) is False
    assert refusals.note("heartbeat", message + " script: 2, on @user_script:1.", now=2.0) is False
    assert refusals.counts == {("Redis", code): 3}
    assert refusals.accepted("heartbeat", now=10.0) == []
    assert refusals.accepted("heartbeat", now=40.0) == [(message, 3)] and not refusals
