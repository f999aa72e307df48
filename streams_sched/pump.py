"""The worker's I/O thread: every Redis round trip of a worker happens here.

The reactor thread never talks to Redis. It appends operations to
:attr:`Pump.outbox` (enqueue, ack, dead-letter, release, extend) and takes
prefetched requests from :attr:`Pump.arrivals`; both are ``deque``s, whose
``append`` and ``popleft`` are atomic. The pump thread batches everything of
one cycle into one pipeline:

    registrations, enqueues, the acks of the previous cycle, leases, heartbeat

Acks ride one cycle behind the enqueues: an ack is sent only once every
enqueue queued before it has been confirmed by Redis, so a request's
follow-up requests are in Redis before its ack, even on Redis Cluster where
one pipeline spans several servers. A failed enqueue is retried (with
back-off) and holds back every later ack until it succeeds.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError, ResponseError

from .backoff import Backoff
from .codec import RequestCodec
from .config import StreamsConfig
from .connection import TRANSIENT as CONNECTION_TRANSIENT
from .errors import EntryError
from .frontier import Frontier, LeasedEntry, over_cap_of, parse_enqueue, parse_lease
from .keys import BANDS, BROWSER_FIRST_STREAM
from .legacy import LEGACY_FIELD, legacy_seen
from .politeness import FeedbackBatch
from .recovery import LeaseKey, release_orphans
from .selection import DrainDetector, SiteHint, empty_lease_backoff, plan_leases

if TYPE_CHECKING:
    from .feed import FeedMover

__all__ = ["Pump"]

logger = logging.getLogger(__name__)

#: Errors that mean "Redis is not answering": retry with back-off.
TRANSIENT = CONNECTION_TRANSIENT

ENQUEUE_CHUNK = 256


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
        wake: Callable[[], None] = lambda: None,
        node_info: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(name=f"streams-sched-pump-{node_id}", daemon=True)
        self.frontier = frontier
        self.config = config
        self.codec = codec
        self.node_id = node_id
        self.wake = wake
        self.node_info = node_info or {}
        # shared with the reactor thread
        self.outbox: deque[tuple[Any, ...]] = deque()
        self.arrivals: deque[tuple[Any, LeasedEntry]] = deque()
        self.stats: deque[tuple[str, int]] = deque()
        #: answers seen by the reactor thread, (site, kind, value); see politeness.FeedbackBatch
        self.feedback: deque[tuple[str, str, Any]] = deque()
        self.inflight = 0  # written by the reactor thread: requests handed to the engine
        self.drained = False
        #: enqueue operations whose reply came back (the scheduler compares it with what it
        #: queued: until they match, the crawl may not be drained even if it looked so)
        self.enqueues_done = 0
        self.starved = True  # written by the reactor thread: it found nothing to hand out
        #: set by the scheduler: how many requests only this worker holds (they cannot travel)
        self.local_count: Callable[[], int] = lambda: 0
        #: set by the scheduler when it kept a request locally: the crawl has started even if
        #: Redis never saw a request, so an empty Redis is not "waiting for seeds"
        self.started_locally = False
        self.fatal: BaseException | None = None
        self._kick = threading.Event()
        self._closing = False
        self._stop_requested = False
        self._cycles = 0
        self._cycle_done = threading.Condition()
        # pump-thread state
        prefetch = config.prefetch or concurrency
        self.capacity = concurrency + prefetch
        self.low_water = max(1, prefetch // 2)
        # Prefetch per site: what its downloader slot takes, and with a download delay
        # no more than about two seconds of it, so leases do not age in the buffer.
        site_prefetch = config.prefetch_per_site or per_site_concurrency
        if download_delay > 0 and not config.prefetch_per_site:
            site_prefetch = max(1, min(site_prefetch, math.ceil(2.0 / download_delay)))
        self.per_site_cap = per_site_concurrency + site_prefetch
        self.browser_cap = config.browser_max if "browser" in config.capabilities else 0
        self.http = "http" in config.capabilities
        self.mask = "".join(
            "1" if task in config.capabilities else "0" for task in ("http", "browser") for _ in BANDS
        )
        self.held: dict[str, int] = defaultdict(int)
        self.held_total = 0
        self.lease_ids: set[LeaseKey] = set()  # every lease held, to tell lost ones (recovery.py)
        self.held_browser = 0
        self.held_browser_site: dict[str, int] = defaultdict(int)
        self.suspects = 0  # held entries that failed a delivery before: at most one
        self.recovering = False
        self.claim_cursor = 0
        self.hints: dict[str, SiteHint] = {}
        self.registered: set[str] = set()
        self.unconfirmed: list[tuple[Any, ...]] = []
        self.held_acks: list[tuple[Any, ...]] = []
        self.own_dead: list[tuple[Any, ...]] = []
        self.drain = DrainDetector()
        now = time.monotonic()
        self.started = now
        self.waiting_for_seeds_logged = False
        self.next_registry = now
        self.next_policy = now
        self.next_heartbeat = now
        self.next_claim = now + min(config.lease_seconds, 5.0)
        self.next_busy_claim = now + config.lease_seconds
        self.next_drain_check = now
        self.drain_interval = 0.05
        self.retry = Backoff(initial_s=0.1, max_s=5.0)
        self.outage_since: float | None = None
        #: moves a scrapy-redis feed into the crawl (feed.py), set by the scheduler
        self.feed: FeedMover | None = None
        self.next_feed = now
        #: a migrated scrapy-redis dupefilter SET (legacy.py), read from the crawl meta
        self.legacy: str | None = None
        self.answers = FeedbackBatch(config.feedback_interval_seconds)

    # -- called from the reactor thread ------------------------------------

    def kick(self) -> None:
        self._kick.set()

    def stop_leasing(self) -> None:
        """Lease nothing more (the worker is closing); does not wait."""
        self._closing = True
        self._kick.set()

    def begin_close(self, timeout: float = 5.0) -> None:
        """Stop leasing; return once no more arrivals can appear."""
        with self._cycle_done:
            self._closing = True
            seen = self._cycles
            self._kick.set()
            if self.is_alive():
                self._cycle_done.wait_for(lambda: self._cycles > seen + 1 or not self.is_alive(), timeout)

    def finish(self, timeout: float) -> bool:
        """Flush everything queued, then stop the thread. True if all was flushed."""
        self._stop_requested = True
        self._kick.set()
        self.join(timeout)
        return not self.is_alive() and not self._unsent()

    # -- the thread ---------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # pragma: no cover - a bug; keep it visible
            self.fatal = exc
            logger.exception("streams-sched I/O thread crashed; the worker cannot lease or ack")
            self.wake()

    def _run(self) -> None:
        deadline: float | None = None
        while True:
            if self._stop_requested:
                if deadline is None:
                    deadline = time.monotonic() + 30.0
                if not self._unsent() and not self.outbox:
                    break
                if time.monotonic() > deadline:
                    logger.error(
                        "streams-sched stopping with %d unsent operations; their requests"
                        " come back when their leases expire",
                        len(self.outbox) + len(self.unconfirmed) + len(self.held_acks),
                    )
                    break
            timeout = self._wait_time()
            if timeout > 0:
                self._kick.wait(timeout)
            self._kick.clear()
            delay = 0.0
            try:
                self._cycle()
                if self.outage_since is not None:
                    logger.warning(
                        "Redis is reachable again after %.1fs", time.monotonic() - self.outage_since
                    )
                    self._release_orphans()
                    self.outage_since = None
                self.retry.reset()
            except TRANSIENT as exc:
                self._on_outage(exc)
                delay = self.retry.next()
            except Exception:
                logger.exception("streams-sched I/O cycle failed; retrying")
                delay = self.retry.next()
            with self._cycle_done:
                self._cycles += 1
                self._cycle_done.notify_all()
            if delay:
                time.sleep(delay)
        self._goodbye()

    def _release_orphans(self) -> None:
        """After a Redis error: hand back leases Redis granted but whose reply was lost."""
        known = set(self.lease_ids)
        known.update((op[1].site, op[1].stream, op[1].id) for op in self.held_acks + self.own_dead)
        released = release_orphans(self.frontier, self.node_id, list(self.hints), known)
        if released:
            self.stats.append(("streams/orphans_released", released))

    def _wake_if_starved(self) -> None:
        """New requests arrived: wake the engine only if it found nothing last time it
        asked (a busy engine asks again by itself after each download, and every wake
        costs the reactor a self-pipe wake-up and the GIL)."""
        if self.starved:
            self.starved = False
            self.wake()

    def _on_outage(self, exc: BaseException) -> None:
        if self.outage_since is None:
            self.outage_since = time.monotonic()
            logger.warning("Redis unreachable (%s); retrying with back-off", exc)
        self.stats.append(("streams/redis_errors", 1))

    def _unsent(self) -> bool:
        return bool(self.unconfirmed or self.held_acks or self.own_dead)

    def _wait_time(self) -> float:
        if self._stop_requested:
            return 0.0 if (self.outbox or self._unsent()) else 0.01
        if len(self.outbox) >= 512:
            return 0.0
        if self.outbox or self._unsent():
            return self.config.flush_interval_seconds
        now = time.monotonic()
        if self.feedback:
            self.answers.absorb(self.feedback)
        if self.answers.due(now):
            return 0.0
        poll = self.config.idle_poll_seconds
        deadlines = [self.next_heartbeat, self.next_busy_claim]
        if self.answers.sites:
            deadlines.append(self.answers.next_report)
        if not self._closing and self.held_total - self.inflight <= self.low_water:
            browser = self.browser_cap > 0
            deadlines += [h.not_before for h in self.hints.values() if h.may_have_work(browser)]
            deadlines.append(self.next_registry)
            if self.feed is not None:
                deadlines.append(self.next_feed)
            if any(h.pending for h in self.hints.values()):
                deadlines.append(self.next_claim)
            if self.recovering and self.suspects == 0:
                deadlines.append(now)
            if self.held_total == 0:
                deadlines.append(self.next_drain_check)
        return min(max(min(deadlines) - now, 0.002), poll)

    # -- one cycle ------------------------------------------------------------

    def _cycle(self) -> None:
        now = time.monotonic()
        f = self.frontier
        if now >= self.next_policy:
            self._refresh_policy(now)
        ops: list[tuple[Any, ...]] = []
        outbox = self.outbox
        while outbox:
            ops.append(outbox.popleft())
        new_enq = [op for op in ops if op[0] == "E"]
        new_after = [op for op in ops if op[0] != "E"]
        for op in new_after:
            if op[0] in ("A", "D", "R"):
                self._forget(op[1])
        sendable: list[tuple[Any, ...]] = []
        if not self.unconfirmed:
            sendable, self.held_acks = self.held_acks, []
        sendable += self.own_dead
        self.own_dead = []
        enq = self.unconfirmed + new_enq
        self.unconfirmed = []
        self.held_acks += new_after

        pipe = f.client.pipeline(transaction=False)
        handlers: list[tuple[Any, ...]] = []
        arrived = 0
        try:
            if self.legacy is not None:
                enq = self._legacy_filter(enq)
            self._queue_writes(pipe, handlers, enq, sendable)
            self._queue_feedback(pipe, handlers, now)
            planned = self._queue_leases(pipe, handlers, now)
            self._queue_heartbeat(pipe, handlers, now)
            replies = pipe.execute(raise_on_error=False) if handlers else []
        except BaseException:
            self.unconfirmed = enq + self.unconfirmed
            self.held_acks = sendable + self.held_acks
            raise
        if handlers:
            arrived = self._handle(handlers, replies)
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
        self.stats.append(("streams/feed_refused", 1))
        self.feed = None

    def _legacy_filter(self, ops: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Drop requests a migrated scrapy-redis crawl already saw (one SMISMEMBER).
        Ops carry scrapy-redis's fingerprint as op[3] until they are checked."""
        checked = [op for op in ops if len(op) > 3 and op[3]]
        if not checked or self.legacy is None:
            return ops
        seen = legacy_seen(self.frontier.client, self.legacy, [op[3] for op in checked])
        drop = {id(op) for op, hit in zip(checked, seen, strict=True) if hit}
        if drop:
            self.stats.append(("streams/legacy_duplicates", len(drop)))
            self.stats.append(("dupefilter/filtered", len(drop)))
            # done as far as the scheduler's pending count goes: they will never be sent
            self.enqueues_done += len(drop)
        return [op[:3] if len(op) > 3 else op for op in ops if id(op) not in drop]

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
            self.stats.append(("streams/feed_read", result.read))
        if result.added:
            self.stats.append(("streams/feed_added", result.added))
            self.stats.append(("streams/enqueued", result.added))
            self.drained = False
            for site in result.sites:
                hint = self.hints.setdefault(site, SiteHint())
                hint.backlog_http = hint.backlog_browser = -1
                hint.not_before = 0.0
                hint.empty_streak = 0
                self.registered.add(site)
        if result.duplicates:
            self.stats.append(("streams/feed_duplicates", result.duplicates))
        if result.dead:
            self.stats.append(("streams/feed_dead_lettered", result.dead))

    def _forget(self, entry: LeasedEntry) -> None:
        """A lease this worker held is finished (acked, dead-lettered or handed back)."""
        self.held[entry.site] -= 1
        if self.held[entry.site] <= 0:
            del self.held[entry.site]
        self.held_total -= 1
        self.lease_ids.discard((entry.site, entry.stream, entry.id))
        if entry.stream >= BROWSER_FIRST_STREAM:
            self.held_browser -= 1
            self.held_browser_site[entry.site] -= 1
            if self.held_browser_site[entry.site] <= 0:
                del self.held_browser_site[entry.site]
        if entry.suspect:
            self.suspects -= 1
            self.next_claim = time.monotonic()

    def _queue_writes(
        self,
        pipe: Any,
        handlers: list[tuple[Any, ...]],
        enq: list[tuple[Any, ...]],
        after: list[tuple[Any, ...]],
    ) -> None:
        f = self.frontier
        if enq:
            new_sites = {op[1] for op in enq} - self.registered
            if new_sites:
                f.register_sites(sorted(new_sites), pipe)
                handlers.append(("reg", new_sites))
            by_site: dict[str, list[tuple[Any, ...]]] = defaultdict(list)
            for op in enq:
                by_site[op[1]].append(op)
            for site, site_ops in by_site.items():
                for i in range(0, len(site_ops), ENQUEUE_CHUNK):
                    chunk = site_ops[i : i + ENQUEUE_CHUNK]
                    f.enqueue(site, [op[2] for op in chunk], pipe)
                    handlers.append(("enq", site, chunk))
        if after:
            groups: dict[tuple[str, str], list[tuple[Any, ...]]] = defaultdict(list)
            for op in after:
                groups[(op[0], op[1].site)].append(op)
            for (kind, site), group in groups.items():
                if kind == "A":
                    f.ack(site, [(op[1].stream, op[1].id) for op in group], pipe)
                elif kind == "D":
                    f.dead_letter(site, self.node_id, [(op[1].stream, op[1].id, op[2]) for op in group], pipe)
                elif kind == "R":
                    f.release(site, self.node_id, [(op[1].stream, op[1].id) for op in group], pipe)
                elif kind == "X":
                    for op in group:
                        f.extend(site, self.node_id, op[1].stream, op[1].id, pipe)
                handlers.append(("after", kind, group))

    def _queue_feedback(self, pipe: Any, handlers: list[tuple[Any, ...]], now: float) -> None:
        """One feedback.lua call per site with answers to report: at once after a 429, 503,
        timeout or robots.txt, otherwise every STREAMS_FEEDBACK_INTERVAL_SECONDS."""
        self.answers.absorb(self.feedback)
        if not self.answers.due(now):
            return
        cfg = self.config
        params = (
            "1" if cfg.adaptive else "0",
            repr(cfg.adaptive_decrease),
            repr(cfg.adaptive_increase),
            repr(cfg.adaptive_min_rate),
            int(cfg.adaptive_forget_seconds * 1000),
        )
        for site, outcome, robots in self.answers.take(now):
            self.frontier.feedback(site, outcome, robots, params, pipe)
            handlers.append(("fb", site))

    def _queue_leases(self, pipe: Any, handlers: list[tuple[Any, ...]], now: float) -> bool:
        """Queue lease calls; True if any site was asked."""
        if self._closing or self._stop_requested:
            return False
        if now >= self.next_registry:
            self._refresh_registry(now)
        ready = self.held_total - self.inflight
        room = self.capacity - self.held_total
        if room <= 0 or (ready > self.low_water and room < self.low_water):
            return False
        plans = plan_leases(
            now,
            self.hints,
            self.held,
            total_room=room,
            per_site_cap=self.per_site_cap,
            browser_room=max(0, self.browser_cap - self.held_browser),
            http=self.http,
            held_browser=self.held_browser_site,
        )
        weights = self.config.band_ratio
        suspects_ok = 1 if self.suspects == 0 else 0
        for plan in plans:
            self.frontier.lease(
                plan.site,
                self.node_id,
                plan.total,
                weights,
                max_http=plan.max_http,
                max_browser=plan.max_browser,
                max_suspects=suspects_ok,
                pipe=pipe,
            )
            suspects_ok = 0
            handlers.append(("lease", plan.site, plan))
        return bool(plans)

    def _queue_heartbeat(self, pipe: Any, handlers: list[tuple[Any, ...]], now: float) -> None:
        if now < self.next_heartbeat or self._stop_requested:
            return
        self.next_heartbeat = now + self.config.heartbeat_seconds
        info = self._node_record("online")
        self.frontier.record_node(self.node_id, info, pipe)
        self.frontier.publish({"event": "heartbeat", **info}, pipe)
        handlers.append(("hb",))
        handlers.append(("hb",))

    def _node_record(self, state: str) -> dict[str, Any]:
        return {
            **self.node_info,
            "node": self.node_id,
            "crawl": self.frontier.crawl,
            "state": state,
            "last_seen": time.time(),
            "held": self.held_total,
            "local": self.local_count(),
            "heartbeat_s": self.config.heartbeat_seconds,
        }

    # -- replies --------------------------------------------------------------

    def _handle(self, handlers: list[tuple[Any, ...]], replies: list[Any]) -> int:
        """Apply the replies of one pipeline; return how many requests arrived."""
        arrived = 0
        confirmed = False
        noscript = False
        transient: BaseException | None = None
        for h, reply in zip(handlers, replies, strict=True):
            kind = h[0]
            if isinstance(reply, Exception):
                if isinstance(reply, NoScriptError):
                    noscript = True
                elif isinstance(reply, TRANSIENT):
                    transient = reply
                else:
                    logger.error("Redis refused a %s: %s", kind, reply)
                    self.stats.append(("streams/redis_errors", 1))
                if kind == "enq":
                    self.unconfirmed += h[2]
                elif kind == "after":
                    self.held_acks = h[2] + self.held_acks
                elif kind == "reg":
                    self.registered -= h[1]
                continue
            if kind == "enq":
                self._on_enqueued(h[1], h[2], reply)
                confirmed = True
            elif kind == "reg":
                self.registered |= h[1]
            elif kind == "after":
                self._on_after(h[1], h[2], reply)
            elif kind == "lease":
                arrived += self._on_leased(h[1], reply, h[2])
            elif kind == "fb" and int(reply[3]):
                self.stats.append(("streams/backoffs", 1))
                hint = self.hints.get(h[1])
                if hint is not None:
                    hint.not_before = 0.0  # ask again now: the lease reply carries the new rate
        if noscript:
            self.frontier.scripts.load()
        if arrived:
            self.drained = False
        if arrived or confirmed:
            self._wake_if_starved()
        if transient is not None:
            raise transient
        return arrived

    def _on_enqueued(self, site: str, chunk: list[tuple[Any, ...]], reply: Any) -> None:
        self.enqueues_done += len(chunk)
        added, dups, delayed, _flags = parse_enqueue(reply)
        st = self.stats
        if added:
            st.append(("streams/enqueued", added))
            hint = self.hints.get(site)
            if hint is None:
                hint = self.hints[site] = SiteHint()
            hint.backlog_http = hint.backlog_browser = -1
            hint.not_before = 0.0
            hint.empty_streak = 0
            self.drained = False
        if dups:
            st.append(("dupefilter/filtered", dups))
            st.append(("streams/duplicates_remote", dups))
        if delayed:
            st.append(("streams/delayed", delayed))
        over = over_cap_of(reply)
        if over:
            st.append(("streams/over_cap", over))

    def _on_after(self, kind: str, group: list[tuple[Any, ...]], reply: Any) -> None:
        n = int(reply) if not isinstance(reply, list) else len(group)
        key = {"A": "streams/acked", "D": "streams/dead_lettered", "R": "streams/released", "X": "streams/extended"}[kind]
        self.stats.append((key, n if kind != "X" else len(group)))

    def _on_leased(self, site: str, reply: Any, plan: Any) -> int:
        r = parse_lease(site, reply)
        now = time.monotonic()
        hint = self.hints.setdefault(site, SiteHint())
        # lease.lua only looks at the task types it was asked for
        if plan.max_http > 0:
            hint.backlog_http = r.backlog_http
        if plan.max_browser > 0:
            hint.backlog_browser = r.backlog_browser
        hint.pending = r.pending
        hint.delayed = r.delayed
        hint.weight = r.weight if r.weight > 0 else 1.0
        hint.rate = r.rate
        hint.max_browser = r.max_browser
        n = len(r.entries)
        if n:
            hint.empty_streak = 0
            hint.not_before = 0.0
            hint.served += n
            self.stats.append(("streams/leased", n))
        elif r.deferred:
            # only requests that failed before, and this worker already holds one
            hint.not_before = now + 0.25
        elif r.wait_ms == -1:
            hint.not_before = now + self.config.idle_poll_seconds
        elif r.wait_ms > 0:
            hint.not_before = now + r.wait_ms / 1000.0
        elif not hint.may_have_work(self.browser_cap > 0, self.http) or r.delayed:
            hint.empty_streak += 1
            hint.not_before = now + empty_lease_backoff(
                hint.empty_streak, self.config.idle_poll_seconds, r.next_due_in_ms
            )
        return self._accept(r.entries)

    def _accept(self, entries: list[LeasedEntry]) -> int:
        """Decode leased entries; good ones go to the reactor, bad ones to the dead-letter stream."""
        arrived = 0
        decode = self.codec.decode
        now = time.monotonic()
        for e in entries:
            e.leased_at = now
            self.held[e.site] += 1
            self.lease_ids.add((e.site, e.stream, e.id))
            self.held_total += 1
            if e.stream >= BROWSER_FIRST_STREAM:
                self.held_browser += 1
                self.held_browser_site[e.site] += 1
            if e.suspect:
                self.suspects += 1
            try:
                if e.payload is None:
                    raise EntryError("entry has no payload field r")
                request = decode(e.payload)
            except EntryError as exc:
                logger.error(
                    "dead-lettering entry %s of site %s: %s", e.id.decode(), e.site, exc
                )
                self._forget(e)
                self.own_dead.append(("D", e, str(exc)))
                continue
            e.payload = None
            if e.stream >= BROWSER_FIRST_STREAM and "task_type" not in request.meta:
                request.meta["task_type"] = "browser"
            self.arrivals.append((request, e))
            arrived += 1
        return arrived

    # -- idle work: registry, reclaim, drain ------------------------------------

    def refresh_policy(self) -> None:
        """Read the crawl's default policy now (before the thread starts)."""
        self._refresh_policy(time.monotonic())

    def _refresh_policy(self, now: float) -> None:
        """Re-read the crawl's default policy ("*"), so a live change reaches this worker."""
        self.next_policy = now + self.config.policy_refresh_seconds
        raw = self.frontier.client.hgetall(self.frontier.keys.meta)
        meta = {k.decode(): v.decode() for k, v in raw.items()}
        f = self.frontier
        f.default_policy = (
            meta.get("default_rate", ""),
            meta.get("default_burst", ""),
            meta.get("default_paused", ""),
            meta.get("default_weight", ""),
            meta.get("default_max_browser", ""),
        )
        f.default_task = meta.get("default_task_type") or "http"
        self.legacy = meta.get(LEGACY_FIELD) or None

    def _refresh_registry(self, now: float) -> None:
        busy = self.held_total > 0
        self.next_registry = now + (10.0 if busy else 2.0)
        for site in self.frontier.sites():
            if site not in self.hints:
                self.hints[site] = SiteHint()
            self.registered.add(site)

    def _maintenance(self, now: float, planned: bool, arrived: int) -> None:
        """Take over expired leases when there is nothing else to do (and now and then
        even when busy), and check whether the crawl is drained when idle."""
        if self._closing or self._stop_requested:
            return
        room = self.capacity - self.held_total
        wants_claim = (not planned and now >= self.next_claim) or now >= self.next_busy_claim or self.recovering
        if room > 0 and self.suspects == 0 and wants_claim:
            self._claim_expired(now)
        local_idle = self.held_total == 0 and not self.outbox and not self._unsent()
        if not local_idle or arrived:
            self.drain.reset()
            self.drain_interval = 0.05
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
        sites = [s for s, h in self.hints.items() if h.pending > 0]
        self.recovering = False
        if not sites:
            return
        f = self.frontier
        for i in range(min(len(sites), 8)):
            site = sites[(self.claim_cursor + i) % len(sites)]
            try:
                reply = f.claim(
                    site, self.node_id, self.config.lease_ms, 1, self.config.max_deliveries, "claim", self.mask
                )
            except NoScriptError:
                f.scripts.load()
                return
            taken, dead, entries = reply
            if dead:
                logger.warning(
                    "moved %d entries of site %s to the dead-letter stream (STREAMS_MAX_DELIVERIES=%d)",
                    dead, site, self.config.max_deliveries,
                )
                self.stats.append(("streams/dead_lettered", dead))
            if taken:
                self.claim_cursor = (self.claim_cursor + i) % len(sites)
                logger.info("took over an expired lease of site %s (%s)", site, entries[0].id.decode())
                self.stats.append(("streams/reclaimed", taken))
                self.recovering = True
                if self._accept(entries):
                    self.drained = False
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
        sites = f.sites()
        if not sites and not self.started_locally and now - self.started < self.config.empty_crawl_wait_seconds:
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
        statuses = f.status_many(sites)
        snapshot = {}
        for st in statuses:
            hint = self.hints.setdefault(st.site, SiteHint())
            hint.pending = st.pending
            hint.delayed = st.delayed
            leasable = sum(
                s.backlog for (task, _), s in st.streams.items() if task in self.config.capabilities
            )
            if leasable and hint.not_before > now:
                hint.not_before = now
            hint.backlog_http = sum(s.backlog for (t, _), s in st.streams.items() if t == "http")
            hint.backlog_browser = sum(s.backlog for (t, _), s in st.streams.items() if t == "browser")
            snapshot[st.site] = (st.is_empty, st.stats.get("enqueued", 0))
        drained = self.drain.observe(snapshot)
        if drained != self.drained:
            self.drained = drained
            if drained:
                logger.info("crawl %s is drained: no backlog, lease or delayed request left", f.crawl)
            self.wake()
        # Confirm an empty-looking crawl quickly; otherwise look less and less often.
        if not drained and all(empty for empty, _ in snapshot.values()):
            self.drain_interval = 0.05
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
