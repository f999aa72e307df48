"""Seen filters that start as exact sets and become Bloom filters, so a small site keeps a
few bytes."""

from __future__ import annotations

import hashlib

import pytest
import redis

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import GROUP
from streams_sched.frontier.records import Entry

from helpers import error_replies, false_positive_rate, frontier

pytestmark = pytest.mark.cluster

#: EXACT_MAX in streams_sched/frontier/lua/lib/bloom.lua
EXACT_MAX = 1024


def fp(i: int | str) -> bytes:
    return hashlib.sha1(str(i).encode()).digest()


def batch(names: list[str]) -> list[Entry]:
    return [Entry(fp(n), 1, 0, n.encode()) for n in names]


def form(f: Frontier, site: str) -> tuple[str, str | None]:
    """(TYPE of the seen key, the meta's w field)."""
    k = f.site(site)
    kind = f.client.type(k.seen)
    w = f.client.hget(k.seen_meta, "w")
    return (kind.decode() if isinstance(kind, bytes) else kind), (w.decode() if isinstance(w, bytes) else w)


def test_small_site_keeps_an_exact_set_of_8_byte_prefixes(redis_url: str, dedupe: str, crawl: str) -> None:
    """A site with a few URLs costs 8 bytes per fingerprint (no pre-sized filter) and still dedupes."""
    f = frontier(redis_url, crawl, dedupe)
    assert f.enqueue("a.test", batch(["1", "2", "1"]))[:2] == (2, 1)
    assert f.enqueue("a.test", batch(["2", "3"]))[:2] == (1, 1)
    k = f.site("a.test")
    assert form(f, "a.test") == ("string", None)
    assert f.client.strlen(k.seen) == 3 * 8
    assert f.client.exists(k.seen_meta) == 0
    assert int(f.client.memory_usage(k.seen) or 0) < 150


def test_conversion_to_bloom_loses_no_fingerprint(redis_url: str, dedupe: str, crawl: str) -> None:
    """Past EXACT_MAX the set becomes a Bloom filter that still knows every fingerprint added before, during and after."""
    f = frontier(redis_url, crawl, dedupe, capacity=5000, error_rate=0.001)
    names = [f"u{i}" for i in range(3000)]
    added = 0
    for i in range(0, 3000, 250):  # batches straddle the conversion point
        added += f.enqueue("big.test", batch(names[i : i + 250]))[0]
    assert added >= 2995  # only Bloom false positives (after the conversion) may drop a new one
    assert form(f, "big.test") == ("MBbloom--" if dedupe == "redisbloom" else "string", "8")
    dups = sum(f.enqueue("big.test", batch(names[i : i + 500]))[1] for i in range(0, 3000, 500))
    assert dups == 3000  # no false negative across the conversion


def test_dedupe_fails_no_call_in_either_form(redis_url: str, dedupe: str, crawl: str) -> None:
    """Deduping against exact sets and converted filters runs no command that fails (each would
    count in INFO errorstats, which operators alert on)."""
    f = frontier(redis_url, crawl, dedupe, capacity=3000)
    f.load_scripts()  # else the first EVALSHA fails with NOSCRIPT (and redis-py loads it)
    before = error_replies(f.client)
    f.enqueue("small.test", batch(["a", "b"]))
    f.enqueue("small.test", batch(["b", "c"]))
    for i in range(0, 1500, 500):
        f.enqueue("big.test", batch([f"w{j}" for j in range(i, i + 500)]))
    assert form(f, "big.test")[1] == "8"
    assert f.enqueue("big.test", batch(["w1", "new"]))[:2] == (1, 1)
    assert error_replies(f.client) == before


def test_conversion_in_one_batch_bigger_than_the_set(redis_url: str, dedupe: str, crawl: str) -> None:
    """One batch that alone overflows the exact set converts at once and drops in-batch repeats."""
    f = frontier(redis_url, crawl, dedupe, capacity=4000)
    names = [f"v{i}" for i in range(EXACT_MAX + 200)]
    added, dups, *_ = f.enqueue("one.test", batch(names + names[:10]))
    assert dups >= 10 and added + dups == len(names) + 10
    assert form(f, "one.test")[1] == "8"
    assert f.enqueue("one.test", batch(names))[1] == len(names)


def test_false_positive_rate_after_conversion_is_within_the_setting(redis_url: str, dedupe: str, crawl: str) -> None:
    """A converted filter at its capacity wrongly calls new fingerprints duplicates at most at the configured rate."""
    f = frontier(redis_url, crawl, dedupe, capacity=20_000, error_rate=0.01)
    for i in range(0, 20_000, 1000):
        f.enqueue("s.test", batch([f"in{j}" for j in range(i, i + 1000)]))
    assert form(f, "s.test")[1] == "8"
    assert false_positive_rate(f, "s.test", batch) <= 0.01 * 1.5


def test_exact_set_is_exact(redis_url: str, dedupe: str, crawl: str) -> None:
    """Below EXACT_MAX no new fingerprint is ever called a duplicate (no false positives at all)."""
    f = frontier(redis_url, crawl, dedupe)
    for site in range(20):
        names = [f"{site}-{i}" for i in range(EXACT_MAX)]
        assert f.enqueue(f"s{site}.test", batch(names))[0] == EXACT_MAX
    assert form(f, "s0.test") == ("string", None)


def test_revisit_bucket_keeps_its_ttl_through_the_conversion(redis_url: str, dedupe: str, crawl: str) -> None:
    """With STREAMS_REVISIT_AFTER_SECONDS the converted filter and its meta still expire."""
    f = frontier(redis_url, crawl, dedupe, capacity=4000, revisit_s=3600, revisit_buckets=2)
    f.enqueue("t.test", batch([f"a{i}" for i in range(10)]))
    f.enqueue("t.test", batch([f"b{i}" for i in range(EXACT_MAX)]))
    seen, meta = f.filters("t.test")[:2]
    assert f.client.hget(meta, "w") == b"8"
    assert f.client.ttl(seen) > 3600
    assert abs(f.client.ttl(meta) - f.client.ttl(seen)) <= 2


def test_emptied_stream_is_retired_and_recreated_on_enqueue(redis_url: str, dedupe: str, crawl: str) -> None:
    """Acking the last entry deletes the stream and its group; a new request recreates both."""
    f = frontier(redis_url, crawl, dedupe)
    stream = f.site("a.test").stream("http", "default")
    f.enqueue("a.test", batch(["1", "2"]))
    entries = f.lease("a.test", "w1", 10, (1, 1, 1)).entries
    assert f.ack("a.test", [(entries[0].stream, entries[0].id)]) == 1
    assert f.client.exists(stream) == 1  # one still pending
    assert f.ack("a.test", [(entries[1].stream, entries[1].id)]) == 1
    assert f.client.exists(stream) == 0
    assert f.ack("a.test", [(e.stream, e.id) for e in entries]) == 0  # a late ack is harmless
    assert f.release("a.test", "w1", [(e.stream, e.id) for e in entries]) == 0
    st = f.status("a.test")
    assert (st.backlog, st.pending) == (0, 0)
    assert f.lease("a.test", "w1", 10, (1, 1, 1)).entries == []
    assert f.claim("a.test", "w2", 0, 10, 5)[0] == 0
    f.enqueue("a.test", batch(["3"]))
    assert [e.payload for e in f.lease("a.test", "w1", 10, (1, 1, 1)).entries] == [b"3"]


def test_stale_group_state_does_not_break_a_retired_stream(redis_url: str, dedupe: str, crawl: str) -> None:
    """A consumer that leased from a stream before it was retired gets nothing (NOGROUP is never raised)."""
    f = frontier(redis_url, crawl, dedupe)
    f.enqueue("a.test", batch(["1"]))
    e = f.lease("a.test", "w1", 1, (1, 1, 1)).entries[0]
    f.ack("a.test", [(e.stream, e.id)])
    r: redis.Redis = f.client
    assert r.exists(f.site("a.test").stream("http", "default")) == 0
    assert f.dead_letter("a.test", "w1", [(e.stream, e.id, "gone")]) == 0
    assert f.claim("a.test", "w2", 0, 10, 5)[0] == 0
    f.enqueue("a.test", batch(["2"]))  # (it waits in the shard's inbox: the site has no stream)
    again = f.lease("a.test", "w1", 1, (1, 1, 1)).entries  # recreates the stream, with its group
    assert [x.payload for x in again] == [b"2"], again
    assert r.xinfo_groups(f.site("a.test").stream("http", "default"))[0]["name"] == GROUP.encode()
