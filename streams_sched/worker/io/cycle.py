"""The worker's I/O thread: every Redis round trip of a worker happens here, in cycles.

The reactor thread never talks to Redis. The two threads share one
:class:`~streams_sched.worker.exchange.Exchange`: the scheduler puts operations
(ops.py: an ``Entry`` to enqueue, ``Ack``, ``DeadLetter``, ``Release``, ``Failed``,
``Extend``) in its ``outbox`` and takes leased requests from its ``arrivals``.

One cycle, :meth:`IOThread.run_cycle`, reads top to bottom:

1. **take** the reactor's operations from the outbox; the :class:`~streams_sched.worker.ops.AckGate`
   orders them (acks ride behind the enqueues before them);
2. **send**, in one pipeline: the enqueues (one enqueue.lua per shard), on one server the
   replica WAIT that covers them, the lease operations the gate lets through (one
   ack.lua per shard, each site's healthy answers riding along; dead letters, releases,
   failed deliveries and extensions per site), politeness feedback that cannot wait for
   an ack, the lease calls (one lease.lua per shard that named sites or is due), and the
   heartbeat;
3. **read the replies**, command by command (sent.py records what each was): a confirmed
   enqueue counts and wakes its site's shard, a lease reply goes to :class:`Leasing`, a
   failed command goes back to the gate to be sent again (nothing is dropped);
4. **hold acks behind replicas**: the replica barrier (barrier.py) lets the acks behind
   the cycle's writes go once they are on a replica;
5. **upkeep**, when there is time: take over an expired lease (takeover.py), check
   whether the crawl is drained (drain_check.py), move a scrapy-redis feed (feeding.py),
   re-read the crawl's default policy.

The cycle's state has one owner, this thread. The parts it calls own their own state and
expose methods: :class:`Leasing` (what the shards named, what the sites said),
:class:`ReplicaBarrier`, :class:`Takeover`, :class:`DrainCheck`, :class:`Feed`,
:class:`Presence` (the heartbeat) and :class:`Trouble` (outages and refusals). None
writes another's fields. What the worker holds is counted in a
:class:`~streams_sched.worker.leasebook.LeaseBook`. What the thread keeps follows the
sites it holds or recently asked, never the crawl's sites.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Container
from typing import TYPE_CHECKING, Any, NamedTuple

from redis.exceptions import NoScriptError, ResponseError

from streams_sched.config import StreamsConfig
from streams_sched.connect.cluster_health import cluster_down_line
from streams_sched.connect.clients import TRANSIENT, describe_nodes
from streams_sched.frontier import scripts as lua
from streams_sched.frontier.batches import drop_legacy_seen, enqueue_calls
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import shard_of
from streams_sched.frontier.moves import moved_in_error, moved_in_halt
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts._call import Call
from streams_sched.politeness.adaptive import FeedbackBatch
from streams_sched.scrapy_redis.legacy import LEGACY_FIELD
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.exchange import OUTBOX_FLUSH, Exchange
from streams_sched.worker.io.barrier import ReplicaBarrier
from streams_sched.worker.io.drain_check import DrainCheck
from streams_sched.worker.io.feeding import Feed
from streams_sched.worker.io.leasing import Leasing
from streams_sched.worker.io.presence import Presence
from streams_sched.worker.io.recovery import release_orphans
from streams_sched.worker.io.sent import (
    AFTER_STAT,
    Enqueued,
    FeedbackSent,
    Heartbeat,
    Leased,
    LeaseOpsSent,
    Sent,
    Waited,
    describe,
)
from streams_sched.worker.io.takeover import Takeover, claim_mask
from streams_sched.worker.io.trouble import Trouble
from streams_sched.worker.leasebook import LeaseBook
from streams_sched.worker.ops import (
    ENDS_LEASE,
    Ack,
    AckGate,
    DeadLetter,
    Extend,
    Failed,
    LeaseOp,
    Op,
    Release,
)

if TYPE_CHECKING:
    from streams_sched.scrapy_redis.feed import FeedMover

__all__ = ["CycleResult", "IOThread", "make_node_id", "per_site_cap"]

logger = logging.getLogger(__name__)

#: a site's prefetch holds no more than this many seconds of its DOWNLOAD_DELAY, so
#: leases do not age in the buffer
PREFETCH_HORIZON_S = 2.0
#: how long finish() keeps sending what is queued before giving up
STOP_FLUSH_S = 30.0
#: what a refusal outside the pipeline is called in the log (refusals.py)
IDLE_WORK = "idle-time work (policy, site registry, lease takeover or drain check)"


def per_site_cap(config: StreamsConfig, per_site_concurrency: int, download_delay: float) -> int:
    """Leases a worker holds of one site: what its downloader slot takes, plus a prefetch
    that, with a download delay, holds no more than PREFETCH_HORIZON_S of it."""
    site_prefetch = config.prefetch_per_site or per_site_concurrency
    if download_delay > 0 and not config.prefetch_per_site:
        site_prefetch = max(1, min(site_prefetch, math.ceil(PREFETCH_HORIZON_S / download_delay)))
    return per_site_concurrency + site_prefetch


class CycleResult(NamedTuple):
    """What one cycle did: the requests that arrived, whether it asked any shard for
    leases, and how long to back off before the next (after an outage or a refusal)."""

    arrived: int
    leased: bool
    back_off_s: float


class IOThread(threading.Thread):
    """Batches a worker's Redis traffic in cycles on a thread of its own."""

    def __init__(
        self,
        frontier: Frontier,
        config: StreamsConfig,
        codec: RequestCodec,
        node_id: str,
        *,
        concurrency: int,
        per_site_concurrency: int,
        download_delay: float = 0.0,
        node_info: dict[str, Any] | None = None,
        exchange: Exchange | None = None,
        feed: FeedMover | None = None,
    ) -> None:
        super().__init__(name=f"streams-sched-io-{node_id}", daemon=True)
        self.frontier = frontier
        self.config = config
        self.node_id = node_id
        prefetch = config.prefetch or concurrency
        #: the only state shared with the reactor thread (exchange.py)
        x = self.exchange = exchange if exchange is not None else Exchange()
        x.low_water = max(1, prefetch // 2)
        self.closing = False
        self.stop_requested = False
        #: cycles run so far, and a condition notified after each
        self.cycles = 0
        self.cycle_done = threading.Condition()
        self.leases = LeaseBook()
        #: enqueues and lease operations in flight, in the order Redis must see them
        self.gate = AckGate()
        #: the downloader's answers per site, batched for feedback.lua (politeness)
        self.feedback = FeedbackBatch(config.feedback_interval_seconds)
        #: feedback.lua's adaptive flag, decrease, increase, floor and forget ms (the config is frozen)
        self.feedback_params = (
            "1" if config.adaptive else "0",
            repr(config.adaptive_decrease),
            repr(config.adaptive_increase),
            repr(config.adaptive_min_rate),
            int(config.adaptive_forget_seconds * 1000),
        )
        self.takeover = Takeover(frontier, config, x, node_id)
        self.leasing = Leasing(
            frontier, config, x, self.leases, self.gate, codec, node_id,
            capacity=concurrency + prefetch,
            per_site_cap=per_site_cap(config, per_site_concurrency, download_delay),
            on_suspect_done=self.takeover.suspect_done,
        )
        self.barrier = ReplicaBarrier(frontier, config, x, self.gate, node_id)
        self.trouble = Trouble(
            x, self.barrier.refresh_topology,
            tried=lambda: describe_nodes(frontier.client), escalate_after_s=config.lease_seconds,
            diagnose=lambda: cluster_down_line(frontier.client),
        )
        self.drain = DrainCheck(frontier, config, x)
        self.feed = Feed(feed, config, x)
        #: requests this worker acked (in its heartbeat: the monitor measures a worker's rate by it)
        self.acked = 0
        self.presence = Presence(
            frontier, config, x, self.leases, node_id, node_info or {}, self.leasing.browser_cap, acked=lambda: self.acked,
        )
        self.next_policy = time.monotonic()

    # -- called from the reactor thread ------------------------------------

    def stop_leasing(self) -> None:
        """Lease nothing more (the worker is closing); does not wait."""
        self.closing = True
        self.exchange.kick()

    def begin_close(self, timeout: float = 5.0) -> None:
        """Stop leasing; return once no more arrivals can appear: after two cycles, the
        first of which may have been under way with a lease call. Each is started at once
        (kicked), not after the thread's idle wait."""
        deadline = time.monotonic() + timeout
        with self.cycle_done:
            self.closing = True
            target = self.cycles + 2
            while self.is_alive() and self.cycles < target:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.exchange.kick()
                self.cycle_done.wait(left)

    def finish(self, timeout: float) -> bool:
        """Flush everything queued, then stop the thread. True if all was flushed."""
        self.stop_requested = True
        self.exchange.kick()
        if self.is_alive():
            self.join(timeout)
        else:  # never started (run_cycle drove it): flush here
            deadline = time.monotonic() + min(timeout, STOP_FLUSH_S)
            while not self._flushed_or_late(deadline):
                self.run_cycle()
            self.presence.goodbye()
        return not self.is_alive() and not self.gate

    def refresh_policy(self) -> None:
        """Read the crawl's default policy now (before the thread starts)."""
        self._refresh_policy(time.monotonic())

    # -- the thread ---------------------------------------------------------

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # pragma: no cover - a bug; keep it visible
            self.exchange.fatal = exc
            logger.exception("streams-sched I/O thread crashed; the worker cannot lease or ack")
            self.exchange.wake()

    def _loop(self) -> None:
        deadline: float | None = None
        x = self.exchange
        x.io_thread = threading.get_ident()
        while True:
            if self.stop_requested:
                if deadline is None:
                    deadline = time.monotonic() + STOP_FLUSH_S
                if self._flushed_or_late(deadline):
                    break
            timeout = self._wait_time()
            if timeout > 0:
                x.kicked.wait(timeout)
            x.kicked.clear()
            back_off_s = self.run_cycle().back_off_s
            if back_off_s:
                time.sleep(back_off_s)
        self.presence.goodbye()

    def _flushed_or_late(self, deadline: float) -> bool:
        """Stopping: True once everything queued is sent, or the flush ran out of time."""
        x = self.exchange
        if not self.gate and not x.outbox:
            return True
        if x.moved is not None:
            # what is left can only go to the Redis the crawl has left: its requests are in
            # the copy (queued), and the enqueues would be refused
            return True
        if time.monotonic() <= deadline:
            return False
        logger.error(
            "streams-sched stopping with %d unsent operations; their requests"
            " come back when their leases expire",
            len(x.outbox) + len(self.gate),
        )
        return True

    def _wait_time(self) -> float:
        """How long to sleep before the next cycle: until something is due, or kicked."""
        x = self.exchange
        if self.stop_requested:
            # writes waiting for a replica are retried on their own schedule: do not spin
            return 0.0 if (x.outbox or (self.gate and not self.gate.awaiting)) else 0.01
        if len(x.outbox) >= OUTBOX_FLUSH:
            return 0.0
        if x.outbox or self.gate:
            return self.config.flush_interval_seconds
        now = time.monotonic()
        if x.feedback:
            self.feedback.absorb(x.feedback, now)
        if self.feedback.due(now):
            return 0.0
        deadlines = [self.presence.next_heartbeat, self.takeover.next_busy]
        if self.feedback.sites:
            deadlines.append(self.feedback.next_report)
        if not self.closing and self.leases.total - x.inflight <= x.low_water:
            deadlines.append(self.leasing.next_due(now))
            feed_due = self.feed.next_due()
            if feed_due is not None:
                deadlines.append(feed_due)
            deadlines.append(self.takeover.next_idle)
            if self.takeover.recovering and self.leases.suspects == 0:
                deadlines.append(now)
            if self.leases.total == 0:
                deadlines.append(self.drain.next_check)
        return min(max(min(deadlines) - now, 0.002), self.config.idle_poll_seconds)

    # -- one cycle ------------------------------------------------------------

    def run_cycle(self) -> CycleResult:
        """Run one cycle now, on the calling thread (the thread's loop, or a test)."""
        x = self.exchange
        trouble = self.trouble
        trouble.refused = False
        failed = False
        result = CycleResult(0, False, 0.0)
        x.cycle_started = time.monotonic()
        try:
            result = self._cycle()
            if trouble.reachable():
                self._release_orphans()
                self.barrier.after_outage()
        except TRANSIENT as exc:
            trouble.outage(exc)
            failed = True
        except ResponseError as exc:
            # refused outside the pipeline: policy, registry, claim or drain check
            trouble.refuse(IDLE_WORK, exc)
        except Exception:
            logger.exception("streams-sched I/O cycle failed; retrying")
            failed = True
        finally:
            x.cycle_started = 0.0
            with self.cycle_done:
                self.cycles += 1
                self.cycle_done.notify_all()
        back_off_s = trouble.delay(failed)
        if not back_off_s:
            trouble.accepted(IDLE_WORK)
        return result._replace(back_off_s=back_off_s)

    def _cycle(self) -> CycleResult:
        now = time.monotonic()
        x = self.exchange
        x.browser_held = self.leases.browser
        if now >= self.next_policy:
            self._refresh_policy(now)
        # 1. take the reactor's operations, in order
        ops = self._take_ops()
        enq, after = self.gate.plan(ops)
        # 2. send them, with the cycle's feedback, lease calls and heartbeat, in one pipeline
        pipe = self.frontier.client.pipeline(transaction=False)
        sent: list[Sent] = []
        try:
            if x.legacy is not None:
                enq = self._drop_legacy_seen(enq)
            leased = self._queue(pipe, sent, enq, after, now)
            replies = pipe.execute(raise_on_error=False) if sent else []
        except BaseException:
            self.gate.not_sent(enq, after)
            raise
        # 3. read the replies; 4. hold acks until their writes are on a replica
        arrived = 0
        if sent:
            try:
                arrived = self._apply(sent, replies)
            finally:
                self.barrier.run(now)
        elif self.gate.awaiting:
            self.barrier.run(now)
        x.unsent = bool(self.gate)
        # 5. upkeep, while the worker is not closing
        if not (self.closing or self.stop_requested):
            self._upkeep(now, leased, arrived)
        return CycleResult(arrived, leased, 0.0)

    def _take_ops(self) -> list[Op]:
        """The reactor's operations, oldest first; the leases they end are ended here."""
        x = self.exchange
        outbox = x.outbox
        ops: list[Op] = []
        if outbox:
            x.unsent = True  # taken from the outbox, not yet confirmed
            while outbox:
                ops.append(outbox.popleft())
        end = self.leases.end
        for op in ops:
            if isinstance(op, ENDS_LEASE) and end(op.entry):
                self.takeover.suspect_done()  # the next expired lease may be taken
        return ops

    def _queue(self, pipe: Any, sent: list[Sent], enq: list[Entry], after: list[LeaseOp], now: float) -> bool:
        """Queue the cycle's commands in the order Redis must see them; True if a shard
        was asked for leases."""
        # answers first: a site's healthy ones go with its ack
        self.feedback.absorb(self.exchange.feedback, now)
        f = self.frontier
        if enq:
            # one enqueue.lua call per shard for its sites, up to CALL_LIMIT requests a call
            for parts in enqueue_calls(enq, f.shards):
                call = lua.enqueue.call(f, parts)
                call.queue(pipe)
                sent.append(Enqueued(parts[0][0], [e for _, chunk in parts for e in chunk], tuple(parts), call.parse))
            sent += self.barrier.queue_inline(pipe, now)
        if after:
            self._queue_lease_ops(pipe, sent, after, now)
        sent += self._queue_feedback(pipe, now)
        leased = False
        if not (self.closing or self.stop_requested):
            calls = self.leasing.queue(pipe, now)
            sent += calls
            leased = bool(calls)
        if not self.stop_requested:
            sent += self.presence.queue(pipe, now)
        return leased

    def _queue_lease_ops(self, pipe: Any, sent: list[Sent], after: list[LeaseOp], now: float) -> None:
        """One ack.lua call per shard for its sites' acks, each site's healthy answers riding
        along; one call per site and kind for the other lease operations."""
        f = self.frontier
        acks: dict[int, dict[str, list[Ack]]] = defaultdict(lambda: defaultdict(list))
        others: dict[tuple[type, str], list[LeaseOp]] = defaultdict(list)
        for op in after:
            site = op.entry.site
            if type(op) is Ack:
                acks[shard_of(site, f.shards)][site].append(op)
            else:
                others[(type(op), site)].append(op)
        held = self.leases.by_site
        for by_site in acks.values():
            calls = []
            answered = []
            group: list[LeaseOp] = []
            for site, ops in by_site.items():
                last = site not in held
                ok = self.feedback.take_healthy(site, now, last)
                if ok and last and self.leasing.finished(site):
                    # healthy answers of a site with nothing left and no rate feed nothing but
                    # its answer window, which expires unread: not worth three commands a page
                    ok = 0
                plain = [(a.entry.stream, a.entry.id) for a in ops if a.revisit is None]
                tracked = [] if len(plain) == len(ops) else [
                    (a.entry.stream, a.entry.id, *a.revisit) for a in ops if a.revisit is not None
                ]
                calls.append((site, plain, (ok, self.feedback_params) if ok else None, tracked))
                if ok:
                    answered.append((site, ok))
                group += ops
            ack = lua.ack.call(f, calls)
            ack.queue(pipe)
            sent.append(LeaseOpsSent(Ack, group, tuple(answered), ack.parse))
        for (kind, site), group in others.items():
            call: Call[Any] | None = None
            if kind is DeadLetter:
                call = lua.dead.call(f, site, self.node_id, [(d.entry.stream, d.entry.id, d.reason) for d in group])  # type: ignore[union-attr]
            elif kind is Release:
                call = lua.release.call(f, site, self.node_id, [(r.entry.stream, r.entry.id) for r in group])
            elif kind is Failed:
                failed = [(d.entry.stream, d.entry.id, d.reason) for d in group]  # type: ignore[union-attr]
                call = lua.fail.call(f, site, self.node_id, self.config.max_deliveries, failed)
            else:
                for extend in group:
                    f.extend(site, self.node_id, extend.entry.stream, extend.entry.id, pipe)
            if call is not None:
                call.queue(pipe)
            sent.append(LeaseOpsSent(kind, group, parse=call.parse if call is not None else None))

    def _queue_feedback(self, pipe: Any, now: float) -> list[FeedbackSent]:
        """One feedback.lua call per site with answers to report: at once after a 429, 503,
        timeout or robots.txt, otherwise every STREAMS_FEEDBACK_INTERVAL_SECONDS. Healthy
        answers of a site this worker holds leases of wait for its ack instead, and so do
        those of a site whose ack waits behind enqueues in the gate: its lease has ended
        here, but the ack that can carry them is coming."""
        if not self.feedback.due(now):
            return []
        holding: Container[str] = self.leases.by_site
        acking = {op.entry.site for op in self.gate.behind if type(op) is Ack}
        if acking:
            acking.update(self.leases.by_site)
            holding = acking
        calls = []
        for site, outcome, robots in self.feedback.take(now, holding):
            call = lua.feedback.call(self.frontier, site, outcome, robots, self.feedback_params)
            call.queue(pipe)
            calls.append(FeedbackSent(site, call.parse))
        return calls

    # -- the replies ------------------------------------------------------------

    def _apply(self, sent: list[Sent], replies: list[Any]) -> int:
        """Apply the replies of one pipeline; return how many requests arrived. Raises
        the first transient error once every reply is applied."""
        received = time.monotonic()
        x = self.exchange
        stats = x.stats
        arrived = 0
        confirmed = False
        noscript = False
        transient: BaseException | None = None
        for cmd, reply in zip(sent, replies, strict=True):
            if isinstance(reply, Exception):
                if isinstance(reply, NoScriptError):
                    noscript = True
                elif isinstance(reply, TRANSIENT):
                    transient = reply
                self._failed(cmd, reply)
                continue
            if self.trouble.refusals:  # one that was refused may be accepted again
                self.trouble.accepted(describe(cmd))
            if isinstance(cmd, Enqueued):
                for (site, chunk), r in zip(cmd.parts, cmd.parse(reply), strict=True):
                    if r.added:
                        # not drained, before the reactor can see these enqueues done
                        self.drain.work_seen(received)
                        self.leasing.poke(site)
                        stats.append(("streams/enqueued", r.added))
                    x.enqueues_done += len(chunk)
                    if r.duplicates:
                        stats.append(("dupefilter/filtered", r.duplicates))
                        stats.append(("streams/duplicates_remote", r.duplicates))
                    if r.delayed:
                        stats.append(("streams/delayed", r.delayed))
                    if r.over_cap:
                        stats.append(("streams/over_cap", r.over_cap))
                self.barrier.confirmed.append(cmd)
                confirmed = True
            elif isinstance(cmd, Leased):
                lease = cmd.parse(reply)
                if lease.halt:
                    self._halted(lease.halt)
                arrived += self.leasing.on_leased(cmd.plan, lease)
            elif isinstance(cmd, Heartbeat):
                if cmd.parse is not None and cmd.sent_at is not None:
                    self.frontier.clock.observe(cmd.parse(reply), cmd.sent_at, received)
            elif isinstance(cmd, LeaseOpsSent):
                value = cmd.parse(reply) if cmd.parse is not None else reply
                if cmd.kind is Ack:
                    n = sum(value)
                    self.acked += n
                elif cmd.kind is Failed:
                    n = value.requeued
                    if value.dead:
                        stats.append(("streams/dead_lettered", value.dead))
                else:  # an extension (XCLAIM) counts its group; a dead letter or release its reply
                    n = len(cmd.group) if cmd.kind is Extend else value
                stats.append((AFTER_STAT[cmd.kind], n))
            elif isinstance(cmd, Waited):
                self.barrier.inline_wait.append(reply)
            elif isinstance(cmd, FeedbackSent) and cmd.parse(reply).cut:
                stats.append(("streams/backoffs", 1))
                self.leasing.ask_again(cmd.site)
        if noscript:
            self.frontier.load_scripts()
        if arrived:
            self.drain.work_seen(received)
        if arrived or confirmed:
            self.exchange.wake_if_starved()
        if transient is not None:
            raise transient
        return arrived

    def _halted(self, halt: str) -> None:
        """A shard says a move halted it: a pause leases nothing for now (lease.lua), a
        move that is done closes the worker (the scheduler reads ``moved``)."""
        to = moved_in_halt(halt)
        if to is not None:
            self._moved(to)

    def _moved(self, to: str) -> None:
        x = self.exchange
        if x.moved is None:
            x.moved = to
            self.closing = True
            x.wake()

    def _failed(self, cmd: Sent, reply: Exception) -> None:
        """A command failed: what it carried goes back to be sent again."""
        to = moved_in_error(reply)
        if to is not None:
            self._moved(to)  # no refusal to log: the worker closes, naming where the crawl went
        elif not isinstance(reply, (NoScriptError, *TRANSIENT)):
            self.trouble.refuse(describe(cmd), reply, back_off=isinstance(cmd, (Enqueued, LeaseOpsSent)))
            if isinstance(cmd, Leased):
                self.leasing.refused(cmd.plan)
        if isinstance(cmd, Enqueued):
            self.gate.enqueue_failed(cmd.chunk)
        elif isinstance(cmd, LeaseOpsSent):
            self.gate.after_failed(cmd.group)
            if cmd.answered:  # the healthy answers that rode along go back into the batch
                self.feedback.absorb(deque((site, "ok", ok) for site, ok in cmd.answered))

    # -- upkeep ---------------------------------------------------------------

    def _upkeep(self, now: float, leased: bool, arrived: int) -> None:
        """Take over an expired lease when there is nothing else to do (and now and then
        even when busy), check whether the crawl is drained when idle, move a feed."""
        book = self.leases
        if book.total < self.leasing.capacity and book.suspects == 0 and self.takeover.wanted(now, leased):
            browser_full = bool(self.leasing.browser_cap) and book.browser >= self.leasing.browser_cap
            taken = self.takeover.take_one(now, claim_mask(self.config.capabilities, self.leasing.http, browser_full))
            if taken and self.leasing.accept(taken):
                arrived += len(taken)
                self.exchange.wake_if_starved()
        x = self.exchange
        if arrived or book.total or x.outbox or self.gate:
            self.drain.work_seen(now)
        elif not leased and self.drain.due(now):
            self._check_drain(now)
        added = self.feed.move(now)
        if added:
            self.drain.work_seen(now)
            for site in added:
                self.leasing.poke(site)

    def _check_drain(self, now: float) -> None:
        if self.feed.pending():
            # the feed still has entries: not drained, and move them now
            self.drain.feed_pending(now)
            self.feed.due_now(now)
            return
        counts = self.frontier.shard_counts()
        self.leasing.shards_with_work(counts, now)
        self.drain.check(now, counts)

    def _refresh_policy(self, now: float) -> None:
        """Re-read the crawl's default policy ("*"), so a live change reaches this worker."""
        self.next_policy = now + self.config.policy_refresh_seconds
        meta = self.frontier.crawl_meta()
        self.frontier.use_crawl_defaults(meta)
        self.exchange.legacy = meta.get(LEGACY_FIELD) or None

    def _release_orphans(self) -> None:
        """After a Redis error: hand back leases Redis granted but whose reply was lost."""
        known = set(self.leases.ids)
        known.update((op.entry.site, op.entry.stream, op.entry.id) for op in self.gate.lease_ops())
        sites = {site for site, _, _ in known} | set(self.frontier.leased_sites())
        released = release_orphans(self.frontier, self.node_id, sorted(sites), known)
        if released:
            self.exchange.stats.append(("streams/orphans_released", released))

    def _drop_legacy_seen(self, entries: list[Entry]) -> list[Entry]:
        """Drop requests a migrated scrapy-redis crawl already saw (one SMISMEMBER;
        frontier/batches.py, as for every producer)."""
        kept, dropped = drop_legacy_seen(self.frontier.client, self.exchange.legacy, entries)
        if dropped:
            # done as far as the scheduler's drain check goes: they will never be sent
            self.exchange.enqueues_done += len(dropped)
            self.exchange.stats.append(("streams/legacy_duplicates", len(dropped)))
            self.exchange.stats.append(("dupefilter/filtered", len(dropped)))
        return kept


def make_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
