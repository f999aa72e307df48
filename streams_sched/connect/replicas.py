"""Acks wait until a request's follow-ups are on a replica.

Replication is asynchronous: a primary confirms a write before any replica has
it, and a failover promotes a replica that may lack the last writes. If a
parent's ack survives (on this primary or on another shard) while its child
enqueue does not, the child and everything under it is never crawled. So the
worker sends the acks of a cycle only after each primary that took the
enqueues before them has passed a *barrier*: on one connection,
``SET <sync key> <node> PX`` and then ``WAIT <n> <timeout>``. WAIT counts the
replicas that acknowledged that connection's last write; a primary streams
its writes to its replicas in the order it ran them, so a replica that has
the SET has every enqueue that primary ran before it, whichever connection
sent them. (A WAIT on a connection that wrote nothing returns at once and
proves nothing, hence the SET.)

A barrier ends one of three ways, decided by :meth:`ReplicaBook.judge` (pure,
tested without Redis):

- ``PASS``: enough replicas have the writes; the acks may go.
- ``HOLD``: the primary is lagging, or has fewer replicas than required; the
  acks wait and the barrier is tried again. An ack is never dropped.
- ``RESEND``: the node no longer is the primary of those keys (a ``MOVED``
  reply, it answers as a replica, it is unreachable): its writes may be wiped
  by the resync that follows, so the enqueues are sent again, to whichever
  node owns them now. Dedupe makes that safe.

How many replicas (``STREAMS_MIN_REPLICAS``): a number, or ``auto``: 1 where
the primary reports a connected replica, else 0. In auto, a primary that has
had a replica keeps needing one until it has had none for
:data:`LOSS_GRACE_S`; only then are its acks let through without one, logged
once. The grace matters: a master killed and restarted at its old address
answers as a primary with no replica (its replica was promoted) until the
cluster demotes it, within about a second. Writes it takes in that time are
wiped by its resync, so they must not count. The node's identity is its
replication id, which changes when it restarts or is promoted; a changed
identity is reported, so the worker forgets the fingerprints it remembers
sending (they may not have arrived).

What this cannot save: a primary and all of its replicas lost together, and
the writes of a primary whose requirement is 0 (no replica, or
``STREAMS_MIN_REPLICAS = 0``).

A primary that auto stopped waiting for still gets a barrier after each write, with
``WAIT 0`` (it returns at once) and INFO replication on the same connection. A replica
that comes back resyncs and then takes the writes that follow over a link a failover
can cut, so the acks behind them must wait from its first moment, not from the next
count of the replicas.
"""

from __future__ import annotations

import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "LOSS_GRACE_S", "NodeView", "ReplicaBook", "ReplicaGuard", "Verdict", "not_descended", "parse_replication",
    "promoted", "rolled_back",
]

logger = logging.getLogger(__name__)

#: how long a primary that had a replica may go without one before auto stops waiting
LOSS_GRACE_S = 10.0
#: how often the replicas of a primary are counted again: often while auto finds none
#: (a replica attached later must be waited for within a second), seldom once it has one
RECHECK_S, RECHECK_NONE_S = 10.0, 1.0
#: how long the sync key lives; it only has to outlive one barrier
SYNC_TTL_MS = 60_000


class Verdict(enum.Enum):
    PASS = "pass"
    HOLD = "hold"
    RESEND = "resend"


@dataclass(frozen=True, slots=True)
class NodeView:
    """What a node says of its replication (INFO replication)."""

    role: str
    #: replicas in sync (state=online)
    connected: int
    replid: str
    offset: int
    #: the furthest offset a replica in sync has acknowledged (0: none)
    replica_offset: int = 0
    #: the history this node continues since its promotion (master_replid2), and the
    #: offset up to which it shares it (second_repl_offset; -1: none)
    replid2: str = ""
    second_offset: int = -1


def parse_replication(info: dict[str, Any]) -> NodeView:
    """INFO replication, as redis-py parses it, to a :class:`NodeView`."""
    connected = replica_offset = 0
    for key, value in info.items():
        if key.startswith("slave") and isinstance(value, dict) and str(value.get("state", "")) == "online":
            connected += 1
            replica_offset = max(replica_offset, int(value.get("offset", 0) or 0))
    return NodeView(
        role=str(info.get("role", "")),
        connected=connected,
        replid=str(info.get("master_replid", "")),
        offset=int(info.get("master_repl_offset", 0) or 0),
        replica_offset=replica_offset,
        replid2=str(info.get("master_replid2", "")),
        second_offset=int(info.get("second_repl_offset", -1) or -1),
    )


def promoted(view: NodeView) -> bool:
    """True if the node was promoted from a replica: it carries the history it copied
    (master_replid2, second_repl_offset); a primary that started afresh carries none."""
    return bool(view.replid2.strip("0")) and view.second_offset > 0


def rolled_back(known_replid: str, replicated: int, view: NodeView) -> int | None:
    """Bytes of writes a replica had acknowledged that the node now primary lacks, if it
    continues the history of ``known_replid`` (it was that primary's replica); None if it
    does not say (a restarted node, a replica of another history)."""
    if view.replid2 != known_replid or view.second_offset <= 0:
        return None
    return max(0, replicated - (view.second_offset - 1))


def not_descended(known_replid: str, known_base: int, known_offset: int, view: NodeView) -> int | None:
    """Bytes of writes the known primary took in a history of its own that the node now
    primary cannot hold, because it never was that primary's replica in sync: it was
    promoted from another history (a replica of another primary), or from that history's
    id at an offset before it began (a replica that got the id in its full-sync handshake
    and was promoted before the transfer ended, at offset 0). What it serves came from
    its own disk, not from those writes. Replication offsets run on across promotions,
    so the writes it lacks are those past both the offset it was promoted at and
    ``known_base``, where the known primary's own history began (0 if it started
    afresh), up to ``known_offset``. None if it was not promoted or continues that history."""
    if not promoted(view):
        return None
    at = view.second_offset - 1
    if view.replid2 == known_replid and at >= known_base:
        return None  # it did copy that history, up to ``at``: rolled_back() says what it lacks
    return max(0, known_offset - max(at, known_base))


@dataclass(slots=True)
class _Primary:
    required: int
    replid: str
    offset: int
    checked_at: float
    #: since when it has had no replica while still required to have one (auto)
    zero_since: float | None = None
    short_logged: bool = False
    #: auto stopped waiting after it lost its replicas (logged once): its writes still get a barrier
    gave_up: bool = False
    #: the furthest offset of this identity a replica acknowledged
    replicated: int = 0
    #: where this identity's own history begins: the offset it was promoted at, or 0
    base: int = 0


@dataclass(slots=True)
class ReplicaBook:
    """Per primary: how many replicas an ack waits for, and what a barrier's result means.

    ``min_replicas`` is STREAMS_MIN_REPLICAS, -1 for auto. Pure: time comes in
    as ``now``; :class:`ReplicaGuard` does the Redis I/O.
    """

    min_replicas: int = -1
    grace_s: float = LOSS_GRACE_S
    primaries: dict[str, _Primary] = field(default_factory=dict)
    #: primaries that changed identity (restarted, promoted, replaced) since the caller
    #: last asked (:meth:`take_changed`): what they confirmed before may be gone
    changed: set[str] = field(default_factory=set)
    #: bytes of replica-acknowledged writes that a promotion threw away, over all primaries
    lost_bytes: int = 0
    #: a primary's name as log lines show it (a standalone or Sentinel primary is named
    #: "", so :class:`ReplicaGuard` puts its address there)
    shown: Callable[[str], str] = field(default=lambda name: name or "(this server)")

    def take_changed(self) -> set[str]:
        changed, self.changed = self.changed, set()
        return changed

    def needs_look(self, name: str, now: float) -> bool:
        known = self.primaries.get(name)
        if known is None:
            return True
        every = RECHECK_NONE_S if known.required == 0 and self.min_replicas < 0 else RECHECK_S
        return now - known.checked_at >= every

    def required(self, name: str) -> int | None:
        """Replicas an ack waits for on ``name``; None while it was never seen."""
        known = self.primaries.get(name)
        return known.required if known is not None else None

    def checks_writes(self, name: str) -> bool:
        """True if writes on ``name`` go behind a barrier before the acks that follow them:
        it needs replicas, is not known yet, or auto stopped waiting after it lost them
        (whether one is back is read right after the writes)."""
        known = self.primaries.get(name)
        return known is None or known.required != 0 or known.gave_up

    def look(self, name: str, view: NodeView, now: float) -> bool:
        """Take in what node ``name`` said of its replication; True if it is not the
        node it was when last seen (its earlier writes may be gone)."""
        known = self.primaries.get(name)
        changed = known is not None and (view.replid != known.replid or view.offset < known.offset)
        lost = None
        foreign = False
        if changed:
            foreign_lost = not_descended(known.replid, known.base, known.offset, view)  # type: ignore[union-attr]
            if foreign_lost is not None:
                lost, foreign = foreign_lost, True
            else:
                lost = rolled_back(known.replid, known.replicated, view)  # type: ignore[union-attr]
        elif known is None and view.replid2:
            # on a cluster the promoted replica has a name of its own: the primary it took over from
            before = next((p for p in self.primaries.values() if p.replid == view.replid2), None)
            if before is not None:
                lost = rolled_back(before.replid, before.replicated, view)
        if lost:
            self._report_rollback(name, lost, view, foreign)
        elif changed:
            logger.warning(
                "Redis primary %s is not the one this worker wrote to before (replication id %s,"
                " offset %d; was %s, %d): it restarted or was replaced, so this worker forgets"
                " which requests it remembers sending",
                self.shown(name), view.replid, view.offset, known.replid, known.offset,  # type: ignore[union-attr]
            )
        if changed:
            self.changed.add(name)
        if self.min_replicas >= 0:
            required = self.min_replicas
        elif view.connected > 0:
            required = 1
        elif known is not None and known.required > 0:
            required = known.required  # lost its replicas, or a stale primary: see judge()
        else:
            required = 0
        base = view.second_offset - 1 if promoted(view) else 0
        if known is None:
            self.primaries[name] = _Primary(
                required, view.replid, view.offset, now, replicated=view.replica_offset, base=base
            )
            return False
        if changed:
            known.base = base
        known.replicated = view.replica_offset if changed else max(known.replicated, view.replica_offset)
        known.required, known.replid, known.offset, known.checked_at = required, view.replid, view.offset, now
        if view.connected > 0:
            known.zero_since = None
            if known.gave_up or known.short_logged:
                logger.warning("Redis primary %s has %d replica(s) again; acks wait for them", self.shown(name), view.connected)
            known.gave_up = known.short_logged = False
        return changed

    def _report_rollback(self, name: str, lost: int, view: NodeView, foreign: bool = False) -> None:
        self.lost_bytes += lost
        if foreign:
            logger.error(
                "Redis primary %s was promoted without the last %d bytes of writes that the primary"
                " before it took (it was promoted at replication offset %d of history %s, which never"
                " descended from the primary this worker wrote to: a replica promoted before its first"
                " full sync ended, or a replica of another primary, so it serves its own older data):"
                " the leases and acks in them come back, so their pages are crawled twice, and requests"
                " queued only in them are lost unless another page links to them. This worker sends"
                " again what it had not seen on a replica yet. Promote only a replica in sync"
                " (master_link_status:up; Sentinel: down-after-milliseconds longer than a full sync)",
                self.shown(name), lost, view.second_offset - 1, view.replid2,
            )
            return
        logger.error(
            "Redis primary %s was promoted without the last %d bytes of writes that a replica of"
            " the primary before it had acknowledged (Redis promoted a replica that was behind"
            " another, or the one that had them was wiped): the acks and leases in them come"
            " back, so their pages are crawled twice, and requests queued only in them are lost"
            " unless another page links to them. Redis chose which writes to keep; this worker"
            " sends again what it had not seen on a replica yet",
            self.shown(name), lost,
        )

    def judge(self, name: str, acked: int | None, view: NodeView | None, now: float) -> Verdict:
        """What a barrier on ``name`` means: ``acked`` is WAIT's reply (None if the
        barrier failed), ``view`` what the node said afterwards (None if it could not say)."""
        if view is None or view.role != "master":
            return Verdict.RESEND
        if self.look(name, view, now):
            return Verdict.RESEND
        known = self.primaries[name]
        if acked is not None and acked >= known.required:
            return Verdict.PASS
        if self.min_replicas < 0 and view.connected == 0:
            if known.zero_since is None:
                known.zero_since = now
            if now - known.zero_since >= self.grace_s:
                known.required = 0
                if not known.gave_up:
                    logger.error(
                        "Redis primary %s has had no replica for %gs: acks no longer wait for one"
                        " (STREAMS_MIN_REPLICAS=auto), so a failover of it now loses what it took"
                        " since; attach a replica, or set STREAMS_MIN_REPLICAS=1 to hold acks until one is back",
                        self.shown(name), self.grace_s,
                    )
                    known.gave_up = True
                return Verdict.PASS
        if not known.short_logged and view.connected < known.required:
            logger.warning(
                "Redis primary %s has %d of the %d replica(s) acks wait for (STREAMS_MIN_REPLICAS=%s);"
                " acks are held until they are back",
                self.shown(name), view.connected, known.required, "auto" if self.min_replicas < 0 else self.min_replicas,
            )
            known.short_logged = True
        return Verdict.HOLD


class ReplicaGuard:
    """The Redis side of the barriers: which primary holds a key, its replication, SET + WAIT.

    ``client`` is the worker's client (standalone, Sentinel-managed or cluster).
    A cluster's barrier runs on that node's own client, never through the cluster
    pipeline, which would retry a redirected command on another connection and
    make WAIT count the wrong writes.
    """

    def __init__(self, client: Any, book: ReplicaBook, wait_ms: int, node_id: str) -> None:
        from streams_sched.connect.clients import is_cluster_client

        self.client = client
        self.book = book
        book.shown = self.shown
        self.wait_ms = wait_ms
        self.node_id = node_id
        self.cluster = is_cluster_client(client)
        #: primaries whose INFO this user may not read (warned once each)
        self.denied: set[str] = set()
        #: run ids of primaries already reported as restarted empty
        self.reported_empty: set[str] = set()
        #: primary address -> the run id this worker last saw there (a primary is named by
        #: its address here, so a Sentinel failover shows as another address)
        self.run_ids: dict[str, str] = {}
        self.noted = False
        #: since when (monotonic): an address never seen counts as restarted only if its
        #: process started after this
        self.watching_since = time.monotonic()

    def shown(self, name: str) -> str:
        """``name`` for a log line: a cluster node's host:port, or the address of the
        standalone or Sentinel primary (named "" here)."""
        from streams_sched.connect.clients import primary_address

        return name or primary_address(self.client)

    def note_primaries(self) -> None:
        """Note the run id of every primary as this worker first sees it: a primary later
        found with another run id is a new process (persistence.came_back_empty)."""
        from streams_sched.connect.persistence import read_persistence

        self.noted = True  # once: a primary it could not read counts by its uptime
        try:
            for p in read_persistence(self.client):
                self.run_ids.setdefault(p.name, p.run_id)
        except Exception as exc:
            logger.debug("cannot note the primaries' run ids: %s", exc)

    def came_back_empty(self, name: str) -> bool:
        """True if primary ``name`` lost its data (persistence.py says when), each new
        process reported once. False if it cannot say: an unanswered question is not a loss."""
        try:
            node = self.client.get_node(node_name=name) if self.cluster else None
            if self.cluster and node is None:
                return False
            return bool(self._lost(node))
        except Exception:
            return False

    def restarted_empty(self) -> list[str]:
        """The primaries that lost their data, each reported once (:meth:`came_back_empty`
        for every primary, asked after an outage: a crawl whose work is all revisits sends
        no enqueue whose resend would ask)."""
        try:
            return self._lost(None)
        except Exception:  # an unanswered question is not a loss
            return []

    def _lost(self, node: Any) -> list[str]:
        """The primaries (all, or cluster node ``node``) that lost their data and were not
        reported yet; each one's run id is noted as seen."""
        from streams_sched.connect.persistence import came_back_empty, read_persistence

        watched_s = time.monotonic() - self.watching_since
        out = []
        for p in read_persistence(self.client, node):
            seen = self.run_ids.get(p.name)
            if (
                p.run_id not in self.reported_empty
                and came_back_empty(p, seen, watched_s)
                and not self._superseded(p.name)
            ):
                self.reported_empty.add(p.run_id)
                out.append(p.name)
            if p.role == "master" and not p.loading:
                self.run_ids[p.name] = p.run_id
        return out

    def _superseded(self, name: str) -> bool:
        """On a cluster: True if another node's CLUSTER NODES gives node ``name`` no slot (a
        master restarted after its replica was promoted, about to be demoted and to copy
        the promoted replica). False if no other node says."""
        if not self.cluster:
            return False
        from streams_sched.connect.cluster_health import parse_cluster_nodes

        for other in self.client.get_primaries():
            if other.name == name or other.redis_connection is None:
                continue
            try:
                nodes = parse_cluster_nodes(other.redis_connection.execute_command("CLUSTER", "NODES"))
            except Exception:
                continue
            entry = next((n for n in nodes if n.address == name), None)
            if entry is not None:
                return not entry.is_master or not entry.slots
        return False

    def primary_of(self, key: str) -> str:
        """The name of the primary that owns ``key`` (a standalone server is "")."""
        if not self.cluster:
            return ""
        return str(self.client.get_node_from_key(key).name)

    def _node_client(self, name: str) -> Any:
        if not self.cluster:
            return self.client
        node = self.client.get_node(node_name=name)
        if node is None:
            raise LookupError(name)
        return self.client.get_redis_connection(node)

    def view(self, name: str) -> NodeView | None:
        from redis.exceptions import ResponseError

        from streams_sched.connect.clients import TRANSIENT

        try:
            return parse_replication(self._node_client(name).info("replication"))
        except (LookupError, *TRANSIENT):  # type: ignore[misc]  # a tuple of exception classes
            return None
        except ResponseError as exc:
            if name not in self.denied:
                self.denied.add(name)
                logger.warning(
                    "cannot count the replicas of Redis primary %s (%s): writes are not waited for on"
                    " a replica, so a failover may lose the last of them; give this ACL user +info and +wait",
                    self.shown(name), exc,
                )
            return NodeView("master", 0, "", 0)  # taken as a primary without replicas

    def required(self, name: str, now: float) -> int | None:
        """Replicas an ack waits for on ``name`` (counted again now and then); None if
        ``name`` could not say (a barrier then decides)."""
        book = self.book
        if book.needs_look(name, now):
            view = self.view(name)
            if view is not None and view.role == "master":
                book.look(name, view, now)
        return book.required(name)

    def checks_writes(self, name: str, now: float) -> bool:
        """True if the writes on ``name`` must pass a barrier before the acks behind them
        (:meth:`ReplicaBook.checks_writes`; the replicas counted again if due)."""
        self.required(name, now)
        return self.book.checks_writes(name)

    def barrier(self, name: str, sync_key: str, now: float) -> Verdict:
        """SET ``sync_key`` and WAIT on one connection of primary ``name``; judge the result."""
        from redis.exceptions import ResponseError

        from streams_sched.connect.clients import TRANSIENT

        needed = self.required(name, now)
        if needed is None:
            return Verdict.RESEND  # it cannot even say whether it is a primary
        acked: int | None = None
        try:
            pipe = self._node_client(name).pipeline(transaction=False)
            pipe.set(sync_key, self.node_id, px=SYNC_TTL_MS)
            pipe.execute_command("WAIT", needed, self.wait_ms)
            pipe.info("replication")
            set_reply, wait_reply, info_reply = pipe.execute(raise_on_error=False)
            if isinstance(set_reply, ResponseError):
                # MOVED / READONLY: the key is no longer this node's to take
                logger.info("barrier on %s refused (%s): sending its writes again", self.shown(name), set_reply)
                return Verdict.RESEND
            if isinstance(set_reply, Exception):
                raise set_reply
            if not isinstance(wait_reply, Exception):
                acked = int(wait_reply)
        except (LookupError, *TRANSIENT):  # type: ignore[misc]  # a tuple of exception classes
            return Verdict.RESEND
        view = None if isinstance(info_reply, Exception) else parse_replication(info_reply)
        return self.book.judge(name, acked, view, now)
