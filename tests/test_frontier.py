"""The server-side scripts, through Frontier, against a real Redis (both dedupe back-ends)."""

from __future__ import annotations

import hashlib
import threading
import time

import pytest
import redis

from streams_sched.connect.clients import connect
from streams_sched.frontier.keycache import SiteKeyCache
from streams_sched.frontier.keys import DEFAULT_SHARDS, GROUP, STREAMS, ShardKeys, SiteKeys, shard_of
from streams_sched.frontier.records import Entry

from helpers import false_positive_rate, frontier, queued, wait_for, with_user

pytestmark = pytest.mark.cluster


def fp(i: int | str) -> bytes:
    return hashlib.sha1(str(i).encode()).digest()


def out(i: int | str, stream: int = 1, delay_ms: int = 0, dedupe: bool = True) -> Entry:
    return Entry(fp(i) if dedupe else b"", stream, delay_ms, f"payload-{i}".encode())


def test_enqueue_adds_each_fingerprint_once(redis_url: str, dedupe: str, crawl: str) -> None:
    """A fingerprint seen before is dropped, within a batch and across batches."""
    f = frontier(redis_url, crawl, dedupe)
    reply = f.enqueue("a.test", [out(1), out(2), out(1)])
    assert (reply.added, reply.duplicates, reply.delayed, reply.flags) == (2, 1, 0, b"110")
    reply = f.enqueue("a.test", [out(2), out(3)])
    assert (reply.added, reply.duplicates, reply.flags) == (1, 1, b"01")
    assert f.status("a.test").backlog == 3  # (a small site's requests may wait in its shard's inbox)


def test_dont_filter_skips_dedupe(redis_url: str, dedupe: str, crawl: str) -> None:
    """An empty fingerprint (dont_filter=True) is added every time."""
    f = frontier(redis_url, crawl, dedupe)
    assert f.enqueue("a.test", [out(1, dedupe=False), out(1, dedupe=False)])[0] == 2


def test_sites_dedupe_independently(redis_url: str, dedupe: str, crawl: str) -> None:
    """Each site has its own seen filter, also beside another site of its shard in one call."""
    f = frontier(redis_url, crawl, dedupe)
    assert f.enqueue("a.test", [out(1)])[0] == 1
    assert f.enqueue("b.test", [out(1)])[0] == 1
    assert f.site("a.test").shard == f.site("s.test").shard  # one enqueue.lua call serves both
    parts = f.enqueue_shard([("a.test", [out(2), out(1)]), ("s.test", [out(2), out(1)])])
    assert [(p.added, p.duplicates) for p in parts] == [(1, 1), (2, 0)]


def test_a_site_that_comes_twice_in_one_call_is_deduped_and_queued_across_its_parts(
    redis_url: str, dedupe: str, crawl: str
) -> None:
    """A new site split over two parts of one call: the second part sees the first's fingerprints and queue."""
    f = frontier(redis_url, crawl, dedupe)
    first = [out(i) for i in range(10)]
    second = [out(i) for i in range(5, 15)]  # 5 repeats, and past the inbox's room
    parts = f.enqueue_shard([("a.test", first), ("s.test", [out(1)]), ("a.test", second)])
    assert [(p.added, p.duplicates) for p in parts] == [(10, 0), (1, 0), (5, 5)]
    assert sorted(queued(f, "a.test", "http")) == sorted(f"payload-{i}".encode() for i in range(15))
    assert f.enqueue("a.test", [out(i) for i in range(16)])[:2] == (1, 15)
    assert set(f.sites()) == {"a.test", "s.test"}


def test_a_policy_set_before_a_site_has_work_applies_to_its_first_requests(
    redis_url: str, dedupe: str, crawl: str
) -> None:
    """A site given a policy before any request still routes by its task type and holds its page cap."""
    from streams_sched.frontier.keys import stream_for
    from streams_sched.politeness.policy import set_policy

    f = frontier(redis_url, crawl, dedupe)
    set_policy(f, "p.test", {"task_type": "browser", "max_pages": 2})
    reply = f.enqueue("p.test", [Entry(fp(i), stream_for(None, 1), 0, b"p%d" % i) for i in range(3)])
    assert reply.added == 2 and reply.flags == b"11c" and reply.over_cap == 1
    assert queued(f, "p.test", "browser") == [b"p0", b"p1"] and queued(f, "p.test", "http") == []


def test_a_site_in_the_inbox_has_no_stats_hash_and_counts_each_request_once(
    redis_url: str, dedupe: str, crawl: str
) -> None:
    """A one-URL site is counted as enqueued from its enqueue on, with no stats hash, once only after its lease, and its inbox field reads as before."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1)])
    f.enqueue("a.test", [out(2)])  # appended to the same inbox list
    assert f.client.exists(f.site("a.test").stats) == 0
    assert f.status("a.test").stats["enqueued"] == 2
    # the mark follows the list: a worker of 0.1.0 unpacks the list as before
    raw = f.client.hget(f.site("a.test").index.inbox, "a.test")
    assert f.client.eval("local list = cmsgpack.unpack(ARGV[1]); return #list", 0, raw) == 4
    entries = f.lease("a.test", "w1", 10, (1, 1, 1)).entries
    assert len(entries) == 2 and f.status("a.test").stats["enqueued"] == 2
    f.ack("a.test", [(e.stream, e.id) for e in entries])
    st = f.status("a.test")
    assert (st.stats["enqueued"], st.stats["acked"], st.backlog) == (2, 2, 0)


def test_an_inbox_list_counted_at_enqueue_is_not_counted_again(redis_url: str, dedupe: str, crawl: str) -> None:
    """An inbox list 0.1.0 wrote (counted as it was enqueued, no mark) is counted once by this version."""
    import msgpack

    from streams_sched.frontier.keys import stream_code

    f = frontier(redis_url, crawl, dedupe)
    k = f.site("a.test")
    # as 0.1.0 left a site with one queued request
    f.register_sites(["a.test"])
    f.client.hset(k.stats, "enqueued", 1)
    f.client.hset(k.index.inbox, "a.test", msgpack.packb([stream_code(1), b"old"], use_bin_type=False))
    f.enqueue("a.test", [out(2)])
    assert f.status("a.test").stats["enqueued"] == 2
    entries = f.lease("a.test", "w1", 10, (1, 1, 1)).entries
    assert sorted(e.payload for e in entries) == [b"old", b"payload-2"]
    assert f.status("a.test").stats["enqueued"] == 2


def test_a_stream_code_out_of_range_is_refused_by_name_on_a_new_site_and_a_known_one(
    redis_url: str, dedupe: str, crawl: str
) -> None:
    """An entry whose stream code names no stream is refused with STREAMSARG, whether its site is new or known."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("known.test", [out(1)])
    for site in ("new.test", "known.test"):
        with pytest.raises(redis.ResponseError, match="STREAMSARG stream index 8 out of range"):
            f.enqueue(site, [out(2, stream=7)])


def test_every_key_of_a_site_shares_one_cluster_slot(crawl: str) -> None:
    """All keys of one site hash to the same Redis Cluster slot, with its shard's indexes."""
    from redis.crc import key_slot

    shard = shard_of("example.com", DEFAULT_SHARDS)
    keys = SiteKeys(crawl, "example.com", shard).all + ShardKeys(crawl, shard).all
    assert len({key_slot(k.encode()) for k in keys}) == 1


def test_the_site_key_cache_keeps_the_sites_in_hand_not_every_site_served() -> None:
    """The site key cache keeps a site in use and drops one unused for two generations, so its size stays bound."""
    cache = SiteKeyCache(size=4)
    held = cache.add(SiteKeys("c", "held.test", shard_of("held.test", 16)))
    for i in range(1000):
        cache.get(f"s{i}.test") or cache.add(SiteKeys("c", f"s{i}.test", 1))
        if i % 3 == 0:
            assert cache.get("held.test") is held
        assert len(cache) <= 8
    assert cache.get("s0.test") is None and cache.get("s999.test") is not None


def test_bloom_false_positive_rate_is_within_the_setting(redis_url: str, dedupe: str, crawl: str) -> None:
    """At capacity, new fingerprints are wrongly called duplicates at most at the configured rate."""
    f = frontier(redis_url, crawl, dedupe, capacity=20_000, error_rate=0.01)
    for i in range(0, 20_000, 1000):
        f.enqueue("s.test", [Entry(fp(f"in{j}"), 1, 0, b"x") for j in range(i, i + 1000)])
    rate = false_positive_rate(f, "s.test", lambda names: [Entry(fp(n), 1, 0, b"x") for n in names])
    assert rate <= 0.01 * 1.5


def test_bloom_grows_past_its_capacity(redis_url: str, dedupe: str, crawl: str) -> None:
    """Past the initial capacity the filter adds layers instead of filling up."""
    f = frontier(redis_url, crawl, dedupe, capacity=500)
    total = 0
    for i in range(0, 5000, 500):
        total += f.enqueue("s.test", [Entry(fp(j), 1, 0, b"x") for j in range(i, i + 500)])[0]
    assert total >= 4990  # a handful of false positives at most
    dups = sum(f.enqueue("s.test", [Entry(fp(j), 1, 0, b"x") for j in range(i, i + 500)])[1] for i in range(0, 5000, 500))
    assert dups == 5000


def test_lease_reads_bands_in_ratio_and_never_starves_low(redis_url: str, dedupe: str, crawl: str) -> None:
    """With weights 5:3:2 and every band backlogged, each band is served in proportion."""
    f = frontier(redis_url, crawl, dedupe)
    items = [out(f"{band}-{i}", stream=band) for band in range(3) for i in range(100)]
    f.enqueue("a.test", items)
    counts = [0, 0, 0]
    for _ in range(10):
        reply = f.lease("a.test", "w1", 10, (5, 3, 2))
        for e in reply.entries:
            counts[e.stream] += 1
    assert counts == [50, 30, 20]


def test_band_rotation_alone_serves_each_band_its_share_and_skips_empty_ones(redis_url: str, crawl: str) -> None:
    """lib/bands.lua's band_takes: 5:3:2 over ten takes gives each band its share, in a
    smooth order; a band without backlog is skipped, its share going to the others."""
    from streams_sched.frontier.scripts import read_lua

    f = frontier(redis_url, crawl)
    body = """
    local cur, out = { 0, 0, 0 }, {}
    for _ = 1, 10 do
      local take = band_takes(cur, { 5, 3, 2 }, { 100, tonumber(ARGV[1]), 100 }, 1)
      for b = 1, 3 do
        if take[b] > 0 then out[#out + 1] = b end
      end
    end
    return { out, band_takes({ 0, 0, 0 }, { 5, 3, 2 }, { 100, tonumber(ARGV[1]), 100 }, 10) }
    """
    script = read_lua("lib/codes.lua") + read_lua("lib/bands.lua") + body
    order, takes = f.client.eval(script, 0, 100)
    assert takes == [5, 3, 2] and sorted(order) == [1] * 5 + [2] * 3 + [3] * 2
    assert order[:3] == [1, 2, 3]  # smooth: low is served within the first round, not after high's five
    order, takes = f.client.eval(script, 0, 0)
    assert takes == [7, 0, 3] and 2 not in order


def test_lease_strict_weights_serve_high_first(redis_url: str, dedupe: str, crawl: str) -> None:
    """Huge weight ratios behave like strict priority: high, then default, then low."""
    from streams_sched.config import STRICT_RATIO

    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out("l", 2), out("d", 1), out("h", 0)])
    got = [f.lease("a.test", "w1", 1, STRICT_RATIO).entries[0].payload for _ in range(3)]
    assert got == [b"payload-h", b"payload-d", b"payload-l"]


def test_ack_removes_entries_and_counts_once(redis_url: str, dedupe: str, crawl: str) -> None:
    """An acked entry leaves the stream; acking it again counts nothing."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1), out(2)])
    entries = f.lease("a.test", "w1", 10, (1, 1, 1)).entries
    ids = [(e.stream, e.id) for e in entries]
    assert f.ack("a.test", ids) == 2
    assert f.ack("a.test", ids) == 0
    st = f.status("a.test")
    assert (st.backlog, st.pending, st.stats["acked"]) == (0, 0, 2)
    assert f.client.xlen(f.site("a.test").stream("http", "default")) == 0


def test_an_entry_whose_lease_a_failover_lost_is_counted_when_acked(redis_url: str, dedupe: str, crawl: str) -> None:
    """An ack of an entry that is no longer pending (a promoted replica kept the entry but
    not its lease) deletes it and counts it, so enqueued and acked balance."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1), out(2)])
    entries = f.lease("a.test", "w1", 10, (1, 1, 1)).entries
    stream = f.site("a.test").stream("http", "default")
    f.client.xack(stream, f.group, entries[0].id)  # the lease is gone, the entry is not
    assert f.ack("a.test", [(e.stream, e.id) for e in entries]) == 2
    st = f.status("a.test")
    assert (st.backlog, st.pending, st.stats["acked"], st.stats["enqueued"]) == (0, 0, 2, 2)


def test_a_site_stays_named_for_takeover_while_it_has_expired_leases(redis_url: str, dedupe: str, crawl: str) -> None:
    """Taking over one of a dead worker's expired leases leaves the site named for takeover
    while more of them are expired (not one lease per lease time), and unnamed after the last."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(i) for i in range(3)])
    assert len(f.lease("a.test", "dead-worker", 3, (1, 1, 1)).entries) == 3
    wait_for(lambda: "a.test" in f.expired_sites(50, 10), timeout=10, what="the leases to expire")
    for left in (2, 1):
        assert f.claim("a.test", "w2", 50, 1, 5)[0] == 1
        assert "a.test" in f.expired_sites(50, 10), f"{left} expired leases left, but the site is not named"
    assert f.claim("a.test", "w2", 50, 1, 5)[0] == 1
    assert "a.test" not in f.expired_sites(50, 10)


def test_expired_lease_is_claimed_by_another_worker(redis_url: str, dedupe: str, crawl: str) -> None:
    """An entry leased by a worker that never acks is taken over once its lease expires."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1)])
    first = f.lease("a.test", "dead-worker", 1, (1, 1, 1)).entries[0]
    taken, dead, entries = f.claim("a.test", "w2", 60_000, 10, 5)
    assert (taken, entries) == (0, [])  # not expired yet
    time.sleep(0.02)
    taken, dead, entries = f.claim("a.test", "w2", 10, 10, 5)
    assert (taken, dead) == (1, 0)
    assert entries[0].id == first.id and entries[0].payload == b"payload-1"
    pending = f.client.xpending_range(f.site("a.test").stream("http", "default"), GROUP, "-", "+", 10)
    assert pending[0]["consumer"] == b"w2" and pending[0]["times_delivered"] == 2
    assert entries[0].deliveries == 1  # the expired delivery


def test_entry_delivered_too_often_goes_to_dead_letters(redis_url: str, dedupe: str, crawl: str) -> None:
    """Past STREAMS_MAX_DELIVERIES an expired entry moves to the dead-letter stream with the reason."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out("poison")])
    f.lease("a.test", "w0", 1, (1, 1, 1))
    for n in range(2, 4):  # deliveries 2 and 3 are allowed with max 3
        time.sleep(0.005)
        taken, dead, _ = f.claim("a.test", f"w{n}", 1, 10, 3)
        assert (taken, dead) == (1, 0)
    time.sleep(0.005)
    taken, dead, entries = f.claim("a.test", "w9", 1, 10, 3)
    assert (taken, dead, entries) == (0, 1, [])
    letters = f.dead_letters("a.test")
    assert len(letters) == 1
    assert letters[0]["r"] == b"payload-poison"
    assert b"delivered 4 times" in letters[0]["reason"]
    st = f.status("a.test")
    assert (st.backlog, st.pending, st.dead_letters) == (0, 0, 1)


def test_requeue_mode_puts_expired_leases_back_in_the_stream(redis_url: str, dedupe: str, crawl: str) -> None:
    """The reclaimer's requeue puts an expired entry back as backlog, keeping its delivery count."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1)])
    f.lease("a.test", "dead", 1, (1, 1, 1))
    time.sleep(0.005)
    taken, dead, entries = f.claim("a.test", "reclaimer", 1, 10, 5, mode="requeue")
    assert (taken, dead, entries) == (1, 0, [])
    st = f.status("a.test")
    assert (st.backlog, st.pending) == (1, 0)
    again = f.lease("a.test", "w2", 1, (1, 1, 1)).entries[0]
    assert again.payload == b"payload-1" and again.deliveries == 1


def test_release_hands_back_only_own_leases(redis_url: str, dedupe: str, crawl: str) -> None:
    """A stopping worker's unstarted leases go back to the backlog; others' leases are untouched."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1), out(2)])
    mine = f.lease("a.test", "me", 1, (1, 1, 1)).entries[0]
    theirs = f.lease("a.test", "other", 1, (1, 1, 1)).entries[0]
    assert f.release("a.test", "me", [(mine.stream, mine.id), (theirs.stream, theirs.id)]) == 1
    st = f.status("a.test")
    assert (st.backlog, st.pending) == (1, 1)
    back = f.lease("a.test", "w3", 5, (1, 1, 1)).entries
    assert [e.payload for e in back] == [b"payload-1"] and back[0].deliveries == 0


def test_an_expired_lease_outside_a_claimers_mask_stays_due_for_the_others(redis_url: str, dedupe: str, crawl: str) -> None:
    """A worker that cannot take an expired browser lease (an http-only one) leaves the site
    due for takeover at once, so a browser worker's next look takes it, a lease sooner."""
    from streams_sched.frontier.keys import stream_for, stream_mask

    # a lease of 100 ms: long enough that the lease the http-only worker takes is surely not
    # expired again when the browser worker looks (at 20 ms, a loaded machine made it so)
    lease_ms = 100
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out("page", stream=stream_for("browser", 1)), out("plain")])
    assert len(f.lease("a.test", "gone", 2, (1, 1, 1), max_browser=1).entries) == 2
    time.sleep(lease_ms / 1000 + 0.01)
    taken, _, entries = f.claim("a.test", "http-only", lease_ms, 10, 5, mask=stream_mask(["http"]))
    assert taken == 1 and entries[0].payload == b"payload-plain"
    assert f.expired_sites(lease_ms, 10) == ["a.test"]  # the browser lease is still expired
    taken, _, entries = f.claim("a.test", "browser", lease_ms, 10, 5)
    assert taken == 1 and entries[0].payload == b"payload-page"
    assert f.expired_sites(lease_ms, 10) == []  # both leases fresh again: looked at a lease from now


def test_failed_deliveries_go_back_counted_then_to_dead_letters_with_the_reason(redis_url: str, dedupe: str, crawl: str) -> None:
    """A failed delivery (a render that timed out) puts the entry back with the delivery
    counted, for any worker; at STREAMS_MAX_DELIVERIES it is dead-lettered with the error."""
    from streams_sched.frontier.keys import stream_for

    f = frontier(redis_url, crawl, dedupe)
    browser = stream_for("browser", 1)
    f.enqueue("a.test", [out("page", stream=browser)])
    for n in range(3):
        [e] = f.lease("a.test", f"w{n}", 1, (1, 1, 1), max_browser=1, max_suspects=1).entries
        assert (e.stream, e.deliveries, e.payload) == (browser, n, b"payload-page")
        assert f.fail("a.test", "someone-else", 3, [(e.stream, e.id, "not theirs")]) == (0, 0)
        reply = f.fail("a.test", f"w{n}", 3, [(e.stream, e.id, "TimeoutError: Page.goto: Timeout 1000ms exceeded.")])
        assert (reply.requeued, reply.dead) == ((1, 0) if n < 2 else (0, 1))
    st = f.status("a.test")
    assert (st.backlog, st.pending, st.dead_letters) == (0, 0, 1)
    [letter] = f.dead_letters("a.test")
    assert letter["reason"] == (b"delivered 3 times (STREAMS_MAX_DELIVERIES=3), the last failed:"
                                b" TimeoutError: Page.goto: Timeout 1000ms exceeded.")
    assert (letter["deliveries"], letter["node"], letter["r"]) == (b"3", b"w2", b"payload-page")
    assert st.stats["failed"] == 2 and st.stats["dead"] == 1
    assert f.leased_sites() == []


def test_dead_letter_records_reason_and_removes_entry(redis_url: str, dedupe: str, crawl: str) -> None:
    """A worker can dead-letter a leased entry it cannot decode; the reason is kept."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1)])
    e = f.lease("a.test", "w1", 1, (1, 1, 1)).entries[0]
    assert f.dead_letter("a.test", "w1", [(e.stream, e.id, "payload is not msgpack")]) == 1
    letter = f.dead_letters("a.test")[0]
    assert letter["reason"] == b"payload is not msgpack" and letter["node"] == b"w1"
    assert f.status("a.test").pending == 0


def test_delayed_request_waits_then_moves_to_its_stream(redis_url: str, dedupe: str, crawl: str) -> None:
    """A request with a delay is not leasable until due, then the lease moves it into its stream."""
    f = frontier(redis_url, crawl, dedupe)
    delay_ms = 150  # long enough that the first lease surely comes before it is due
    assert f.enqueue("a.test", [out(1, stream=0, delay_ms=delay_ms)])[2] == 1
    reply = f.lease("a.test", "w1", 5, (1, 1, 1))
    assert reply.entries == [] and reply.delayed == 1 and 0 <= reply.next_due_in_ms <= delay_ms
    entries = wait_for(lambda: f.lease("a.test", "w1", 5, (1, 1, 1)).entries, timeout=5)
    assert entries[0].payload == b"payload-1" and entries[0].stream == 0
    assert f.status("a.test").delayed == 0


def test_many_movers_move_each_delayed_entry_once(redis_url: str, dedupe: str, crawl: str) -> None:
    """Several processes promoting due entries at once never move one twice or lose one."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(i, delay_ms=50) for i in range(300)])
    time.sleep(0.1)
    moved: list[int] = []

    def mover() -> None:
        local = frontier(redis_url, crawl, dedupe)
        for _ in range(20):
            moved.append(int(local.promote("a.test", limit=7)))

    threads = [threading.Thread(target=mover) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(moved) == 300
    stream = f.site("a.test").stream("http", "default")
    payloads = [fields[b"r"] for _, fields in f.client.xrange(stream)]
    assert sorted(payloads) == sorted(f"payload-{i}".encode() for i in range(300))


def test_malformed_delayed_member_is_dead_lettered(redis_url: str, dedupe: str, crawl: str) -> None:
    """Garbage in the delay queue goes to the dead-letter stream instead of blocking it."""
    f = frontier(redis_url, crawl, dedupe)
    f.client.zadd(f.site("a.test").delayed, {b"garbage": 0})
    f.promote("a.test")
    assert f.status("a.test").dead_letters == 1


def test_status_is_read_only_and_reports_every_stream(redis_url: str, dedupe: str, crawl: str) -> None:
    """status() gives backlog, pending and oldest lease age per stream, run as EVAL_RO."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1, 0), out(2, 1), out(3, 2), out(4, 4)])
    f.lease("a.test", "w1", 1, (1, 1, 1))
    st = f.status("a.test")
    assert st.streams[("http", "high")].pending == 1
    assert st.streams[("browser", "default")].backlog == 1
    assert st.backlog == 3 and st.pending == 1 and st.oldest_pending_ms >= 0
    assert set(st.streams) == set(STREAMS)


def test_status_runs_as_a_read_only_acl_user(redis_url: str, dedupe: str, crawl: str) -> None:
    """A user allowed only read commands and EVALSHA_RO can read a site's status."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", [out(1)])
    everywhere = {"target_nodes": "all"} if f.cluster else {}  # ACL commands go to one node by default
    cluster_rules = ["+cluster|slots", "+cluster|shards", "+command"] if f.cluster else []
    f.client.execute_command(
        "ACL SETUSER", "reader", "reset", "on", ">pw", "~ss:*",
        "+@read", "+evalsha_ro", "+eval_ro", "+time", "+ping", *cluster_rules, **everywhere,
    )
    try:
        ro = connect(with_user(redis_url, "reader", "pw"))
        st = f.status("a.test", client=ro)
        assert st.backlog == 1
        with pytest.raises(redis.exceptions.NoPermissionError):
            ro.xadd(f.site("a.test").stream("http", "high"), {"r": "x"})
    finally:
        f.client.execute_command("ACL DELUSER", "reader", **everywhere)


def test_dedupe_backend_is_fixed_per_crawl(plain_redis_url: str, crawl: str) -> None:
    """A crawl started with one back-end refuses a worker that insists on another."""
    from streams_sched.errors import DedupeBackendError
    from streams_sched.frontier.bloom import detect_dedupe

    client = redis.Redis.from_url(plain_redis_url)
    assert detect_dedupe(client, crawl, "auto") == "bitmap"
    with pytest.raises(DedupeBackendError, match="no RedisBloom"):
        detect_dedupe(client, crawl + "x", "redisbloom")


def test_purge_deletes_every_key_of_the_crawl_and_counts_them(plain_redis_url: str, crawl: str) -> None:
    """purge() leaves no key of the crawl (site keys, shard indexes, meta) and returns how many it deleted."""
    f = frontier(plain_redis_url, crawl)
    f.ensure_layout()
    for n, site in enumerate(["a.test", "b.test", "c.test", "s.test"]):  # a.test and s.test share a shard
        f.enqueue(site, [out(f"{site}-{i}") for i in range(3 + 8 * (n % 2))])  # inbox, and streams
    f.lease("b.test", "w1", 2, (1, 1, 1))
    before = f.client.dbsize()
    assert before > 0
    assert f.purge() == before
    assert f.client.dbsize() == 0


def test_a_leased_entry_carries_the_payload_it_was_enqueued_with(redis_url: str, dedupe: str, crawl: str) -> None:
    """Through the inbox and the stream, a lease returns the enqueued payload as it was: its digest
    identifies the request an enqueue sent (a resend after a failover leaves out what was crawled)."""
    from streams_sched.frontier.records import payload_digest

    f = frontier(redis_url, crawl, dedupe)
    sent = [out(1), out(2)]
    f.enqueue("a.test", sent[:1])
    f.enqueue("a.test", sent[1:])
    leased = f.lease("a.test", "w1", 10, (1, 1, 1)).entries
    assert sorted(payload_digest(e.payload) for e in leased if e.payload) == sorted(payload_digest(e.payload) for e in sent)
