"""Shards: each shard's indexes (ready per task type, leased, the inbox of small sites) as the
scripts keep them, against a real Redis (both dedupe back-ends, and a cluster)."""

from __future__ import annotations

import hashlib
import itertools
from typing import Any

import pytest

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import GROUP, STREAMS, TASK_TYPES, stream_for
from streams_sched.frontier.records import Entry
from streams_sched.politeness.policy import pause_site, resume_site, set_policy

from helpers import frontier, inbox_of, wait_for

pytestmark = pytest.mark.cluster

WEIGHTS = (1, 1, 1)


def out(i: int | str, stream: int = 1, delay_ms: int = 0) -> Entry:
    return Entry(hashlib.sha1(str(i).encode()).digest(), stream, delay_ms, f"payload-{i}".encode())


def redis_ms(f: Frontier) -> int:
    seconds, micros = f.client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def same_shard_sites(f: Frontier, n: int, shard: int | None = None) -> list[str]:
    """``n`` site names of one shard (the shard of the first such name, or ``shard``)."""
    found: list[str] = []
    for i in itertools.count():
        site = f"s{i}.test"
        if shard is None:
            shard = f.site(site).shard
        if f.site(site).shard == shard:
            found.append(site)
            if len(found) == n:
                return found
    raise AssertionError("unreachable")


def ready_score(f: Frontier, site: str, task: str = "http") -> float | None:
    return f.client.zscore(f.site(site).index.ready(task), site)


def named(f: Frontier, shard: int, tasks: str = "hb") -> list[str]:
    """The ready sites one lease call of ``shard`` names (it leases nothing)."""
    return f.lease_shard(shard, "w", [], WEIGHTS, name=8, tasks=tasks).named


def test_one_url_to_a_fresh_site_waits_in_the_inbox_until_the_ninth(redis_url: str, dedupe: str, crawl: str) -> None:
    """One URL to a fresh site goes to its shard's inbox (no stream), counts as backlog and puts
    the site in the http list of new sites; the 9th request moves the inbox into the stream, in order."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    k = f.site("a.test")
    assert f.enqueue("a.test", [out(0)])[0] == 1
    assert f.client.exists(*k.streams) == 0
    assert inbox_of(f, "a.test") == [(1, b"payload-0")]
    assert f.status("a.test").backlog == 1
    assert [f.client.lrange(key, 0, -1) for key in k.index.freshes] == [[b"a.test"], []]
    assert all(ready_score(f, "a.test", t) is None for t in TASK_TYPES)
    assert f.client.sismember(k.index.sites, "a.test")
    before = redis_ms(f)
    assert f.enqueue("a.test", [out(1)])[0] == 1
    score = ready_score(f, "a.test")  # a known site's work goes in the ready index
    assert score is not None and before <= score <= redis_ms(f)
    for i in range(2, 8):
        assert f.enqueue("a.test", [out(i)])[0] == 1
    assert f.client.exists(*k.streams) == 0 and len(inbox_of(f, "a.test")) == 8
    assert f.enqueue("a.test", [out(8)])[0] == 1
    payloads = [fields[b"r"] for _, fields in f.client.xrange(k.stream("http", "default"))]
    assert payloads == [f"payload-{i}".encode() for i in range(9)]
    assert inbox_of(f, "a.test") == [] and f.client.hexists(k.index.inbox, "a.test") == 0
    st = f.status("a.test")
    assert (st.backlog, st.pending) == (9, 0)
    assert ready_score(f, "a.test") == score  # ready since the second request, not the ninth


def test_lease_from_the_inbox_then_ack_leaves_no_trace(redis_url: str, dedupe: str, crawl: str) -> None:
    """Requests waiting in the inbox are leased through the stream (XREADGROUP: they end pending
    there); once acked the site has no stream and is in neither the ready nor the leased index."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    k = f.site("a.test")
    f.enqueue("a.test", [out(0), out(1, stream=stream_for("browser", 0)), out(2)])
    assert f.client.exists(*k.streams) == 0 and len(inbox_of(f, "a.test")) == 3
    reply = f.lease("a.test", "w1", 10, WEIGHTS, max_browser=10)
    assert sorted(e.payload for e in reply.entries) == [b"payload-0", b"payload-1", b"payload-2"]
    assert inbox_of(f, "a.test") == []
    http, browser = k.stream("http", "default"), k.stream("browser", "high")
    assert f.client.xpending(http, GROUP)["pending"] == 2 and f.client.xpending(browser, GROUP)["pending"] == 1
    assert [e.payload for e in reply.entries if STREAMS[e.stream] == ("http", "default")] == [b"payload-0", b"payload-2"]
    assert f.client.zscore(k.index.leased, "a.test") is not None
    assert all(ready_score(f, "a.test", t) is None for t in TASK_TYPES)  # no backlog left
    assert f.ack("a.test", [(e.stream, e.id) for e in reply.entries]) == 3
    assert f.client.exists(*k.streams) == 0
    assert all(ready_score(f, "a.test", t) is None for t in TASK_TYPES)
    assert f.client.zscore(k.index.leased, "a.test") is None
    assert f.status("a.test").is_empty


def test_a_due_delayed_request_promoted_beside_the_inbox_stays_leasable(redis_url: str, dedupe: str, crawl: str) -> None:
    """A lease that flushes a site's inbox and promotes its due delayed request in the same
    call counts both as backlog: what it does not lease keeps the site in the ready index."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    before = redis_ms(f)
    f.enqueue("a.test", [out("now"), out("later", delay_ms=1)])
    assert len(inbox_of(f, "a.test")) == 1 and f.status("a.test").delayed == 1
    wait_for(lambda: redis_ms(f) >= before + 2, timeout=5, interval=0.001, what="the delayed request to be due")
    first = f.lease("a.test", "w1", 1, WEIGHTS)
    assert [e.payload for e in first.entries] == [b"payload-now"]
    assert first.backlog_http == 1 and f.status("a.test").backlog == 1  # the promoted one
    assert ready_score(f, "a.test") is not None, "a site with backlog left its shard's ready index"
    f.ack("a.test", [(e.stream, e.id) for e in first.entries])
    assert "a.test" in named(f, f.site("a.test").shard or 0)
    assert [e.payload for e in f.lease("a.test", "w1", 1, WEIGHTS).entries] == [b"payload-later"]


def test_one_lease_call_serves_several_sites_within_its_budget(redis_url: str, dedupe: str, crawl: str) -> None:
    """One lease_shard call leases from several sites of one shard, each at most its own max,
    all together at most the call's budget; a site reached once the budget is spent is not
    looked at, and the call names the shard's ready sites."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    a, b, c = same_shard_sites(f, 3)
    for site in (a, b, c):
        f.enqueue(site, [out(f"{site}-{i}") for i in range(5)])
    shard = f.site(a).shard
    assert shard is not None
    plans = [(a, 2, 2, 0), (b, 5, 5, 0), (c, 5, 5, 0)]
    reply = f.lease_shard(shard, "w1", plans, WEIGHTS, name=8, budget=5)
    got = [None if r is None else len(r.entries) for r in reply.sites]
    assert got == [2, 3, None]  # a's max, then what the budget left for b; c untouched
    assert [f.status(s).pending for s in (a, b, c)] == [2, 3, 0]
    assert [f.status(s).backlog for s in (a, b, c)] == [3, 2, 5]
    assert sorted(reply.named) == sorted([a, b, c])  # each still has backlog
    assert reply.sites[1] is not None and all(e.site == b for e in reply.sites[1].entries)


def test_one_ack_call_acks_several_sites_of_a_shard(redis_url: str, dedupe: str, crawl: str) -> None:
    """One ack_shard call acks entries of several sites of one shard, each counted in its own
    part; a site left holding nothing leaves the leased index, one still holding stays."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    a, b = same_shard_sites(f, 2)
    for site in (a, b):
        f.enqueue(site, [out(f"{site}-{i}") for i in range(2)])
    got = {site: f.lease(site, "w1", 2, WEIGHTS).entries for site in (a, b)}
    leased = f.site(a).index.leased
    reply = f.ack_shard([(a, [(e.stream, e.id) for e in got[a]], None, ()), (b, [(got[b][0].stream, got[b][0].id)], None, ())])
    assert [int(n) for n in reply] == [2, 1]
    assert (f.client.zscore(leased, a), f.client.zscore(leased, b) is not None) == (None, True)
    assert [f.status(s).stats.get("acked") for s in (a, b)] == [2, 1]


def test_a_rate_limited_site_leaves_the_ready_index_until_its_token_is_due(redis_url: str, dedupe: str, crawl: str) -> None:
    """A site whose rate is spent is scored in its shard's ready index at its next token's time:
    not named before it, named (and leased) once Redis time reaches it."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    set_policy(f, "a.test", {"rate": 4, "burst": 1})
    f.enqueue("a.test", [out(i) for i in range(3)])
    shard = f.site("a.test").shard
    assert shard is not None
    before = redis_ms(f)
    first = f.lease("a.test", "w1", 10, WEIGHTS)
    after = redis_ms(f)
    assert len(first.entries) == 1 and 200 <= first.wait_ms <= 250
    score = ready_score(f, "a.test")
    assert score is not None and before + first.wait_ms <= score <= after + first.wait_ms
    assert "a.test" not in named(f, shard)
    wait_for(lambda: "a.test" in named(f, shard), timeout=5, interval=0.01, what="the site's token time")
    assert redis_ms(f) >= score
    assert len(f.lease("a.test", "w1", 10, WEIGHTS).entries) == 1


#: long enough that a site is surely not named again between a lease and the look after it
PAUSED_WAIT_MS = 150


def test_a_paused_site_is_not_named_until_it_is_resumed(redis_url: str, dedupe: str, crawl: str) -> None:
    """A lease that finds a site paused puts it back for the paused wait; each time it is named
    again while paused it leases nothing and goes back; resumed, it is named and leased."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    pause_site(f, "a.test")
    f.enqueue("a.test", [out(0)])
    shard = f.site("a.test").shard
    assert shard is not None

    def lease() -> Any:
        return f.lease_shard(shard, "w1", [("a.test", 5, 5, 0)], WEIGHTS, name=8, paused_wait_ms=PAUSED_WAIT_MS)

    for _ in range(2):
        looked = redis_ms(f)
        reply = lease()
        assert reply.sites[0] is not None and reply.sites[0].wait_ms == -1 and reply.sites[0].entries == []
        assert "a.test" not in reply.named and "a.test" not in named(f, shard)
        wait_for(lambda: "a.test" in named(f, shard), timeout=5, interval=0.01, what="the paused wait")
        assert redis_ms(f) >= looked + PAUSED_WAIT_MS
    resume_site(f, "a.test")
    assert "a.test" in named(f, shard)
    reply = lease()
    assert reply.sites[0] is not None and [e.payload for e in reply.sites[0].entries] == [b"payload-0"]


def test_shard_counts_are_zero_once_a_crawl_drains(redis_url: str, dedupe: str, crawl: str) -> None:
    """After every request of many sites (inbox, stream, browser, delayed, dead-lettered) is
    leased and finished, every shard's indexes are empty, whatever the number of idle sites."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    sites = [f"d{i}.test" for i in range(60)]
    f.register_sites([f"idle{i}.test" for i in range(200)])  # sites that never get a request
    total = 0
    for i, site in enumerate(sites):
        items = [out(f"{site}-{j}") for j in range(1 + 10 * (i % 5 == 0))]  # some past the inbox
        if i % 7 == 0:
            items.append(out(f"{site}-b", stream=stream_for("browser", 1)))
        if i % 11 == 0:
            items.append(out(f"{site}-later", delay_ms=50))
        total += f.enqueue(site, items)[0]
    assert any(c[0] for c in f.shard_counts())
    finished = 0
    dead = 0

    def work() -> bool:
        nonlocal finished, dead
        for shard in range(f.shards):
            for site in named(f, shard):
                reply = f.lease(site, "w1", 100, WEIGHTS, max_browser=100)
                entries = [(e.stream, e.id) for e in reply.entries]
                if entries and site == sites[3]:  # one site's requests fail for good
                    dead += f.dead_letter(site, "w1", [(s, i, "gave up") for s, i in entries])
                elif entries:
                    finished += f.ack(site, entries)
        return finished + dead == total

    wait_for(work, timeout=30, interval=0.01, what="every request to be finished")
    assert dead > 0
    assert [c[:3] for c in f.shard_counts()] == [(0, 0, 0)] * f.shards
    assert sum(c[3] for c in f.shard_counts()) == total
    assert all(f.client.hlen(f.shard(n).inbox) == 0 for n in range(f.shards))
    assert all(st.is_empty for st in f.status_many(sites))


def test_a_new_site_leased_before_it_is_named_is_counted_twice_until_a_lease_call_skips_it(
    redis_url: str, dedupe: str, crawl: str
) -> None:
    """A listed site leased before a lease call popped it (by name here; a worker's site that got
    more work is named from the ready index) stays in its fresh list and, with work left, its ready
    index: the shard's ready figure counts it twice until the next lease call pops it, sees its
    inbox flushed and leaves its ready score alone."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    k = f.site("a.test")
    shard = k.shard or 0
    f.enqueue("a.test", [out(0), out(1)])
    assert f.lease("a.test", "w1", 1, WEIGHTS).entries
    score = ready_score(f, "a.test")
    assert score is not None and f.client.llen(k.index.freshes[0]) == 1
    assert f.shard_counts()[shard][0] == 2
    assert named(f, shard) == ["a.test"]
    assert f.client.llen(k.index.freshes[0]) == 0 and ready_score(f, "a.test") == score
    assert f.shard_counts()[shard][0] == 1


def test_new_sites_move_into_the_ready_index_as_lease_calls_name_them(redis_url: str, dedupe: str, crawl: str) -> None:
    """200 new sites of one shard wait in its fresh list, not its ready index; a lease call moves
    eight times what it names, oldest first, so the index holds a few calls' worth, and naming and
    leasing again and again serves every site once and empties both."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    sites = same_shard_sites(f, 200)
    shard = f.site(sites[0]).shard or 0
    ix = f.shard(shard)
    for s in sites:
        f.enqueue(s, [out(s)])
    assert f.client.llen(ix.freshes[0]) == 200 and f.client.zcard(ix.ready("http")) == 0
    first = f.lease_shard(shard, "w1", [], WEIGHTS, name=8, spread=0)
    assert set(first.named) <= set(sites[:64])
    assert f.client.zcard(ix.ready("http")) == 64 and f.client.llen(ix.freshes[0]) == 136
    served: list[str] = []
    names = first.named
    for _ in range(100):
        plans = [(s, 1, 1, 0) for s in names]
        reply = f.lease_shard(shard, "w1", plans, WEIGHTS, name=8, spread=0)
        for s, r in zip(names, reply.sites, strict=True):
            assert r is not None
            served += [s] * len(r.entries)
            f.ack(s, [(e.stream, e.id) for e in r.entries])
        names = reply.named
        if not names:
            break
    assert sorted(served) == sorted(sites)
    assert f.client.llen(ix.freshes[0]) == 0 and f.client.zcard(ix.ready("http")) == 0
    assert f.shard_counts()[shard][:3] == (0, 0, 0)


def test_new_sites_are_served_while_busy_sites_fill_the_oldest_places(redis_url: str, dedupe: str, crawl: str) -> None:
    """With more always-ready sites of long backlog than a call looks at, every lease call still
    moves a quarter of what it names from the fresh list, so new sites reach the ready index and
    are named after the busy sites that were ready before them."""
    f = frontier(redis_url, crawl, dedupe)
    f.ensure_layout()
    sites = same_shard_sites(f, 80)
    busy, new = sites[:72], sites[72:]
    shard = f.site(busy[0]).shard or 0
    ix = f.shard(shard)
    for s in busy:
        f.enqueue(s, [out(f"{s}-{i}") for i in range(20)])  # past the inbox: streams, in the ready index
    for s in new:
        f.enqueue(s, [out(s)])
    assert f.client.zcard(ix.ready("http")) == 72 and f.client.llen(ix.freshes[0]) == 8
    named_new: set[str] = set()
    for _ in range(40):
        reply = f.lease_shard(shard, "w1", [], WEIGHTS, name=8, spread=0)
        plans = [(s, 1, 1, 0) for s in reply.named]
        leased = f.lease_shard(shard, "w1", plans, WEIGHTS, name=0)
        for s, r in zip(reply.named, leased.sites, strict=True):
            assert r is not None
            f.ack(s, [(e.stream, e.id) for e in r.entries])
        named_new |= set(reply.named) & set(new)
        if named_new == set(new):
            break
    assert named_new == set(new)
    assert f.client.llen(ix.freshes[0]) == 0
