"""Which ready sites a worker asks each shard for, and what it learned of them.

Each shard's ready index names sites to the worker in the reply of one lease call;
the next call asks for leases at those sites (selection.py, ``plan_shards``). What
this keeps follows the sites the worker holds or recently asked, never the crawl's
sites: per shard the named sites and when to ask it again, per site a
:class:`~streams_sched.worker.selection.SiteHint` only while it holds leases or must
wait. Leased entries are decoded here; a bad one goes to the dead-letter stream.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable
from hashlib import blake2b
from typing import Any

from streams_sched.config import StreamsConfig
from streams_sched.errors import EntryError
from streams_sched.frontier import scripts as lua
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import BROWSER_FIRST_STREAM, shard_of
from streams_sched.frontier.records import LeasedEntry, LeaseReply, ShardLease
from streams_sched.frontier.scripts.lease import LeaseOptions
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.io.sent import Leased
from streams_sched.worker.leasebook import LeaseBook
from streams_sched.worker.ops import AckGate, DeadLetter
from streams_sched.worker.selection import LeasePlan, ShardPlan, SiteHint, empty_lease_backoff, plan_shards

__all__ = ["HINTS_PER_SLOT", "SUSPECT_RETRY_S", "Leasing"]

logger = logging.getLogger(__name__)

#: seconds before asking a site again whose only backlog is a request that failed a
#: delivery before, while this worker already holds one such (suspect) request
SUSPECT_RETRY_S = 0.25
#: a worker keeps hints of this many sites per slot of its capacity at most; past it,
#: hints of sites it holds nothing of and need not wait for are dropped
HINTS_PER_SLOT = 4


class Leasing:
    """The lease calls of each cycle, and what their replies teach about the sites."""

    def __init__(
        self,
        frontier: Frontier,
        config: StreamsConfig,
        x: Exchange,
        book: LeaseBook,
        gate: AckGate,
        codec: RequestCodec,
        node_id: str,
        *,
        capacity: int,
        per_site_cap: int,
        on_suspect_done: Callable[[], None],
    ) -> None:
        self.frontier = frontier
        self.config = config
        self.exchange = x
        self.book = book
        self.gate = gate
        self.codec = codec
        self.node_id = node_id
        self.capacity = capacity
        self.per_site_cap = per_site_cap
        self.browser_cap = config.browser_max if "browser" in config.capabilities else 0
        #: a suspect request ended here: the next expired lease may be taken over
        self.on_suspect_done = on_suspect_done
        #: what this worker last learned of the sites it holds or recently asked (bounded:
        #: _prune_hints), never one per site of the crawl
        self.hints: dict[str, SiteHint] = {}
        #: the weights other than 1 among the hints (most sites weigh 1)
        self.weighted: dict[str, float] = {}
        #: sites whose last lease reply gave requests and showed nothing else: no backlog,
        #: nothing delayed, no rate, weight 1, no browser cap. A hint would say no more than
        #: a site without one, so at one page per site none is made (bounded: _prune_hints)
        self.emptied: set[str] = set()
        shards = frontier.shards
        #: per shard, the ready sites it named to this worker (an ordered set), and when to
        #: ask it again while it names none
        self.named: list[dict[str, None]] = [{} for _ in range(shards)]
        self.shard_due: list[float] = [0.0] * shards
        self.shard_streak: list[int] = [0] * shards
        self.shard_cursor = 0
        #: site -> its policy ``revisit``, as its last lease reply said (its pages are
        #: tracked; a taken-over entry of the site is tracked by it too)
        self.site_revisit: dict[str, str] = {}
        #: where in a shard's oldest ready sites the next named run starts (lease.lua)
        self.random = random.Random()
        #: ready sites to ask each shard for per call
        self.name_count = max(8, min(256, math.ceil(2 * capacity / shards)))

    @property
    def http(self) -> bool:
        """This worker leases http requests (STREAMS_CAPABILITIES)."""
        return "http" in self.config.capabilities

    def next_due(self, now: float) -> float:
        """When a shard should be asked next: now if one named sites."""
        return now if any(self.named) else min(self.shard_due)

    def queue(self, pipe: Any, now: float) -> list[Leased]:
        """Queue lease calls, one per shard that named sites or is due to be asked;
        return what each call was (none: no shard was asked)."""
        book = self.book
        x = self.exchange
        ready = book.total - x.inflight
        room = self.capacity - book.total
        if room <= 0 or (ready > x.low_water and room < x.low_water):
            return []
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
            held_total=book.total,
            weighted=self.weighted,
        )
        self.shard_cursor = (self.shard_cursor + 1) % len(self.named)
        self._drop_unleasable(now, {p.shard for p in plans})
        tasks = ("h" if self.http else "") + ("b" if browser_room > 0 else "")
        suspects_ok = 1 if book.suspects == 0 else 0
        calls = []
        paused_wait_ms = int(self.config.idle_poll_seconds * 1000)
        for plan in plans:
            named = self.named[plan.shard]
            for site_plan in plan.sites:
                named.pop(site_plan.site, None)
            options = LeaseOptions(
                name=plan.name if tasks else 0, spread=self.random.getrandbits(31), tasks=tasks,
                paused_wait_ms=paused_wait_ms, max_suspects=suspects_ok, budget=plan.budget,
            )
            call = lua.lease.call(self.frontier, plan.shard, self.node_id, plan.sites, self.config.band_ratio, options)
            call.queue(pipe)
            suspects_ok = 0
            calls.append(Leased(plan, call.parse))
        return calls

    def refused(self, plan: ShardPlan) -> None:
        """Leave a shard whose lease call Redis refused alone for a while (as if empty)."""
        n = plan.shard
        self.shard_streak[n] += 1
        self.shard_due[n] = time.monotonic() + empty_lease_backoff(self.shard_streak[n], self.config.idle_poll_seconds)

    def finished(self, site: str) -> bool:
        """The site's last lease reply showed no backlog, no delayed request and no rate."""
        if site in self.emptied:
            return True
        hint = self.hints.get(site)
        return (
            hint is not None and hint.backlog_http == 0 and hint.backlog_browser <= 0
            and hint.delayed == 0 and hint.rate == 0
        )

    def _drop_unleasable(self, now: float, asked: set[int]) -> None:
        """Forget named sites this worker cannot lease now (it holds its cap of them, or
        must wait), in shards it is not asking: they stay in Redis's ready index and come
        back named later, and a shard's list never fills with sites it skips."""
        held, cap, hints = self.book.by_site, self.per_site_cap, self.hints
        for n, named in enumerate(self.named):
            if n in asked or not named:
                continue
            for site in [s for s in named if held.get(s, 0) >= cap or (s in hints and hints[s].not_before > now)]:
                del named[site]

    def poke(self, site: str) -> None:
        """``site`` got work: ask its shard for ready sites at once."""
        n = shard_of(site, len(self.named))
        self.shard_due[n] = 0.0
        self.shard_streak[n] = 0
        self.emptied.discard(site)
        hint = self.hints.get(site)
        if hint is not None:
            hint.backlog_http = hint.backlog_browser = -1
            hint.not_before = 0.0

    def ask_again(self, site: str) -> None:
        """The site's rate changed: its next lease reply carries the new one."""
        hint = self.hints.get(site)
        if hint is not None:
            hint.not_before = 0.0

    def shards_with_work(self, counts: list[tuple[int, int, int, int]], now: float) -> None:
        """A drain check saw ready sites in these shards: ask them now."""
        for n, (ready_http, ready_browser, _, _) in enumerate(counts):
            if (ready_http and self.http) or (ready_browser and self.browser_cap > 0):
                self.shard_due[n] = min(self.shard_due[n], now)

    def _prune_hints(self, now: float) -> None:
        """Forget sites this worker holds nothing of and need not wait for: what it keeps
        follows the sites it holds, not the crawl."""
        held = self.book.by_site
        if len(self.emptied) > HINTS_PER_SLOT * self.capacity:
            self.emptied = {s for s in self.emptied if s in held}
        if len(self.hints) <= HINTS_PER_SLOT * self.capacity:
            return
        self.hints = {s: h for s, h in self.hints.items() if s in held or h.not_before > now}
        self.weighted = {s: w for s, w in self.weighted.items() if s in self.hints}

    def on_leased(self, plan: ShardPlan, r: ShardLease) -> int:
        """Apply one shard's lease reply: what each site said, then the sites the shard named
        and when to ask it again; return how many requests arrived."""
        now = time.monotonic()
        arrived = 0
        named = self.named[plan.shard]
        x = self.exchange
        for site_plan, part in zip(plan.sites, r.sites, strict=True):
            site = site_plan.site
            if part is None:
                named[site] = None  # the call's budget ran out first: next time
                continue
            n = len(part.entries)
            weight = part.weight if part.weight > 0 else 1.0
            hint = self.hints.get(site)
            # A reply with requests that says nothing else of the site (no backlog of the task
            # types asked for, nothing delayed, no rate, no browser cap, weight 1): a hint from
            # it would plan the site's next lease as no hint does, and only finished() reads it.
            emptied = (
                n and site_plan.max_http > 0 and part.backlog_http == 0
                and (site_plan.max_browser <= 0 or part.backlog_browser <= 0)
                and part.delayed == 0 and part.rate == 0 and part.max_browser == -1 and weight == 1.0
            )
            if hint is None and emptied:
                self.emptied.add(site)
            else:
                if hint is None:
                    if not n and part.wait_ms == 0 and not part.deferred:
                        continue  # nothing held, nothing to wait for: nothing to remember
                    hint = self.hints[site] = SiteHint()
                self.emptied.discard(site)
                self._learn(hint, site_plan, part, weight, now)
            if weight != 1.0:
                self.weighted[site] = weight
            elif self.weighted:
                self.weighted.pop(site, None)
            if x.weights.get(site) != weight:
                x.weights[site] = weight
            if part.revisit:
                self.site_revisit[site] = part.revisit
            elif self.site_revisit:
                self.site_revisit.pop(site, None)
            if n:
                if part.mu is not None:
                    # the site's freshness multiplier: its tracked pages' next intervals
                    # are chosen with it at their acks (worker/freshness.py)
                    for e in part.entries:
                        e.mu = part.mu
                x.stats.append(("streams/leased", n))
                arrived += self.accept(part.entries)
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

    def _learn(self, hint: SiteHint, plan: LeasePlan, r: LeaseReply, weight: float, now: float) -> None:
        # lease.lua only looks at the task types it was asked for
        if plan.max_http > 0:
            hint.backlog_http = r.backlog_http
        if plan.max_browser > 0:
            hint.backlog_browser = r.backlog_browser
        hint.delayed = r.delayed
        hint.weight = weight
        hint.rate = r.rate
        hint.max_browser = r.max_browser
        if r.entries:
            hint.not_before = 0.0
        elif r.deferred:
            # only requests that failed a delivery, and this worker already holds one
            hint.not_before = now + SUSPECT_RETRY_S
        elif r.wait_ms == -1:
            hint.not_before = now + self.config.idle_poll_seconds
        elif r.wait_ms > 0:
            hint.not_before = now + r.wait_ms / 1000.0

    def accept(self, entries: list[LeasedEntry]) -> int:
        """Decode leased entries; good ones go to the reactor, bad ones to the dead-letter stream."""
        arrived = 0
        decode = self.codec.decode
        now = time.monotonic()
        take = self.book.take
        arrivals = self.exchange.arrivals
        browser = 0
        track_all = self.config.revisit_every_seconds > 0
        site_revisit = self.site_revisit
        for e in entries:
            e.leased_at = now
            take(e)
            try:
                if e.payload is None:
                    raise EntryError("entry has no payload field r")
                request = decode(e.payload)
            except EntryError as exc:
                logger.error("dead-lettering entry %s of site %s: %s", e.id.decode(), e.site, exc)
                if self.book.end(e):
                    self.on_suspect_done()
                self.gate.dead_on_arrival(DeadLetter(e, str(exc)))
                continue
            if site_revisit and e.site in site_revisit:
                e.revisit = site_revisit[e.site]
            # payload_digest(), inlined: this line runs for every page leased
            e.digest = blake2b(e.payload, digest_size=8).digest()
            if not (e.revisit or track_all or "revisit" in request.meta):
                # a tracked page keeps its payload as leased: its ack sends it back for the
                # next visit (worker/revisits.py); any other is dropped here
                e.payload = None
            if e.stream >= BROWSER_FIRST_STREAM:
                browser += 1
                if "task_type" not in request.meta:
                    request.meta["task_type"] = "browser"
            arrivals.append((request, e))
            arrived += 1
        if browser:
            self.exchange.stats.append(("streams/leased_browser", browser))
        return arrived

