"""Pure decision logic of a worker: no Redis, no Scrapy, no clocks of its own.

- :func:`band_for` (from frontier/keys.py) maps ``Request.priority`` to a priority band;
- :class:`SiteHint` and :func:`plan_shards` decide which of the sites the shards'
  ready indexes named to lease from, and how many entries, given what this worker
  already holds: one call per shard;
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

# band_for is a naming rule (keys.py), re-exported: deciding starts with a band
from streams_sched.frontier.keys import band_for

__all__ = [
    "LeasePlan", "ShardPlan", "SiteHint", "band_for", "empty_lease_backoff", "plan_shards",
]


@dataclass(slots=True)
class SiteHint:
    """What a worker last learned about a site, and when to ask it again."""

    #: entries not yet delivered, per task type, as of the last reply (-1 = unknown)
    backlog_http: int = -1
    backlog_browser: int = -1
    delayed: int = 0
    #: do not lease from this site before this time (monotonic seconds)
    not_before: float = 0.0
    #: the site's policy as last seen: weight for fairness, rate (0 = none), browser cap per node
    weight: float = 1.0
    rate: float = 0.0
    max_browser: int = -1



def empty_lease_backoff(empty_streak: int, idle_poll_s: float, next_due_in_ms: int = -1) -> float:
    """Seconds to leave a shard (or site) alone after ``empty_streak`` lease calls in a row found
    nothing: 0.1 s, doubling to at most ``idle_poll_s``, and never past the moment its
    next delayed request is due (``next_due_in_ms``, -1 = none)."""
    backoff: float = min(0.05 * 2.0 ** min(empty_streak, 8), idle_poll_s)
    if next_due_in_ms >= 0:
        backoff = min(backoff, next_due_in_ms / 1000.0)
    return backoff


class LeasePlan(NamedTuple):
    """What to lease from one site: at most ``total`` entries, of them at most ``max_http``
    http and ``max_browser`` browser ones. A tuple: it is the site's part of the
    lease call's arguments as it stands (frontier/scripts/lease.py)."""

    site: str
    total: int
    max_http: int
    max_browser: int


def site_cap(hint: SiteHint, per_site_cap: int, rate_horizon_s: float = 0.5) -> int:
    """Most requests of a site a worker should hold. A rate-limited site gets no more
    than about ``rate_horizon_s`` of its rate, so its tokens are spent when its
    requests go out, not long before."""
    if hint.rate > 0:
        return max(1, min(per_site_cap, math.ceil(hint.rate * rate_horizon_s)))
    return per_site_cap


@dataclass(slots=True)
class ShardPlan:
    """One lease.lua call: lease from ``sites`` of ``shard`` (at most ``budget`` entries in
    all) and have it name up to ``name`` more of its ready sites."""

    shard: int
    sites: list[LeasePlan]
    budget: int
    name: int


def plan_shards(
    now: float,
    named: Sequence[Mapping[str, None]],
    due: Sequence[float],
    hints: Mapping[str, SiteHint],
    held: Mapping[str, int],
    *,
    total_room: int,
    per_site_cap: int,
    browser_room: int,
    http: bool = True,
    held_browser: Mapping[str, int] | None = None,
    name: int = 16,
    start: int = 0,
    held_total: int | None = None,
    weighted: Mapping[str, float] | None = None,
) -> list[ShardPlan]:
    """Split ``total_room`` free lease slots among the sites the shards named.

    ``named[n]`` are the ready sites shard ``n`` named to this worker, oldest first;
    ``due[n]`` is when to ask shard ``n`` again though it named none. A shard's share of
    the free room follows its weight (the sum of its named sites', a site's from its last
    lease reply, 1 while unknown), and a call stops leasing when its share is spent, so a
    site with one request costs one slot, not ``per_site_cap``. A site's part is its
    weighted share of all the worker can hold (``total_room`` plus ``held_total``) less
    what it holds: a site at its share leaves the room to others, and a light one is
    topped up before it runs dry (``weighted``: see :func:`_weigh`). A site never
    gets more than ``site_cap - held`` (one slow site cannot fill the worker), and
    browser slots go to the first sites until ``browser_room`` is spent. A shard whose
    named sites run low is asked for ``name`` more in the same call. Shards are taken in
    turn from ``start``, so none is always last. The cost is one pass over the named
    sites: nothing here grows with the sites that have no work.
    """
    if total_room <= 0:
        return []
    shards = len(named)
    held_total = sum(held.values()) if held_total is None else held_total
    lease = _LeasePass(now, hints, held, held_browser or {}, per_site_cap, total_room + held_total, browser_room, http)
    shard_weight, lease.total_weight = _weigh(named, held, hints, weighted)
    named_weight = sum(shard_weight) or 1.0
    plans: list[ShardPlan] = []
    room = total_room
    for n in [(start + i) % shards for i in range(shards)]:
        sites = named[n]
        refill = name if len(sites) < name else 0
        if not sites:
            if due[n] <= now and room > 0:
                plans.append(ShardPlan(n, [], 0, refill))
            continue
        if room <= 0:
            continue
        share = min(room, max(1, round(total_room * shard_weight[n] / named_weight)))
        chosen = lease.choose(sites, share)
        if chosen or refill:
            # a call never leases more than its sites' parts: the rest of its share is
            # left to the other shards
            budget = min(share, sum(p.total for p in chosen))
            plans.append(ShardPlan(n, chosen, budget, refill))
            room -= budget
    return plans


def _weigh(
    named: Sequence[Mapping[str, None]],
    held: Mapping[str, int],
    hints: Mapping[str, SiteHint],
    weighted: Mapping[str, float] | None,
) -> tuple[list[float], float]:
    """The weight of each shard's named sites, and of every site that competes for the
    worker: the named ones and those it holds requests of, named just now or not.

    Weights are 1 but for the few in ``weighted`` (the weights other than 1 among
    ``hints``, kept by the caller as replies come; None: read from ``hints``), so the
    sites are counted and the few added: C-speed set work over the sites named and held,
    not a lookup per site."""
    if weighted is None:
        weighted = {site: hint.weight for site, hint in hints.items() if hint.weight != 1.0}
    shard_weight = [float(len(sites)) for sites in named]
    named_all: set[str] = set().union(*named)
    competing = named_all | held.keys()
    total_weight = float(len(competing))
    for site, w in weighted.items():
        if site in competing:
            total_weight += w - 1.0
            if site in named_all:
                shard_weight[next(n for n, sites in enumerate(named) if site in sites)] += w - 1.0
    return shard_weight, total_weight if total_weight > 0 else 1.0


@dataclass(slots=True)
class _LeasePass:
    """The inputs of one :func:`plan_shards` and the browser room it has left."""

    now: float
    hints: Mapping[str, SiteHint]
    held: Mapping[str, int]
    held_browser: Mapping[str, int]
    per_site_cap: int
    #: all the worker can hold: its free room and what it holds
    capacity: int
    browser_room: int
    http: bool
    total_weight: float = 1.0

    def weight(self, site: str) -> float:
        hint = self.hints.get(site)
        return hint.weight if hint is not None else 1.0

    def choose(self, sites: Iterable[str], share: int) -> list[LeasePlan]:
        """The sites of one shard to lease from, in order, until ``share`` is spent."""
        chosen: list[LeasePlan] = []
        counted = 0
        for site in sites:
            if counted >= share:
                break
            hint = self.hints.get(site)
            plan = self.site_plan(site, hint)
            if plan is None:
                continue
            chosen.append(plan)
            self.browser_room -= plan.max_browser
            # a site the worker knows nothing of is counted as one request: the call's
            # budget, not this count, bounds what it leases
            known = hint.backlog_http + hint.backlog_browser if hint is not None and hint.backlog_http >= 0 else 1
            counted += max(1, min(plan.total, known))
        return chosen

    def site_plan(self, site: str, hint: SiteHint | None) -> LeasePlan | None:
        """How much to lease from ``site``, or None: waiting, weight 0, or full."""
        if hint is not None and hint.not_before > self.now:
            return None
        held = self.held.get(site, 0)
        cap = site_cap(hint, self.per_site_cap) if hint is not None else self.per_site_cap
        if hint is not None and hint.weight <= 0:
            return None
        # weighted fairness: what a site may hold follows its weight
        cap = min(cap, max(1, round(self.capacity * self.weight(site) / self.total_weight))) - held
        if cap <= 0:
            return None
        site_b = self.browser_room
        if hint is not None and hint.max_browser >= 0:
            site_b = min(site_b, hint.max_browser - self.held_browser.get(site, 0))
        site_b = max(0, min(cap, site_b))
        n_http = cap if self.http else 0
        if n_http == 0 and site_b == 0:
            return None
        return LeasePlan(site, cap, n_http, site_b)


#: how far behind the least served ready site, in requests per weight, a site coming back
#: may start: a backlogged site whose buffer ran dry for one lease round trip (its
#: requests were on their way) gets back what the others were served meanwhile, while
#: a site back from a long pause or a rate limit still cannot take every slot until it
#: has "caught up"
RETURN_GRACE = 2.0


def returning_credit(served: float, weight: float, others: Iterable[tuple[float, float]]) -> float:
    """The served count a site coming back to the ready set starts from.

    ``others`` are the (served, weight) of the sites already ready. A site that
    was away (its buffer ran dry, it was rate limited or paused) must not come
    back far behind and then take every slot until it has "caught up"; it
    starts at most :data:`RETURN_GRACE` behind the least served of them, in
    served-per-weight terms, and never below its own count.
    """
    levels = [s / w for s, w in others if w > 0]
    return credit_at_level(served, weight, min(levels) if levels else None)


def credit_at_level(served: float, weight: float, least: float | None) -> float:
    """:func:`returning_credit` given ``least``, the least served per weight of the sites
    already ready (None: no other site is ready), for a caller that keeps it at hand
    instead of looking at every ready site."""
    if least is None or weight <= 0:
        return served
    return max(served, (least - RETURN_GRACE) * weight)
