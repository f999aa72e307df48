"""The worker's pure decisions: bands, lease plans, drain detection, Retry-After, local seen cache."""

from __future__ import annotations

import pytest

from streams_sched.politeness.retry_after import retry_after_s
from streams_sched.worker.drain import DrainDetector
from streams_sched.worker.seen import SeenCache
from streams_sched.worker.selection import (
    RETURN_GRACE,
    ShardPlan,
    SiteHint,
    band_for,
    plan_shards,
    returning_credit,
)


def test_band_for_thresholds() -> None:
    """Priority at/above the high threshold is high, at/below the low one is low."""
    assert [band_for(p, 1, -1) for p in (5, 1, 0, -1, -9)] == [0, 0, 1, 2, 2]


def test_returning_site_starts_at_most_the_grace_behind_in_served_per_weight() -> None:
    """A site back from a dry spell starts RETURN_GRACE behind the least served per weight: no long catch-up burst, no lost share."""
    g = RETURN_GRACE
    # weight 3 back while a weight-1 site served 40: level is 40 per weight, so (40 - g) * 3
    assert returning_credit(100.0, 3.0, [(40.0, 1.0)]) == (40.0 - g) * 3
    # weight 1 back while a weight-3 site served 120 (40 per weight): 40 - g, not 120
    assert returning_credit(10.0, 1.0, [(120.0, 3.0), (90.0, 1.0)]) == 40.0 - g
    assert returning_credit(50.0, 1.0, [(120.0, 3.0)]) == 50.0  # never below its own count
    assert returning_credit(5.0, 1.0, []) == 5.0


def _shards(named: list[list[str]], **kw: object) -> list[ShardPlan]:
    """plan_shards at time 1.0 with every shard due and no hints unless given."""
    args: dict[str, object] = {"total_room": 20, "per_site_cap": 8, "browser_room": 0, "name": 16}
    args.update(kw)
    hints = args.pop("hints", {})
    held = args.pop("held", {})
    due = args.pop("due", [0.0] * len(named))
    return plan_shards(1.0, [dict.fromkeys(n) for n in named], due, hints, held, **args)  # type: ignore[arg-type]


def test_shard_plans_respect_the_site_cap_what_is_held_and_the_room() -> None:
    """A named site gets at most its cap, and its weighted share of all the worker can hold
    (20 free + 7 held = 27, / 3 sites = 9), less what it holds; the budgets fit the room."""
    hints = {"c": SiteHint(backlog_http=0, backlog_browser=0)}
    plans = _shards([["a", "b", "c"], []], held={"a": 7}, hints=hints)
    by_site = {p.site: p.total for plan in plans for p in plan.sites}
    assert by_site["a"] == 8 - 7 and by_site["b"] == 8  # the site cap
    plans = _shards([["a", "b", "c"], []], held={"a": 7}, hints=hints, per_site_cap=16)
    by_site = {p.site: p.total for plan in plans for p in plan.sites}
    assert by_site["a"] == 9 - 7 and by_site["b"] == 9  # the weighted share
    assert sum(plan.budget for plan in plans) <= 20


def test_shard_plans_share_the_room_by_weight() -> None:
    """Two named sites of weights 3 and 1 get 3:1 of the room, each within its cap."""
    hints = {"a": SiteHint(weight=3.0), "b": SiteHint(weight=1.0)}
    plans = _shards([["a"], ["b"]], hints=hints, total_room=8, per_site_cap=16)
    by_site = {p.site: p.total for plan in plans for p in plan.sites}
    assert by_site == {"a": 6, "b": 2}


@pytest.mark.parametrize("start", [0, 1])
def test_a_site_at_its_weighted_share_leaves_the_room_to_the_light_one(start: int) -> None:
    """Weights 3:1 over 8 slots: holding 6 and 1, the one free slot goes to the light site,
    whichever shard is asked first, so it does not run dry while the heavy one is topped up."""
    hints = {"a": SiteHint(weight=3.0), "b": SiteHint(weight=1.0)}
    plans = _shards([["a"], ["b"]], hints=hints, held={"a": 6, "b": 1}, total_room=1, per_site_cap=16, start=start)
    assert {p.site: p.total for plan in plans for p in plan.sites} == {"b": 1}
    assert sum(plan.budget for plan in plans) == 1


def test_a_held_site_not_named_still_counts_in_the_weighted_shares() -> None:
    """A heavy site the worker holds but the shards did not name just now still weighs in:
    the light site named alone gets its share of 8 (2), not all of it."""
    hints = {"a": SiteHint(weight=3.0), "b": SiteHint(weight=1.0)}
    plans = _shards([["b"], []], hints=hints, held={"a": 4}, total_room=4, per_site_cap=16)
    assert {p.site: p.total for plan in plans for p in plan.sites} == {"b": 2}


def test_the_weights_kept_by_the_caller_plan_as_the_hints_do() -> None:
    """Given the weights other than 1 (as the pump keeps them), the plans are those the hints alone give."""
    hints = {"a": SiteHint(weight=3.0), "b": SiteHint(weight=1.0), "c": SiteHint(weight=0.5), "d": SiteHint(weight=2.0)}
    kw: dict[str, object] = {"hints": hints, "held": {"a": 2, "d": 1, "e": 1}, "total_room": 9, "per_site_cap": 16}
    named = [["a", "b"], ["c"], []]
    assert _shards(named, weighted={"a": 3.0, "c": 0.5, "d": 2.0}, **kw) == _shards(named, **kw)


def test_a_due_shard_that_named_nothing_is_asked_for_names_in_its_turn() -> None:
    """A shard that named no site is asked for ready sites (leasing nothing) once due, not before."""
    plans = _shards([["a"], []], start=1)
    assert (plans[0].shard, plans[0].sites, plans[0].budget, plans[0].name) == (1, [], 0, 16)
    assert [plan.shard for plan in _shards([["a"], []], start=1, due=[0.0, 5.0])] == [0]


def test_shard_plans_skip_sites_backing_off() -> None:
    """A named site told to wait (rate limit, paused) is not leased before its time."""
    plans = _shards([["a", "b"]], hints={"a": SiteHint(not_before=5.0)})
    assert [p.site for plan in plans for p in plan.sites] == ["b"]


def test_shard_budget_follows_how_many_sites_it_named() -> None:
    """The room is shared among shards in proportion to the sites each named, never past the room."""
    plans = _shards([["a", "b", "c"], ["d"]], total_room=8)
    assert {plan.shard: plan.budget for plan in plans} == {0: 6, 1: 2}


def test_shard_plans_give_browser_slots_only_with_room() -> None:
    """Browser slots go to the first named sites until the browser room is spent; none without room."""
    assert all(p.max_browser == 0 for plan in _shards([["a", "b"]]) for p in plan.sites)
    plans = _shards([["a", "b", "c"]], browser_room=5, per_site_cap=3)
    assert [p.max_browser for plan in plans for p in plan.sites] == [3, 2, 0]


def test_shard_plans_take_shards_in_turn() -> None:
    """Shards are planned from ``start`` on, so no shard is always last."""
    assert [plan.shard for plan in _shards([["a"], ["b"], ["c"]], start=1)] == [1, 2, 0]


def test_drain_needs_two_identical_empty_snapshots() -> None:
    """One empty snapshot is not proof; two equal ones are; any change starts over."""
    d = DrainDetector()
    assert not d.observe({"a": (True, 10)})
    assert d.observe({"a": (True, 10)})
    assert not d.observe({"a": (True, 11)})  # something was enqueued in between
    assert not d.observe({"a": (False, 11)})
    assert not d.observe({"a": (True, 11)})
    assert not d.observe({"a": (True, 11), "b": (True, 1)})  # a new site appeared
    assert d.observe({"a": (True, 11), "b": (True, 1)})


def test_retry_after_forms() -> None:
    """Retry-After in seconds or as an HTTP date; capped; junk ignored."""
    now = 1_000_000_000.0
    assert retry_after_s(b"120", now, 3600) == 120
    assert retry_after_s(b"99999", now, 3600) == 3600
    assert retry_after_s(b"Sun, 09 Sep 2001 01:47:00 GMT", now, 3600) == 20
    assert retry_after_s(b"soon", now, 3600) is None
    assert retry_after_s(None, now, 3600) is None
    assert retry_after_s(b"0", now, 3600) is None


def test_seen_cache_is_bounded() -> None:
    """The local cache remembers recent fingerprints and never grows past its size."""
    cache = SeenCache(10)
    for i in range(100):
        cache.add(bytes([i]))
    assert len(cache) <= 10
    assert bytes([99]) in cache and bytes([0]) not in cache


def test_empty_lease_backoff_doubles_to_the_idle_poll_and_stops_at_the_next_due_request() -> None:
    """Back-off after empty leases: 0.1 s doubling, capped by STREAMS_IDLE_POLL_SECONDS and by the next due delay."""
    from streams_sched.worker.selection import empty_lease_backoff

    assert [empty_lease_backoff(n, 5.0) for n in (1, 2, 3)] == [0.1, 0.2, 0.4]
    assert empty_lease_backoff(30, 5.0) == 5.0
    assert empty_lease_backoff(30, 5.0, next_due_in_ms=250) == 0.25
    assert empty_lease_backoff(1, 5.0, next_due_in_ms=0) == 0.0
