"""The worker's I/O thread: every Redis round trip of a worker happens here.

The reactor thread never talks to Redis. The two threads share one
:class:`~streams_sched.worker.exchange.Exchange`: the scheduler puts operations
(ops.py: :class:`Enqueue`, :class:`Ack`, :class:`DeadLetter`,
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
shards' sizes), moves a scrapy-redis feed (feed.py) and re-reads the crawl's
default policy.

Redis unreachable: the cycle is retried with back-off and the unsent
operations wait. Redis refusing a command for good (NOPERM, WRONGTYPE, OOM at
maxmemory): the operation is kept and retried with the same back-off, and each
distinct refusal is logged once (refusals.py; OOM once for all commands) with what
to do about it (server_checks.hint_for), its repeats counted in
``streams/redis_errors``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
from collections import defaultdict
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError, ResponseError

from streams_sched.config import StreamsConfig
from streams_sched.connect.clients import TRANSIENT as CONNECTION_TRANSIENT
from streams_sched.connect.clients import refresh_topology
from streams_sched.connect.server_checks import error_code, hint_for
from streams_sched.errors import EntryError
from streams_sched.frontier.client import (
    Frontier,
    LeasedEntry,
    LeaseReply,
    over_cap_of,
    parse_enqueue,
    parse_shard_lease,
)
from streams_sched.frontier.keys import BROWSER_FIRST_STREAM, shard_of, stream_mask
from streams_sched.politeness.adaptive import FeedbackBatch
from streams_sched.scrapy_redis.legacy import LEGACY_FIELD, legacy_seen
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.exchange import OUTBOX_FLUSH, Exchange
from streams_sched.worker.io.backoff import Backoff
from streams_sched.worker.io.recovery import release_orphans
from streams_sched.worker.io.refusals import Refusals
from streams_sched.worker.io.replicas import ReplicaBook, ReplicaGuard, Verdict, parse_replication
from streams_sched.worker.io.sent import (
    AFTER_STAT,
    HEARTBEAT,
    Enqueued,
    FeedbackSent,
    Leased,
    LeaseOpsSent,
    Sent,
    Waited,
    describe,
)
from streams_sched.worker.leasebook import LeaseBook
from streams_sched.worker.ops import (
    ENDS_LEASE,
    Ack,
    AckGate,
    DeadLetter,
    Enqueue,
    Extend,
    Failed,
    LeaseOp,
    Op,
    Release,
)
from streams_sched.worker.selection import (
    DrainDetector,
    LeasePlan,
    ShardPlan,
    SiteHint,
    empty_lease_backoff,
    plan_shards,
)

if TYPE_CHECKING:
    from streams_sched.scrapy_redis.feed import FeedMover

__all__ = ["Pump"]

logger = logging.getLogger(__name__)

#: Errors that mean "Redis is not answering": retry with back-off.
TRANSIENT = CONNECTION_TRANSIENT

#: enqueues per enqueue.lua call
ENQUEUE_CHUNK = 256
#: seconds before asking a site again whose only backlog is a request that failed a
#: delivery before, while this worker already holds one such (suspect) request
SUSPECT_RETRY_S = 0.25

#: a site's prefetch holds no more than this many seconds of its DOWNLOAD_DELAY, so
#: leases do not age in the buffer
PREFETCH_HORIZON_S = 2.0
#: first and longest wait before trying a failed cycle again
RETRY_INITIAL_S, RETRY_MAX_S = 0.1, 5.0
#: how long finish() keeps sending what is queued before giving up
STOP_FLUSH_S = 30.0
#: a worker keeps hints of this many sites per slot of its capacity at most; past it,
#: hints of sites it holds nothing of and need not wait for are dropped
HINTS_PER_SLOT = 4
#: the first and the fastest interval of drain checks while the crawl looks empty
DRAIN_CHECK_FIRST_S = 0.05
#: sites tried per takeover pass (XAUTOCLAIM of one expired lease)
CLAIM_SITES_PER_PASS = 8
#: feedback.lua replies {a_rate, a_until, observed rate, cut}; cut = 1 if it cut the rate
_FEEDBACK_CUT = 3

#: what a refusal outside the pipeline is called in the log (refusals.py)
IDLE_WORK = "idle-time work (policy, site registry, lease takeover or drain check)"



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
        self.codec = codec
        self.node_id = node_id
        self.node_info = node_info or {}
        prefetch = config.prefetch or concurrency
        self.capacity = concurrency + prefetch
        #: the only state shared with the reactor thread (exchange.py)
        self.x = exchange if exchange is not None else Exchange()
        self.x.low_water = max(1, prefetch // 2)
        self._closing = False
        self._stop_requested = False
        self._cycles = 0
        self._cycle_done = threading.Condition()
        # pump-thread state
        # Prefetch per site: what its downloader slot takes, and with a download delay
        # no more than PREFETCH_HORIZON_S of it, so leases do not age in the buffer.
        site_prefetch = config.prefetch_per_site or per_site_concurrency
        if download_delay > 0 and not config.prefetch_per_site:
            site_prefetch = max(1, min(site_prefetch, math.ceil(PREFETCH_HORIZON_S / download_delay)))
        self.per_site_cap = per_site_concurrency + site_prefetch
        self.browser_cap = config.browser_max if "browser" in config.capabilities else 0
        self.http = "http" in config.capabilities
        self.mask = stream_mask(config.capabilities)
        #: what a takeover may take while this worker holds its cap of browser leases
        self.http_mask = stream_mask(["http"]) if self.http else ""
        self.leases = LeaseBook()
        #: enqueues and lease operations in flight, in the order Redis must see them
        self.gate = AckGate()
        self.recovering = False
        self.claim_cursor = 0
        #: what this worker last learned of the sites it holds or recently asked (bounded:
        #: _prune_hints), never one per site of the crawl
        self.hints: dict[str, SiteHint] = {}
        shards = frontier.shards
        #: per shard, the ready sites it named to this worker (an ordered set), and when to
        #: ask it again while it names none
        self.named: list[dict[str, None]] = [{} for _ in range(shards)]
        self.shard_due: list[float] = [0.0] * shards
        self.shard_streak: list[int] = [0] * shards
        self.shard_cursor = 0
        #: where in a shard's oldest ready sites the next named run starts (lease.lua)
        self.random = random.Random()
        #: ready sites to ask each shard for per call
        self.name_count = max(8, min(256, math.ceil(2 * self.capacity / shards)))
        self.drain = DrainDetector()
        now = time.monotonic()
        self.started = now
        self.waiting_for_seeds_logged = False
        self.next_policy = now
        self.next_heartbeat = now
        self.next_claim = now + min(config.lease_seconds, 5.0)
        self.next_busy_claim = now + config.lease_seconds
        self.next_drain_check = now
        self.drain_interval = DRAIN_CHECK_FIRST_S
        self.retry = Backoff(initial_s=RETRY_INITIAL_S, max_s=RETRY_MAX_S)
        self.outage_since: float | None = None
        self.refusals = Refusals()
        self._refused = False  # a command was refused in this cycle
        #: moves a scrapy-redis feed into the crawl (feed.py)
        self.feed = feed
        self.next_feed = now
        self.answers = FeedbackBatch(config.feedback_interval_seconds)
        #: barriers that hold acks until the enqueues before them are on a replica
        self.replicas = ReplicaGuard(frontier.client, ReplicaBook(config.min_replicas), config.replica_wait_ms, node_id)
        #: primary -> the key its next barrier writes, and when it may be tried again
        self.sync_keys: dict[str, str] = {}
        self.next_barrier: dict[str, float] = {}
        #: enqueue calls Redis confirmed in this cycle (each registers its sites too)
        self.confirmed: list[Enqueued] = []
        #: this cycle's WAIT reply and INFO replication, sent right after its writes (not
        #: on a cluster, whose pipeline spans several servers)
        self.inline_wait: list[Any] = []
        self.next_topology = now
        #: feedback.lua's adaptive flag, decrease, increase, floor and forget ms (the config is frozen)
        self.feedback_params = (
            "1" if config.adaptive else "0",
            repr(config.adaptive_decrease),
            repr(config.adaptive_increase),
            repr(config.adaptive_min_rate),
            int(config.adaptive_forget_seconds * 1000),
        )

    # -- called from the reactor thread ------------------------------------

    def stop_leasing(self) -> None:
        """Lease nothing more (the worker is closing); does not wait."""
        self._closing = True
        self.x.kick()

    def begin_close(self, timeout: float = 5.0) -> None:
        """Stop leasing; return once no more arrivals can appear."""
        with self._cycle_done:
            self._closing = True
            seen = self._cycles
            self.x.kick()
            if self.is_alive():
                self._cycle_done.wait_for(lambda: self._cycles > seen + 1 or not self.is_alive(), timeout)

    def finish(self, timeout: float) -> bool:
        """Flush everything queued, then stop the thread. True if all was flushed."""
        self._stop_requested = True
        self.x.kick()
        self.join(timeout)
        return not self.is_alive() and not self.gate

    # -- the thread ---------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # pragma: no cover - a bug; keep it visible
            self.x.fatal = exc
            logger.exception("streams-sched I/O thread crashed; the worker cannot lease or ack")
            self.x.wake()

    def _run(self) -> None:
        deadline: float | None = None
        x = self.x
        while True:
            if self._stop_requested:
                if deadline is None:
                    deadline = time.monotonic() + STOP_FLUSH_S
                if not self.gate and not x.outbox:
                    break
                if time.monotonic() > deadline:
                    logger.error(
                        "streams-sched stopping with %d unsent operations; their requests"
                        " come back when their leases expire",
                        len(x.outbox) + len(self.gate),
                    )
                    break
            timeout = self._wait_time()
            if timeout > 0:
                x.kicked.wait(timeout)
            x.kicked.clear()
            delay = 0.0
            self._refused = False
            try:
                self._cycle()
                if self.outage_since is not None:
                    logger.warning(
                        "Redis is reachable again after %.1fs", time.monotonic() - self.outage_since
                    )
                    self._release_orphans()
                    self.outage_since = None
            except TRANSIENT as exc:
                self._on_outage(exc)
                delay = self.retry.next()
            except ResponseError as exc:
                # refused outside the pipeline: policy, registry, claim or drain check
                self._refuse(IDLE_WORK, exc)
            except Exception:
                logger.exception("streams-sched I/O cycle failed; retrying")
                delay = self.retry.next()
            if self._refused:
                delay = self.retry.next()
            elif not delay:
                self.retry.reset()
                if self.refusals.counts:
                    self._accepted(IDLE_WORK)
            with self._cycle_done:
                self._cycles += 1
                self._cycle_done.notify_all()
            if delay:
                time.sleep(delay)
        self._goodbye()

    def _release_orphans(self) -> None:
        """After a Redis error: hand back leases Redis granted but whose reply was lost."""
        known = set(self.leases.ids)
        known.update((op.entry.site, op.entry.stream, op.entry.id) for op in self.gate.lease_ops())
        sites = {site for site, _, _ in known} | set(self.frontier.leased_sites())
        released = release_orphans(self.frontier, self.node_id, sorted(sites), known)
        if released:
            self.x.stats.append(("streams/orphans_released", released))

    def _wake_if_starved(self) -> None:
        """New requests arrived: wake the engine only if it found nothing last time it
        asked (a busy engine asks again by itself after each download, and every wake
        costs the reactor a self-pipe wake-up and the GIL)."""
        x = self.x
        if x.starved:
            x.starved = False
            x.wake()

    def _on_outage(self, exc: BaseException) -> None:
        if self.outage_since is None:
            self.outage_since = time.monotonic()
            logger.warning("Redis unreachable (%s); retrying with back-off", exc)
        self.x.stats.append(("streams/redis_errors", 1))
        self._refresh_topology()

    def _refresh_topology(self) -> None:
        """On a cluster, read the slot map again from any node that answers (at most once
        a second): a failed-over master's slots move to its replica, and a command that
        bypasses the cluster client (a node's own pipeline) would otherwise retry the dead
        address for ever."""
        now = time.monotonic()
        if not self.replicas.cluster or now < self.next_topology:
            return
        self.next_topology = now + 1.0
        refresh_topology(self.frontier.client)

    def _replicate(self, now: float) -> None:
        """Hold the acks until this cycle's confirmed writes are on a replica of each
        primary that took them (replicas.py); run the barriers that are due."""
        guard, gate, f = self.replicas, self.gate, self.frontier
        confirmed, self.confirmed = self.confirmed, []
        inline, self.inline_wait = self.inline_wait, []
        if len(inline) == 2 and not isinstance(inline[1], Exception) and "" not in gate.awaiting:
            # WAIT and INFO came back on the connection that carried the writes
            acked = None if isinstance(inline[0], Exception) else int(inline[0])
            verdict = guard.book.judge("", acked, parse_replication(inline[1]), now)
            if verdict is Verdict.PASS:
                confirmed = []
            elif verdict is Verdict.RESEND:
                self._send_again(confirmed)
                self._resent("", sum(len(c.chunk) for c in confirmed))
                confirmed = []
            else:
                self.next_barrier[""] = now + self.config.replica_wait_ms / 1000.0
        try:
            for cmd in confirmed:
                key = f.site(cmd.site).sync
                primary = guard.primary_of(key)
                if primary in gate.awaiting or guard.required(primary, now) != 0:
                    gate.await_replicas(primary, cmd.chunk)
                    self.sync_keys.setdefault(primary, key)
        except Exception:
            # cannot tell where they went: send them again (dedupe makes that safe)
            self._send_again(confirmed)
            raise
        for primary in list(gate.awaiting):
            if now < self.next_barrier.get(primary, 0.0):
                continue
            verdict = guard.barrier(primary, self.sync_keys.get(primary, f.keys.sync), now)
            if verdict is Verdict.PASS:
                gate.replicated(primary)
                self.sync_keys.pop(primary, None)
                self.next_barrier.pop(primary, None)
            elif verdict is Verdict.HOLD:
                self.x.stats.append(("streams/replica_waits", 1))
                self.next_barrier[primary] = now + self.config.replica_wait_ms / 1000.0
            else:
                self._resend(primary)
        for primary in guard.book.take_changed():
            # replaced since it confirmed them: they may be gone
            self._resend(primary)

    def _send_again(self, confirmed: list[Enqueued]) -> None:
        """This cycle's confirmed enqueues go out again next cycle."""
        for cmd in confirmed:
            self.gate.unconfirmed += cmd.chunk

    def _resend(self, primary: str) -> None:
        """What ``primary`` confirmed may be gone: send it again (enqueue.lua registers
        the sites again with it)."""
        gate = self.gate
        chunk = gate.resend(primary)
        self.sync_keys.pop(primary, None)
        self.next_barrier.pop(primary, None)
        self._resent(primary, len(chunk))

    def _resent(self, primary: str, n: int) -> None:
        self.x.stats.append(("streams/replica_resends", n))
        if n:
            logger.warning(
                "Redis primary %s may not keep the %d requests it confirmed (it is gone, restarted"
                " or no longer the primary): sending them again", primary or "of this crawl", n,
            )
        # what this worker remembers sending may not have arrived either
        self.x.seen_epoch += 1
        self._refresh_topology()

    def _refuse(self, what: str, exc: BaseException, *, back_off: bool = True) -> None:
        """Redis refused a command for good: count it, log it the first time, and (for
        what must be sent again: enqueues, acks) back off the next cycle."""
        self._refused = self._refused or back_off
        self.x.stats.append(("streams/redis_errors", 1))
        if self.refusals.note(what, exc):
            hint = hint_for(str(exc))
            logger.error(
                "Redis refused the %s: %s. Retrying with back-off; not logged again until it"
                " clears (streams/redis_errors counts every refusal)%s",
                what, str(exc).rstrip("."), f". {hint[0].upper()}{hint[1:]}" if hint else "",
            )

    def _accepted(self, what: str) -> None:
        for error, n in self.refusals.accepted(what):
            if error_code(error) == "OOM":
                logger.warning(
                    "Redis accepts writes again (no OOM for %gs), after refusing %d commands at maxmemory",
                    self.refusals.quiet_s, n,
                )
            else:
                logger.warning("Redis accepts the %s again, after refusing it %d times (%s)", what, n, error)

    def _wait_time(self) -> float:
        x = self.x
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
        poll = self.config.idle_poll_seconds
        deadlines = [self.next_heartbeat, self.next_busy_claim]
        if self.answers.sites:
            deadlines.append(self.answers.next_report)
        if not self._closing and self.leases.total - x.inflight <= x.low_water:
            if any(self.named):
                deadlines.append(now)
            deadlines.append(min(self.shard_due))
            if self.feed is not None:
                deadlines.append(self.next_feed)
            deadlines.append(self.next_claim)
            if self.recovering and self.leases.suspects == 0:
                deadlines.append(now)
            if self.leases.total == 0:
                deadlines.append(self.next_drain_check)
        return min(max(min(deadlines) - now, 0.002), poll)

    # -- one cycle ------------------------------------------------------------

    def _cycle(self) -> None:
        now = time.monotonic()
        f = self.frontier
        self.x.browser_held = self.leases.browser
        if now >= self.next_policy:
            self._refresh_policy(now)
        x = self.x
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
                self.next_claim = now  # a suspect is done: the next expired lease may be taken
        enq, after = gate.plan(ops)

        pipe = f.client.pipeline(transaction=False)
        sent: list[Sent] = []
        arrived = 0
        try:
            if x.legacy is not None:
                enq = self._legacy_filter(enq)
            # answers first: a site's healthy ones go with its ack (_queue_writes)
            self.answers.absorb(x.feedback, now)
            self._queue_writes(pipe, sent, enq, after, now)
            self._queue_feedback(pipe, sent, now)
            planned = self._queue_leases(pipe, sent, now)
            self._queue_heartbeat(pipe, sent, now)
            replies = pipe.execute(raise_on_error=False) if sent else []
        except BaseException:
            gate.not_sent(enq, after)
            raise
        if sent:
            try:
                arrived = self._handle(sent, replies)
            finally:
                self._replicate(now)
        elif gate.awaiting:
            self._replicate(now)
        x.unsent = bool(gate)
        self._maintenance(now, planned, arrived)
        if self.feed is not None and now >= self.next_feed and not (self._closing or self._stop_requested):
            self._move_feed(now)

    def _feed_pending(self) -> int:
        assert self.feed is not None
        try:
            return self.feed.pending()
        except ResponseError as exc:
            self._feed_refused(exc)
            return 0

    def _feed_refused(self, exc: Exception) -> None:
        """Redis refused a feed command (an ACL without the feed key, a key of another
        type): say so once and stop moving the feed; the crawl goes on."""
        assert self.feed is not None
        logger.error(
            "streams-sched stops moving the feed %s: Redis refused (%s). Give the worker's ACL user"
            " the feed key, fix REDIS_START_URLS_AS_SET / REDIS_START_URLS_AS_ZSET, or set"
            " STREAMS_FEED_KEY = \"\" to turn the feed off",
            self.feed.key, exc,
        )
        self.x.stats.append(("streams/feed_refused", 1))
        self.feed = None

    def _legacy_filter(self, ops: list[Enqueue]) -> list[Enqueue]:
        """Drop requests a migrated scrapy-redis crawl already saw (one SMISMEMBER).
        Enqueues carry scrapy-redis's fingerprint (``legacy_fp``) until they are checked."""
        checked = [op for op in ops if op.legacy_fp]
        legacy = self.x.legacy
        if not checked or legacy is None:
            return ops
        seen = legacy_seen(self.frontier.client, legacy, [op.legacy_fp for op in checked if op.legacy_fp])
        drop = {id(op) for op, hit in zip(checked, seen, strict=True) if hit}
        if drop:
            # done as far as the scheduler's drain check goes: they will never be sent
            self.x.enqueues_done += len(drop)
            self.x.stats.append(("streams/legacy_duplicates", len(drop)))
            self.x.stats.append(("dupefilter/filtered", len(drop)))
        return [Enqueue(op.site, op.out) if op.legacy_fp else op for op in ops if id(op) not in drop]

    def _move_feed(self, now: float) -> None:
        """Move one batch of the scrapy-redis feed into the crawl (feed.py says how
        nothing is lost); come back at once while the batches are full."""
        feed = self.feed
        assert feed is not None
        self.next_feed = now + self.config.feed_poll_seconds
        try:
            result = feed.move()
        except ResponseError as exc:
            self._feed_refused(exc)
            return
        if result.read >= feed.batch or (result.length and not result.read):
            # more to move, or another worker holds the lock: look again soon
            self.next_feed = now + (0.0 if result.read else 0.2)
        if result.read:
            self.x.stats.append(("streams/feed_read", result.read))
        if result.added:
            self.x.stats.append(("streams/feed_added", result.added))
            self.x.stats.append(("streams/enqueued", result.added))
            self.x.drained = False
            for site in result.sites:
                self._poke(site)
        if result.duplicates:
            self.x.stats.append(("streams/feed_duplicates", result.duplicates))
        if result.dead:
            self.x.stats.append(("streams/feed_dead_lettered", result.dead))

    def _queue_writes(
        self, pipe: Any, sent: list[Sent], enq: list[Enqueue], after: list[LeaseOp], now: float
    ) -> None:
        f = self.frontier
        if enq:
            self._queue_enqueues(pipe, sent, enq)
        if enq and not self.replicas.cluster:
            # one connection carries the whole pipeline: WAIT right here covers its writes
            needed = self.replicas.required("", now)
            if needed != 0:
                pipe.execute_command("WAIT", needed or 0, self.config.replica_wait_ms)
                pipe.info("replication")
                sent += (Waited("wait"), Waited("info"))
        if after:
            groups: dict[tuple[type, str], list[LeaseOp]] = defaultdict(list)
            acks: dict[int, dict[str, list[LeaseOp]]] = defaultdict(lambda: defaultdict(list))
            shards = f.shards
            for lease_op in after:
                site = lease_op.entry.site
                if type(lease_op) is Ack:
                    acks[shard_of(site, shards)][site].append(lease_op)
                else:
                    groups[(type(lease_op), site)].append(lease_op)
            for by_site in acks.values():
                self._queue_acks(pipe, sent, by_site, now)
            for (kind, site), group in groups.items():
                if kind is DeadLetter:
                    dead = [(d.entry.stream, d.entry.id, d.reason) for d in group if isinstance(d, DeadLetter)]
                    f.dead_letter(site, self.node_id, dead, pipe)
                elif kind is Release:
                    f.release(site, self.node_id, [(r.entry.stream, r.entry.id) for r in group], pipe)
                elif kind is Failed:
                    failed = [(d.entry.stream, d.entry.id, d.reason) for d in group if isinstance(d, Failed)]
                    f.fail(site, self.node_id, self.config.max_deliveries, failed, pipe)
                else:
                    for extend in group:
                        f.extend(site, self.node_id, extend.entry.stream, extend.entry.id, pipe)
                sent.append(LeaseOpsSent(kind, group))

    def _queue_enqueues(self, pipe: Any, sent: list[Sent], enq: list[Enqueue]) -> None:
        """One enqueue.lua call per shard for the sites of that shard (up to ENQUEUE_CHUNK
        requests a call): a round of children over many sites costs one call per shard."""
        f = self.frontier
        shards = f.shards
        by_shard: dict[int, dict[str, list[Enqueue]]] = defaultdict(lambda: defaultdict(list))
        for op in enq:
            by_shard[shard_of(op.site, shards)][op.site].append(op)
        for by_site in by_shard.values():
            parts: list[tuple[str, list[Enqueue]]] = []
            size = 0
            for site, site_ops in by_site.items():
                for i in range(0, len(site_ops), ENQUEUE_CHUNK):
                    chunk = site_ops[i : i + ENQUEUE_CHUNK]
                    if parts and size + len(chunk) > ENQUEUE_CHUNK:
                        self._send_enqueues(pipe, sent, parts)
                        parts, size = [], 0
                    parts.append((site, chunk))
                    size += len(chunk)
            if parts:
                self._send_enqueues(pipe, sent, parts)

    def _send_enqueues(self, pipe: Any, sent: list[Sent], parts: list[tuple[str, list[Enqueue]]]) -> None:
        self.frontier.enqueue_shard([(site, [op.out for op in chunk]) for site, chunk in parts], pipe)
        sent.append(Enqueued(parts[0][0], [op for _, chunk in parts for op in chunk], tuple(parts)))

    def _queue_acks(self, pipe: Any, sent: list[Sent], by_site: dict[str, list[LeaseOp]], now: float) -> None:
        """One ack.lua call for the acks of the sites of one shard, each site's healthy
        answers riding along."""
        calls = []
        answered = []
        group: list[LeaseOp] = []
        for site, ops in by_site.items():
            last = site not in self.leases.by_site
            ok = self.answers.take_healthy(site, now, last)
            if ok and last and self._finished(site):
                # healthy answers of a site with nothing left and no rate feed nothing but
                # its answer window, which expires unread: not worth three commands a page
                ok = 0
            calls.append((site, [(a.entry.stream, a.entry.id) for a in ops], (ok, self.feedback_params) if ok else None))
            if ok:
                answered.append((site, ok))
            group += ops
        self.frontier.ack_shard(calls, pipe)
        sent.append(LeaseOpsSent(Ack, group, tuple(answered)))

    def _queue_feedback(self, pipe: Any, sent: list[Sent], now: float) -> None:
        """One feedback.lua call per site with answers to report: at once after a 429, 503,
        timeout or robots.txt, otherwise every STREAMS_FEEDBACK_INTERVAL_SECONDS. Healthy
        answers of a site this worker holds leases of wait for its ack instead."""
        if not self.answers.due(now):
            return
        for site, outcome, robots in self.answers.take(now, self.leases.by_site):
            self.frontier.feedback(site, outcome, robots, self.feedback_params, pipe)
            sent.append(FeedbackSent(site))

    def _queue_leases(self, pipe: Any, sent: list[Sent], now: float) -> bool:
        """Queue lease calls, one per shard that named sites or is due to be asked;
        True if any shard was asked."""
        if self._closing or self._stop_requested:
            return False
        book = self.leases
        x = self.x
        ready = book.total - x.inflight
        room = self.capacity - book.total
        if room <= 0 or (ready > x.low_water and room < x.low_water):
            return False
        browser_room = max(0, self.browser_cap - book.browser)
        plans = plan_shards(
            now,
            self.named,
            self.shard_due,
            self.hints,
            book.by_site,
            total_room=room,
            per_site_cap=self.per_site_cap,
            browser_room=browser_room,
            http=self.http,
            held_browser=book.browser_by_site,
            name=self.name_count,
            start=self.shard_cursor,
        )
        self.shard_cursor = (self.shard_cursor + 1) % len(self.named)
        self._drop_unleasable(now, {p.shard for p in plans})
        weights = self.config.band_ratio
        suspects_ok = 1 if book.suspects == 0 else 0
        tasks = ("h" if self.http else "") + ("b" if browser_room > 0 else "")
        for plan in plans:
            named = self.named[plan.shard]
            for site_plan in plan.sites:
                named.pop(site_plan.site, None)
            self.frontier.lease_shard(
                plan.shard,
                self.node_id,
                [(p.site, p.total, p.max_http, p.max_browser) for p in plan.sites],
                weights,
                name=plan.name if tasks else 0,
                spread=self.random.getrandbits(31),
                tasks=tasks,
                paused_wait_ms=int(self.config.idle_poll_seconds * 1000),
                max_suspects=suspects_ok,
                budget=plan.budget,
                pipe=pipe,
            )
            suspects_ok = 0
            sent.append(Leased(plan))
        return bool(plans)

    def _queue_heartbeat(self, pipe: Any, sent: list[Sent], now: float) -> None:
        if now < self.next_heartbeat or self._stop_requested:
            return
        self.next_heartbeat = now + self.config.heartbeat_seconds
        info = self._node_record("online")
        self.frontier.record_node(self.node_id, info, pipe)
        self.frontier.publish({"event": "heartbeat", **info}, pipe)
        sent += (HEARTBEAT, HEARTBEAT)  # record_node, publish

    def _node_record(self, state: str) -> dict[str, Any]:
        return {
            **self.node_info,
            "node": self.node_id,
            "crawl": self.frontier.crawl,
            "state": state,
            "last_seen": time.time(),
            "held": self.leases.total,
            "local": self.x.local_count(),
            # browser leases held against this worker's cap, and its renders so far
            "browser": self.leases.browser,
            "browser_max": self.browser_cap,
            "renders": self.x.renders,
            "render_s": round(self.x.render_seconds, 3),
            "heartbeat_s": self.config.heartbeat_seconds,
        }

    # -- replies --------------------------------------------------------------

    def _handle(self, sent: list[Sent], replies: list[Any]) -> int:
        """Apply the replies of one pipeline; return how many requests arrived."""
        arrived = 0
        confirmed = False
        noscript = False
        transient: BaseException | None = None
        x = self.x
        for cmd, reply in zip(sent, replies, strict=True):
            if isinstance(reply, Exception):
                if isinstance(reply, NoScriptError):
                    noscript = True
                elif isinstance(reply, TRANSIENT):
                    transient = reply
                else:
                    self._refuse(describe(cmd), reply, back_off=isinstance(cmd, (Enqueued, LeaseOpsSent)))
                    if isinstance(cmd, Leased):
                        self._lease_refused(cmd.plan)
                if isinstance(cmd, Enqueued):
                    self.gate.enqueue_failed(cmd.chunk)
                elif isinstance(cmd, LeaseOpsSent):
                    self.gate.after_failed(cmd.group)
                    for site, ok in cmd.answered:
                        self.x.feedback.append((site, "ok", ok))
                continue
            if self.refusals.counts:
                self._accepted(describe(cmd))
            if isinstance(cmd, Enqueued):
                for (site, chunk), part in zip(cmd.parts, reply, strict=True):
                    self._on_enqueued(site, chunk, part)
                self.confirmed.append(cmd)
                confirmed = True
            elif isinstance(cmd, LeaseOpsSent):
                if cmd.kind is Ack:
                    n = sum(int(v) for v in reply)
                elif cmd.kind is Failed:
                    n = int(reply[0])
                    if int(reply[1]):
                        x.stats.append(("streams/dead_lettered", int(reply[1])))
                else:
                    n = len(cmd.group) if isinstance(reply, list) or cmd.kind is Extend else int(reply)
                x.stats.append((AFTER_STAT[cmd.kind], n))
            elif isinstance(cmd, Leased):
                arrived += self._on_leased(cmd.plan, reply)
            elif isinstance(cmd, Waited):
                self.inline_wait.append(reply)
            elif isinstance(cmd, FeedbackSent) and int(reply[_FEEDBACK_CUT]):
                x.stats.append(("streams/backoffs", 1))
                hint = self.hints.get(cmd.site)
                if hint is not None:
                    hint.not_before = 0.0  # ask again now: the lease reply carries the new rate
        if noscript:
            self.frontier.load_scripts()
        if arrived:
            x.drained = False
        if arrived or confirmed:
            self._wake_if_starved()
        if transient is not None:
            raise transient
        return arrived

    def _lease_refused(self, plan: ShardPlan) -> None:
        """Leave a shard whose lease call Redis refused alone for a while (as if empty)."""
        n = plan.shard
        self.shard_streak[n] += 1
        self.shard_due[n] = time.monotonic() + empty_lease_backoff(self.shard_streak[n], self.config.idle_poll_seconds)

    def _finished(self, site: str) -> bool:
        """The site's last lease reply showed no backlog, no delayed request and no rate."""
        hint = self.hints.get(site)
        return (
            hint is not None and hint.backlog_http == 0 and hint.backlog_browser <= 0
            and hint.delayed == 0 and hint.rate == 0
        )

    def _drop_unleasable(self, now: float, asked: set[int]) -> None:
        """Forget named sites this worker cannot lease now (it holds its cap of them, or
        must wait), in shards it is not asking: they stay in Redis's ready index and come
        back named later, and a shard's list never fills with sites it skips."""
        held, cap, hints = self.leases.by_site, self.per_site_cap, self.hints
        for n, named in enumerate(self.named):
            if n in asked or not named:
                continue
            for site in [s for s in named if held.get(s, 0) >= cap or (s in hints and hints[s].not_before > now)]:
                del named[site]

    def _poke(self, site: str) -> None:
        """``site`` got work: ask its shard for ready sites at once."""
        n = shard_of(site, len(self.named))
        self.shard_due[n] = 0.0
        self.shard_streak[n] = 0
        hint = self.hints.get(site)
        if hint is not None:
            hint.backlog_http = hint.backlog_browser = -1
            hint.not_before = 0.0

    def _prune_hints(self, now: float) -> None:
        """Forget sites this worker holds nothing of and need not wait for: what it keeps
        follows the sites it holds, not the crawl."""
        if len(self.hints) <= HINTS_PER_SLOT * self.capacity:
            return
        held = self.leases.by_site
        self.hints = {s: h for s, h in self.hints.items() if s in held or h.not_before > now}

    def _on_enqueued(self, site: str, chunk: list[Enqueue], reply: Any) -> None:
        x = self.x
        x.enqueues_done += len(chunk)
        added, dups, delayed, _flags = parse_enqueue(reply)
        st = x.stats
        if added:
            st.append(("streams/enqueued", added))
            self._poke(site)
            x.drained = False
        if dups:
            st.append(("dupefilter/filtered", dups))
            st.append(("streams/duplicates_remote", dups))
        if delayed:
            st.append(("streams/delayed", delayed))
        over = over_cap_of(reply)
        if over:
            st.append(("streams/over_cap", over))

    def _on_leased(self, plan: ShardPlan, reply: Any) -> int:
        sites = [p.site for p in plan.sites]
        r = parse_shard_lease(sites, reply)
        now = time.monotonic()
        arrived = 0
        named = self.named[plan.shard]
        for site_plan, site_reply in zip(plan.sites, r.sites, strict=True):
            if site_reply is None:
                named[site_plan.site] = None  # the call's budget ran out first: next time
                continue
            arrived += self._on_site_leased(site_plan, site_reply, now)
        for site in r.named:
            named[site] = None
        n = plan.shard
        if named or arrived:
            self.shard_streak[n] = 0
            self.shard_due[n] = now
        else:
            self.shard_streak[n] += 1
            self.shard_due[n] = now + empty_lease_backoff(
                self.shard_streak[n], self.config.idle_poll_seconds, r.next_in_ms
            )
        self._prune_hints(now)
        return arrived

    def _on_site_leased(self, plan: LeasePlan, r: LeaseReply, now: float) -> int:
        site = plan.site
        n = len(r.entries)
        hint = self.hints.get(site)
        if hint is None:
            if not n and r.wait_ms == 0 and not r.deferred:
                return 0  # nothing held, nothing to wait for: nothing to remember
            hint = self.hints[site] = SiteHint()
        # lease.lua only looks at the task types it was asked for
        if plan.max_http > 0:
            hint.backlog_http = r.backlog_http
        if plan.max_browser > 0:
            hint.backlog_browser = r.backlog_browser
        hint.delayed = r.delayed
        hint.weight = r.weight if r.weight > 0 else 1.0
        if self.x.weights.get(site) != hint.weight:
            self.x.weights[site] = hint.weight
        hint.rate = r.rate
        hint.max_browser = r.max_browser
        if n:
            hint.not_before = 0.0
            self.x.stats.append(("streams/leased", n))
        elif r.deferred:
            # only requests that failed before, and this worker already holds one
            hint.not_before = now + SUSPECT_RETRY_S
        elif r.wait_ms == -1:
            hint.not_before = now + self.config.idle_poll_seconds
        elif r.wait_ms > 0:
            hint.not_before = now + r.wait_ms / 1000.0
        return self._accept(r.entries)

    def _accept(self, entries: list[LeasedEntry]) -> int:
        """Decode leased entries; good ones go to the reactor, bad ones to the dead-letter stream."""
        arrived = 0
        decode = self.codec.decode
        now = time.monotonic()
        take = self.leases.take
        arrivals = self.x.arrivals
        browser = 0
        for e in entries:
            e.leased_at = now
            take(e)
            try:
                if e.payload is None:
                    raise EntryError("entry has no payload field r")
                request = decode(e.payload)
            except EntryError as exc:
                logger.error(
                    "dead-lettering entry %s of site %s: %s", e.id.decode(), e.site, exc
                )
                if self.leases.end(e):
                    self.next_claim = now
                self.gate.own_dead.append(DeadLetter(e, str(exc)))
                continue
            e.payload = None
            if e.stream >= BROWSER_FIRST_STREAM:
                browser += 1
                if "task_type" not in request.meta:
                    request.meta["task_type"] = "browser"
            arrivals.append((request, e))
            arrived += 1
        if browser:
            self.x.stats.append(("streams/leased_browser", browser))
        return arrived

    # -- idle work: registry, reclaim, drain ------------------------------------

    def refresh_policy(self) -> None:
        """Read the crawl's default policy now (before the thread starts)."""
        self._refresh_policy(time.monotonic())

    def _refresh_policy(self, now: float) -> None:
        """Re-read the crawl's default policy ("*"), so a live change reaches this worker."""
        self.next_policy = now + self.config.policy_refresh_seconds
        meta = self.frontier.crawl_meta()
        self.frontier.use_crawl_defaults(meta)
        self.x.legacy = meta.get(LEGACY_FIELD) or None

    def _maintenance(self, now: float, planned: bool, arrived: int) -> None:
        """Take over expired leases when there is nothing else to do (and now and then
        even when busy), and check whether the crawl is drained when idle."""
        if self._closing or self._stop_requested:
            return
        room = self.capacity - self.leases.total
        wants_claim = (not planned and now >= self.next_claim) or now >= self.next_busy_claim or self.recovering
        if room > 0 and self.leases.suspects == 0 and wants_claim:
            self._claim_expired(now)
        local_idle = self.leases.total == 0 and not self.x.outbox and not self.gate
        if not local_idle or arrived:
            self.drain.reset()
            self.drain_interval = DRAIN_CHECK_FIRST_S
            self.next_drain_check = now
        elif not planned and now >= self.next_drain_check:
            self._check_drain(now)

    def _claim_expired(self, now: float) -> None:
        """Take over ONE expired lease (XAUTOCLAIM), trying the sites with pending entries in turn.

        One at a time: an expired lease may be the request that killed its
        worker, and a worker holding two such requests could take an innocent
        one down with the poison one. While there are more, the next is taken
        as soon as this one is finished.
        """
        self.next_claim = now + min(self.config.lease_seconds / 4, 2.0)
        self.next_busy_claim = now + self.config.lease_seconds
        f = self.frontier
        self.recovering = False
        mask = self.mask
        if self.browser_cap and self.leases.browser >= self.browser_cap:
            # a browser lease taken over counts against the cap like a leased one
            mask = self.http_mask
            if not mask:
                return
        sites = f.expired_sites(self.config.lease_ms, CLAIM_SITES_PER_PASS)
        if not sites:
            return
        for i in range(min(len(sites), CLAIM_SITES_PER_PASS)):
            site = sites[(self.claim_cursor + i) % len(sites)]
            try:
                reply = f.claim(
                    site, self.node_id, self.config.lease_ms, 1, self.config.max_deliveries, "claim", mask
                )
            except NoScriptError:
                f.load_scripts()
                return
            taken, dead, entries = reply
            if dead:
                logger.warning(
                    "moved %d entries of site %s to the dead-letter stream (STREAMS_MAX_DELIVERIES=%d)",
                    dead, site, self.config.max_deliveries,
                )
                self.x.stats.append(("streams/dead_lettered", dead))
            if taken:
                self.claim_cursor = (self.claim_cursor + i) % len(sites)
                logger.info("took over an expired lease of site %s (%s)", site, entries[0].id.decode())
                self.x.stats.append(("streams/reclaimed", taken))
                self.recovering = True
                if self._accept(entries):
                    self.x.drained = False
                    self._wake_if_starved()
                return
            if dead:
                self.recovering = True
                return

    def _check_drain(self, now: float) -> None:
        f = self.frontier
        if self.feed is not None and self._feed_pending():
            # the feed still has entries: not drained, and move them now
            self.drain.reset()
            self.next_feed = now
            self.next_drain_check = now + self.config.feed_poll_seconds
            return
        counts = f.shard_counts()
        if (
            not any(c[3] for c in counts)
            and not self.x.started_locally
            and now - self.started < self.config.empty_crawl_wait_seconds
        ):
            # a crawl that never had a request is not drained: it has not started yet
            if not self.waiting_for_seeds_logged:
                logger.info(
                    "crawl %s has no requests yet; waiting up to %gs for seeds"
                    " (STREAMS_EMPTY_CRAWL_WAIT_SECONDS; seed with `streams-sched push`)",
                    f.crawl, self.config.empty_crawl_wait_seconds,
                )
                self.waiting_for_seeds_logged = True
            self.drain.reset()
            self.next_drain_check = now + min(0.5, self.config.idle_poll_seconds)
            return
        # one entry per shard: a site with work is in its shard's ready or leased index
        snapshot = {
            str(n): (ready_http == 0 and ready_browser == 0 and leased == 0, enqueued)
            for n, (ready_http, ready_browser, leased, enqueued) in enumerate(counts)
        }
        for n, (ready_http, ready_browser, _, _) in enumerate(counts):
            if (ready_http and self.http) or (ready_browser and self.browser_cap > 0):
                self.shard_due[n] = min(self.shard_due[n], now)
        drained = self.drain.observe(snapshot)
        if drained != self.x.drained:
            self.x.drained = drained
            if drained:
                logger.info("crawl %s is drained: no backlog, lease or delayed request left", f.crawl)
            self.x.wake()
        # Confirm an empty-looking crawl quickly; otherwise look less and less often.
        if not drained and all(empty for empty, _ in snapshot.values()):
            self.drain_interval = DRAIN_CHECK_FIRST_S
        else:
            self.drain_interval = min(max(self.drain_interval * 2, 0.1), self.config.idle_poll_seconds)
        self.next_drain_check = time.monotonic() + self.drain_interval

    def _goodbye(self) -> None:
        try:
            info = self._node_record("offline")
            pipe = self.frontier.client.pipeline(transaction=False)
            self.frontier.record_node(self.node_id, info, pipe)
            self.frontier.publish({"event": "node_offline", **info}, pipe)
            pipe.execute()
        except Exception as exc:
            logger.warning("could not publish node_offline: %s", exc)


def make_node_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{os.urandom(3).hex()}"
