"""The worker's I/O thread: every Redis round trip of a worker happens here.

The reactor thread never talks to Redis. The two threads share one
:class:`~streams_sched.worker.exchange.Exchange`: the scheduler puts operations
(ops.py: an ``Entry`` to enqueue, :class:`Ack`, :class:`DeadLetter`,
:class:`Release`, :class:`Failed`, :class:`Extend`) in its ``outbox`` and takes prefetched
requests from its ``arrivals``. The pump batches everything of one cycle into
one pipeline:

    enqueues (one enqueue.lua per shard), the lease operations of the previous
    cycle (one ack.lua per shard), politeness feedback, leases (one lease.lua per
    shard that named sites or is due to be asked), heartbeat

The order of enqueues and acks is :class:`~streams_sched.worker.ops.AckGate`'s:
acks ride one cycle behind the enqueues, so a request's follow-up requests
are in Redis before its ack, even on Redis Cluster; where a primary has
replicas, on one of them too (replicas.py: a SET + WAIT barrier per primary
after the pipeline). What the worker holds is
counted in a :class:`~streams_sched.worker.leasebook.LeaseBook`; which sites to
lease from is decided in selection.py (plan_shards), among the sites each shard's
ready index named in the previous call. What the pump keeps follows the sites it
holds or recently asked, never the crawl's sites: per shard the named sites and
when to ask again, per site a hint only while it holds leases or must wait.
Besides, when idle, the pump takes over expired leases (at the sites each
shard's leased index names), checks whether the crawl is drained (from the
shards' sizes), moves a scrapy-redis feed and re-reads the crawl's default policy.

The pump is the loop; each stage of a cycle is a module of its own, read in this
order: writes.py (what a cycle sends), barrier.py (the replica wait), leasing.py
(lease calls and their replies), replies.py (applying replies), upkeep.py and
feeding.py (idle-time work), presence.py (the heartbeat), trouble.py (outages and
refusals).
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import ResponseError

from streams_sched.config import StreamsConfig
from streams_sched.connect.clients import TRANSIENT, describe_nodes
from streams_sched.frontier.batches import drop_legacy_seen
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.records import Entry
from streams_sched.politeness.adaptive import FeedbackBatch
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.exchange import OUTBOX_FLUSH, Exchange
from streams_sched.worker.io.barrier import ReplicaStage
from streams_sched.worker.io.feeding import FeedStage
from streams_sched.worker.io.leasing import Leasing
from streams_sched.worker.io.presence import Presence
from streams_sched.worker.io.recovery import release_orphans
from streams_sched.worker.io.replies import Replies
from streams_sched.worker.io.sent import Sent
from streams_sched.worker.io.trouble import Trouble
from streams_sched.worker.io.upkeep import Upkeep
from streams_sched.worker.io.writes import Writes
from streams_sched.worker.leasebook import LeaseBook
from streams_sched.worker.ops import ENDS_LEASE, AckGate, Op

if TYPE_CHECKING:
    from streams_sched.scrapy_redis.feed import FeedMover

__all__ = ["Pump", "make_node_id"]

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


class Pump(threading.Thread):
    """Batches a worker's Redis traffic on a background thread."""

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
        super().__init__(name=f"streams-sched-pump-{node_id}", daemon=True)
        self.frontier = frontier
        self.config = config
        self.node_id = node_id
        prefetch = config.prefetch or concurrency
        #: the only state shared with the reactor thread (exchange.py)
        x = self.exchange = exchange if exchange is not None else Exchange()
        x.low_water = max(1, prefetch // 2)
        self._closing = False
        self._stop_requested = False
        self._cycles = 0
        self._cycle_done = threading.Condition()
        self.leases = LeaseBook()
        #: enqueues and lease operations in flight, in the order Redis must see them
        self.gate = AckGate()
        self.answers = FeedbackBatch(config.feedback_interval_seconds)
        self.leasing = Leasing(
            frontier, config, x, self.leases, self.gate, codec, node_id,
            capacity=concurrency + prefetch,
            per_site_cap=per_site_cap(config, per_site_concurrency, download_delay),
            on_suspect_done=self._claim_now,
        )
        self.replicas = ReplicaStage(frontier, config, x, self.gate, node_id)
        self.trouble = Trouble(
            x, self.replicas.refresh_topology,
            tried=lambda: describe_nodes(frontier.client), escalate_after_s=config.lease_seconds,
        )
        self.writes = Writes(frontier, config, node_id, self.answers, self.leasing, self.replicas)
        self.replies = Replies(frontier, x, self.gate, self.trouble, self.leasing, self.replicas)
        self.feed = FeedStage(feed, config, x, self.leasing.poke)
        self.upkeep = Upkeep(frontier, config, x, self.leases, self.gate, self.leasing, self.feed, node_id)
        self.presence = Presence(frontier, config, x, self.leases, node_id, node_info or {}, self.leasing.browser_cap)

    def _claim_now(self) -> None:
        self.upkeep.claim_now()

    # -- called from the reactor thread ------------------------------------

    def stop_leasing(self) -> None:
        """Lease nothing more (the worker is closing); does not wait."""
        self._closing = True
        self.exchange.kick()

    def begin_close(self, timeout: float = 5.0) -> None:
        """Stop leasing; return once no more arrivals can appear."""
        with self._cycle_done:
            self._closing = True
            seen = self._cycles
            self.exchange.kick()
            if self.is_alive():
                self._cycle_done.wait_for(lambda: self._cycles > seen + 1 or not self.is_alive(), timeout)

    def finish(self, timeout: float) -> bool:
        """Flush everything queued, then stop the thread. True if all was flushed."""
        self._stop_requested = True
        self.exchange.kick()
        self.join(timeout)
        return not self.is_alive() and not self.gate

    def refresh_policy(self) -> None:
        """Read the crawl's default policy now (before the thread starts)."""
        self.upkeep.refresh_policy(time.monotonic())

    # -- the thread ---------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # pragma: no cover - a bug; keep it visible
            self.exchange.fatal = exc
            logger.exception("streams-sched I/O thread crashed; the worker cannot lease or ack")
            self.exchange.wake()

    def _run(self) -> None:
        deadline: float | None = None
        x = self.exchange
        x.io_thread = threading.get_ident()
        while True:
            if self._stop_requested:
                if deadline is None:
                    deadline = time.monotonic() + STOP_FLUSH_S
                if self._flushed_or_late(deadline):
                    break
            timeout = self._wait_time()
            if timeout > 0:
                x.kicked.wait(timeout)
            x.kicked.clear()
            x.cycle_started = time.monotonic()
            delay = self._one_cycle()
            x.cycle_started = 0.0
            with self._cycle_done:
                self._cycles += 1
                self._cycle_done.notify_all()
            if delay:
                time.sleep(delay)
        self.presence.goodbye()

    def _flushed_or_late(self, deadline: float) -> bool:
        """Stopping: True once everything queued is sent, or the flush ran out of time."""
        x = self.exchange
        if not self.gate and not x.outbox:
            return True
        if time.monotonic() <= deadline:
            return False
        logger.error(
            "streams-sched stopping with %d unsent operations; their requests"
            " come back when their leases expire",
            len(x.outbox) + len(self.gate),
        )
        return True

    def _one_cycle(self) -> float:
        """Run one cycle; return how long to back off before the next."""
        trouble = self.trouble
        trouble.refused = False
        failed = False
        try:
            self._cycle()
            if trouble.reachable():
                self._release_orphans()
        except TRANSIENT as exc:
            trouble.outage(exc)
            failed = True
        except ResponseError as exc:
            # refused outside the pipeline: policy, registry, claim or drain check
            trouble.refuse(IDLE_WORK, exc)
        except Exception:
            logger.exception("streams-sched I/O cycle failed; retrying")
            failed = True
        delay = trouble.delay(failed)
        if not delay:
            trouble.accepted(IDLE_WORK)
        return delay

    def _release_orphans(self) -> None:
        """After a Redis error: hand back leases Redis granted but whose reply was lost."""
        known = set(self.leases.ids)
        known.update((op.entry.site, op.entry.stream, op.entry.id) for op in self.gate.lease_ops())
        sites = {site for site, _, _ in known} | set(self.frontier.leased_sites())
        released = release_orphans(self.frontier, self.node_id, sorted(sites), known)
        if released:
            self.exchange.stats.append(("streams/orphans_released", released))

    def _wait_time(self) -> float:
        x = self.exchange
        if self._stop_requested:
            # writes waiting for a replica are retried on their own schedule: do not spin
            waiting = self.gate.awaiting
            return 0.0 if (x.outbox or (self.gate and not waiting)) else 0.01
        if len(x.outbox) >= OUTBOX_FLUSH:
            return 0.0
        if x.outbox or self.gate:
            return self.config.flush_interval_seconds
        now = time.monotonic()
        if x.feedback:
            self.answers.absorb(x.feedback, now)
        if self.answers.due(now):
            return 0.0
        upkeep = self.upkeep
        deadlines = [self.presence.next_heartbeat, upkeep.next_busy_claim]
        if self.answers.sites:
            deadlines.append(self.answers.next_report)
        if not self._closing and self.leases.total - x.inflight <= x.low_water:
            deadlines.append(self.leasing.next_due(now))
            feed_due = self.feed.next_due()
            if feed_due is not None:
                deadlines.append(feed_due)
            deadlines.append(upkeep.next_claim)
            if upkeep.recovering and self.leases.suspects == 0:
                deadlines.append(now)
            if self.leases.total == 0:
                deadlines.append(upkeep.next_drain_check)
        return min(max(min(deadlines) - now, 0.002), self.config.idle_poll_seconds)

    # -- one cycle ------------------------------------------------------------

    def _cycle(self) -> None:
        now = time.monotonic()
        x = self.exchange
        x.browser_held = self.leases.browser
        if now >= self.upkeep.next_policy:
            self.upkeep.refresh_policy(now)
        gate = self.gate
        ops: list[Op] = []
        outbox = x.outbox
        if outbox:
            x.unsent = True  # taken from the outbox, not yet confirmed
            while outbox:
                ops.append(outbox.popleft())
        end = self.leases.end
        for op in ops:
            if isinstance(op, ENDS_LEASE) and end(op.entry):
                self.upkeep.claim_now()  # a suspect is done: the next expired lease may be taken
        enq, after = gate.plan(ops)
        pipe = self.frontier.client.pipeline(transaction=False)
        sent: list[Sent] = []
        arrived = 0
        try:
            if x.legacy is not None:
                enq = self._legacy_filter(enq)
            planned = self._queue(pipe, sent, enq, after, now)
            replies = pipe.execute(raise_on_error=False) if sent else []
        except BaseException:
            gate.not_sent(enq, after)
            raise
        if sent:
            try:
                arrived = self.replies.apply(sent, replies)
            finally:
                self.replicas.run(now)
        elif gate.awaiting:
            self.replicas.run(now)
        x.unsent = bool(gate)
        if not (self._closing or self._stop_requested):
            self.upkeep.run(now, planned, arrived)
            self.feed.move(now)

    def _queue(self, pipe: Any, sent: list[Sent], enq: list[Entry], after: list[Any], now: float) -> bool:
        """Queue the cycle's commands; True if a shard was asked for leases."""
        # answers first: a site's healthy ones go with its ack
        self.answers.absorb(self.exchange.feedback, now)
        self.writes.queue(pipe, sent, enq, after, now)
        self.writes.queue_feedback(pipe, sent, now, self.gate.held)
        planned = False if (self._closing or self._stop_requested) else self.leasing.queue(pipe, sent, now)
        if not self._stop_requested:
            self.presence.queue(pipe, sent, now)
        return planned

    def _legacy_filter(self, entries: list[Entry]) -> list[Entry]:
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
