"""What the reactor thread asks the I/O thread to do, and in which order it is sent.

The scheduler (reactor thread) queues one small operation object per request
event; the I/O thread (io/cycle.py) batches them into pipelines:

- an :class:`~streams_sched.frontier.records.Entry`: a new request for a site's
  frontier (dedupe + XADD), made on the one path of frontier/entries.py;
- :class:`Ack`: the engine is done with a leased request (XACK + XDEL);
- :class:`DeadLetter`: a leased entry that cannot be crawled, with the reason;
- :class:`Release`: a lease handed back unstarted (the worker is closing);
- :class:`Failed`: a delivery that failed (a browser task that did not render);
- :class:`Extend`: a slow request gets a full lease again.

:class:`AckGate` holds the one ordering rule: a request's follow-up requests
reach Redis before its ack. Pure data, no Redis; tested in tests/test_ops.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from streams_sched.frontier.records import Entry, LeasedEntry, payload_digest

__all__ = ["Ack", "AckGate", "DeadLetter", "Entry", "Extend", "Failed", "LeaseOp", "Op", "Release"]


@dataclass(slots=True, frozen=True)
class Ack:
    """The engine is completely done with the request of ``entry``; a tracked page's ack
    carries its next visit: (ms until it, flags, payload, interval ms, previous interval
    ms) as ack.lua takes them (frontier/scripts/ack.py ``Revisit``; ms -1: no longer
    tracked)."""

    entry: LeasedEntry
    revisit: tuple[int, str, bytes, int, int] | None = None


@dataclass(slots=True, frozen=True)
class DeadLetter:
    """Move ``entry`` to its site's dead-letter stream with ``reason``."""

    entry: LeasedEntry
    reason: str


@dataclass(slots=True, frozen=True)
class Release:
    """Hand the lease of ``entry`` back unstarted, for another worker."""

    entry: LeasedEntry


@dataclass(slots=True, frozen=True)
class Failed:
    """The delivery of ``entry`` failed (``reason``): the entry goes back to its stream
    with the delivery counted, or to the dead-letter stream once it has had
    STREAMS_MAX_DELIVERIES (fail.lua decides, from the counts in Redis)."""

    entry: LeasedEntry
    reason: str


@dataclass(slots=True, frozen=True)
class Extend:
    """Give ``entry`` a full lease again (a slow download or callback)."""

    entry: LeasedEntry


#: An operation on a lease this worker holds (sent after the enqueues before it).
LeaseOp: TypeAlias = Ack | DeadLetter | Release | Failed | Extend
#: An entry to enqueue: its ``legacy_fp`` (a migrated scrapy-redis dupefilter) is checked
#: once by the I/O thread (frontier/batches.py), which sends it on without.
Op: TypeAlias = Entry | LeaseOp
#: Lease operations that end a lease (the worker no longer holds the entry).
ENDS_LEASE = (Ack, DeadLetter, Release, Failed)


@dataclass(slots=True)
class AckGate:
    """Orders enqueues and lease operations so follow-ups reach Redis before acks.

    Acks ride one cycle behind the enqueues: a lease operation queued in a
    cycle is sent in a later cycle, and only once every enqueue queued before
    it has been confirmed by Redis. That holds on Redis Cluster too, where one
    pipeline spans several servers and their replies are independent. A
    failed enqueue is sent again and holds back every later lease operation
    until it succeeds. Dead letters this worker found itself (entries it could
    not decode) follow no enqueue and go out at once.

    Where the primary has replicas, "confirmed" means on a replica too
    (replicas.py): enqueues the primary took wait in :attr:`awaiting`, by
    primary, until its barrier passes (:meth:`replicated`) or they must be sent
    again (:meth:`resend`), and hold back every lease op meanwhile. (A site is
    registered by the enqueue that adds to it, so a registration is confirmed and
    replicated with its enqueue.)

    Use per cycle: :meth:`plan` with the new operations, send what it returns,
    then report failures with :meth:`enqueue_failed`, :meth:`after_failed`,
    or :meth:`not_sent` if the whole pipeline failed.
    """

    #: enqueues sent but not confirmed (or failed): they hold back every lease op
    unconfirmed: list[Entry] = field(default_factory=list)
    #: lease ops behind the enqueues queued before them, waiting for their confirmation
    behind: list[LeaseOp] = field(default_factory=list)
    #: dead letters of entries that could not be decoded: no enqueue to wait for
    own_dead: list[DeadLetter] = field(default_factory=list)
    #: primary -> enqueues it confirmed, not yet known to be on its replicas
    awaiting: dict[str, list[Entry]] = field(default_factory=dict)
    #: enqueues a resend left out: this worker had crawled them since (their acks wait in
    #: :attr:`behind`), over the worker's life
    skipped: int = 0

    def plan(self, new: list[Op]) -> tuple[list[Entry], list[LeaseOp]]:
        """The enqueues and lease operations to send in this cycle."""
        after: list[LeaseOp] = []
        if not self.unconfirmed and not self.awaiting:
            after, self.behind = self.behind, []
        after += self.own_dead
        self.own_dead = []
        enqueues = self.unconfirmed
        self.unconfirmed = []
        for op in new:
            if isinstance(op, Entry):
                enqueues.append(op)
            else:
                self.behind.append(op)
        return enqueues, after

    def dead_on_arrival(self, op: DeadLetter) -> None:
        """A leased entry could not be decoded: dead-letter it in the next cycle (it
        follows no enqueue of this worker)."""
        self.own_dead.append(op)

    def enqueue_failed(self, chunk: list[Entry]) -> None:
        """Redis refused or did not answer these enqueues: send them again."""
        self.unconfirmed += chunk

    def await_replicas(self, primary: str, chunk: list[Entry]) -> None:
        """``primary`` confirmed these enqueues; they count once its replicas have them."""
        self.awaiting.setdefault(primary, []).extend(chunk)

    def replicated(self, primary: str) -> None:
        """``primary``'s replicas have everything it confirmed."""
        self.awaiting.pop(primary, None)

    def resend(self, primary: str) -> list[Entry]:
        """What ``primary`` confirmed may be wiped (it is no longer the primary): send it
        again, except the requests this worker has crawled since.

        Every ack since the first of these enqueues waits in :attr:`behind` (acks go only
        once nothing is awaiting), so an :class:`Ack` there whose entry carries the payload
        digest of one of them means this worker leased that request, crawled it and queued its
        follow-ups, which are sent again too or are on a replica already. Sending the
        request again would only crawl it twice; its ack stays queued (a tracked page's
        next visit rides on it). Only requests with a fingerprint: dedupe keeps one of
        each, so the ack is of that request; one without (``dont_filter``) may be a
        second crawl its spider asked for."""
        chunk = self.awaiting.pop(primary, [])
        done = {(op.entry.site, op.entry.digest) for op in self.behind if isinstance(op, Ack) and op.entry.digest}
        keep = [e for e in chunk if not e.fp or (e.site, payload_digest(e.payload)) not in done] if done else chunk
        self.skipped += len(chunk) - len(keep)
        self.unconfirmed += keep
        return keep

    def after_failed(self, group: list[LeaseOp]) -> None:
        """These lease operations were not done: send them again, first."""
        self.behind = group + self.behind

    def not_sent(self, enqueues: list[Entry], after: list[LeaseOp]) -> None:
        """The whole cycle failed before any reply: everything planned goes back."""
        self.unconfirmed = enqueues + self.unconfirmed
        self.behind = after + self.behind

    def __bool__(self) -> bool:
        """True while anything is waiting to be sent or confirmed."""
        return bool(self.unconfirmed or self.behind or self.own_dead or self.awaiting)

    def __len__(self) -> int:
        waiting = sum(len(c) for c in self.awaiting.values())
        return len(self.unconfirmed) + len(self.behind) + len(self.own_dead) + waiting

    def lease_ops(self) -> list[LeaseOp]:
        """Every lease operation not sent yet (to tell known leases from lost ones)."""
        return [*self.behind, *self.own_dead]
