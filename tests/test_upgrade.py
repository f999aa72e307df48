"""``streams-sched upgrade``: a crawl written in the per-site layout, built by hand, moves to
the sharded layout with every queued, leased, delayed and dead-lettered request, its
seen filters, stats and policy; a crash midway and a second run are harmless."""

from __future__ import annotations

import hashlib
import time
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from streams_sched.admin.upgrade import UPGRADE_FIELD, Upgrade
from streams_sched.admin.upgrade_plan import NodesOnline, bucket_window, key_pairs, online_nodes
from streams_sched.cli import main
from streams_sched.connect.clients import connect
from streams_sched.errors import LayoutError
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import DEFAULT_SHARDS, GROUP, CrawlKeys, SiteKeys
from streams_sched.frontier.records import BloomParams, Entry

from helpers import wait_for

#: the synthetic sites: on a cluster the crawl fixture spreads their old tags over the masters
SITES = ("site0.test", "site1.test", "site2.test")


def fp(name: str) -> bytes:
    return hashlib.sha1(name.encode()).digest()


def old_crawl(client: Any, crawl: str, dedupe: str, *, queued: int = 5) -> dict[str, Any]:
    """An old-layout crawl: site0 has ``queued`` requests in its http:default stream (one
    of them leased by consumer "gone"), a delayed request, an exact seen set, stats, a
    policy and an observed window that expires; site1 a dead letter and a Bloom filter
    (past 1,024 fingerprints, made by the scripts on a scratch crawl and moved under the
    old name); site2 only a policy. Returns what the test checks afterwards."""
    mode = "bf" if dedupe == "redisbloom" else "bitmap"
    k = CrawlKeys(crawl)
    client.sadd(CrawlKeys.registry(), crawl)
    client.sadd(k.sites, *SITES)
    client.hset(k.meta, mapping={"dedupe": mode, "bloom_error_rate": "0.001", "bloom_capacity": "5000",
                                 "bloom_expansion": "2", "revisit_seconds": "0.0", "revisit_buckets": "4"})
    a, b, c = (SiteKeys(crawl, s) for s in SITES)
    stream = a.stream("http", "default")
    client.xgroup_create(stream, GROUP, "0", mkstream=True)
    payloads = [f"page-{i}".encode() for i in range(queued)]
    for p in payloads:
        client.xadd(stream, {"r": p})
    leased = client.xreadgroup(GROUP, "gone", {stream: ">"}, count=1)[0][1][0]
    due_ms = int(client.time()[0]) * 1000 + 3_600_000
    client.zadd(a.delayed, {b"2:1:later": due_ms})
    client.set(a.seen, b"".join(fp(f"u{i}")[:8] for i in range(queued)))
    client.hset(a.stats, mapping={"enqueued": queued, "leased": 1, "delay_seq": 1})
    client.hset(a.policy, mapping={"weight": "2", "max_pages": "1000"})
    client.set(a.obs, "1,2,3,4,5", px=600_000)
    client.xadd(b.dlq, {"r": b"broken", "reason": "cannot parse", "stream": b.stream("http", "low"), "id": "1-0",
                        "deliveries": 1, "node": "gone", "ts": 1})
    client.hset(b.stats, mapping={"enqueued": 1200, "dead": 1})
    client.hset(c.policy, "paused", "1")
    # a Bloom filter as the scripts grow it, built under a scratch crawl's name and moved
    scratch = Frontier(client, crawl + "-scratch", BloomParams(mode=mode, capacity=5000), shards=1)
    for i in range(0, 1200, 400):
        scratch.enqueue("big.test", [Entry(fp(f"b{j}"), 1, 0, b"x") for j in range(i, i + 400)])
    for src, dst in ((scratch.site("big.test").seen, b.seen), (scratch.site("big.test").seen_meta, b.seen_meta)):
        client.restore(dst, 0, client.dump(src))
    for key in (*scratch.site("big.test").all, *scratch.shard(0).all, CrawlKeys(crawl + "-scratch").meta):
        client.delete(key)
    return {"payloads": payloads, "leased": leased, "due_ms": due_ms, "stream": stream}


def worker_frontier(client: Any, crawl: str, dedupe: str) -> Frontier:
    """A Frontier as a worker builds it (dedupe parameters from the crawl's meta)."""
    f = Frontier(client, crawl, crawl_bloom(client, crawl, dedupe))
    f.load_scripts()
    return f


def old_keys(client: Any, crawl: str) -> list[str]:
    return [key for s in SITES for key in SiteKeys(crawl, s).all if client.exists(key)]


@pytest.mark.cluster
def test_upgrade_keeps_every_request_lease_delay_filter_and_policy(redis_url: str, dedupe: str, crawl: str) -> None:
    """After the upgrade a worker leases every queued request, takes over the leased one only
    once its lease expires, finds the delayed one, the dead letter, the stats and the policy,
    and its dedupe still knows the old fingerprints (exact set and Bloom filter)."""
    client = connect(redis_url)
    built = old_crawl(client, crawl, dedupe)
    with pytest.raises(LayoutError):
        Frontier(client, crawl).sites()
    result = Upgrade(client, crawl).run()
    assert result.finished and not result.failed and not result.mismatched
    assert (result.moved, result.skipped, result.shards) == (3, 0, DEFAULT_SHARDS)
    assert result.before.as_tuple() == result.after.as_tuple() == (4, 1, 1, 1)
    assert not client.exists(CrawlKeys(crawl).sites) and old_keys(client, crawl) == []
    assert client.hget(CrawlKeys(crawl).meta, "shards") == str(DEFAULT_SHARDS).encode()
    assert client.hget(CrawlKeys(crawl).meta, UPGRADE_FIELD) is None

    f = worker_frontier(client, crawl, dedupe)
    assert f.sites() == sorted(SITES)
    a = f.site("site0.test")
    assert 0 < client.pttl(a.obs) <= 600_000  # moved with its TTL
    st = f.status("site0.test")
    assert (st.backlog, st.pending, st.delayed, st.next_due_ms) == (4, 1, 1, built["due_ms"])
    assert st.policy == {"weight": "2", "max_pages": "1000"} and st.stats["enqueued"] == 5
    assert f.status("site1.test").dead_letters == 1 and f.status("site2.test").policy == {"paused": "1"}
    # the site is in its shard's indexes, as a worker finds work
    assert client.zscore(a.index.ready("http"), "site0.test") is not None
    assert "site0.test" in f.expired_sites(0, 100)
    assert sum(c[3] for c in f.shard_counts()) >= 5 + 1200  # the drain check sees a crawl that had requests

    leased = f.lease("site0.test", "w2", 100, (1, 1, 1)).entries
    assert sorted(e.payload for e in leased) == sorted(p for p in built["payloads"] if p != built["leased"][1][b"r"])
    # the old lease is still a lease: it is not taken over before it expires...
    assert f.claim("site0.test", "w2", 3_600_000, 10, 5)[0] == 0
    # ...and is once it has been idle long enough
    taken = wait_for(lambda: f.claim("site0.test", "w2", 300, 1, 5)[2], timeout=10, what="the old lease to expire")
    assert [(e.id, e.payload) for e in taken] == [(built["leased"][0], built["leased"][1][b"r"])]

    dup = f.enqueue("site0.test", [Entry(fp("u0"), 1, 0, b"again"), Entry(fp("new"), 1, 0, b"new")])
    assert dup[:2] == (1, 1)  # the exact set's old fingerprint is a duplicate, the new one is not
    assert f.enqueue("site1.test", [Entry(fp("b7"), 1, 0, b"x")])[:2] == (0, 1)  # the Bloom filter's too


def snapshot(f: Frontier) -> list[tuple[Any, ...]]:
    """What each site holds (not the idle time of its leases, which grows as it is read)."""
    return [({k: (v.backlog, v.pending) for k, v in st.streams.items()}, st.delayed, st.next_due_ms, st.dead_letters, st.stats, st.policy)
            for st in (f.status(s) for s in SITES)]


def test_running_the_upgrade_twice_is_harmless(plain_redis_url: str, crawl: str) -> None:
    """A second run finds the sharded layout and changes nothing."""
    client = redis.Redis.from_url(plain_redis_url)
    old_crawl(client, crawl, "bitmap")
    assert Upgrade(client, crawl).run().finished
    f = Frontier(client, crawl)
    before = snapshot(f)
    again = Upgrade(client, crawl, shards=4).run()
    assert again.already and again.shards == DEFAULT_SHARDS and again.moved == 0
    assert snapshot(f) == before


def test_a_crash_midway_leaves_the_crawl_refused_and_the_next_run_finishes(plain_redis_url: str, crawl: str) -> None:
    """Killed after its first site, the upgrade leaves LayoutError in place; the next run skips
    the moved site, lets the old keys win over what a partial move left under the new names,
    drops a new key whose old one is gone, and finishes with nothing lost."""
    client = redis.Redis.from_url(plain_redis_url)
    old_crawl(client, crawl, "bitmap")
    up = Upgrade(client, crawl, shards=8, batch=1)
    real = up._chunk
    calls: list[int] = []

    def crash_on_second(*args: Any) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionError("killed")
        real(*args)

    up._chunk = crash_on_second  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        up.run()
    with pytest.raises(LayoutError, match="streams-sched upgrade"):
        Frontier(client, crawl).sites()
    assert client.hget(CrawlKeys(crawl).meta, UPGRADE_FIELD) == b"8"
    moved = [s for s in SITES if not any(client.exists(k) for k in SiteKeys(crawl, s).all)]
    assert len(moved) == 1
    # a partial move of a site the crash left behind: a copy of its stats under the new
    # name, which the old stats outgrew since, and a new key whose old one is gone
    partial = next(s for s in SITES[:2] if s not in moved)
    old, new = SiteKeys(crawl, partial), Frontier(client, crawl, shards=8).site(partial)
    client.restore(new.stats, 0, client.dump(old.stats))
    client.hincrby(old.stats, "enqueued", 1)
    client.set(new.obs_v1, "stale")
    enqueued = int(client.hget(old.stats, "enqueued"))
    again = Upgrade(client, crawl, shards=16).run()
    assert again.finished and again.shards == 8 and (again.moved, again.skipped, again.keys_dropped) == (2, 1, 1)
    f = Frontier(client, crawl)
    assert f.shards == 8 and f.sites() == sorted(SITES) and old_keys(client, crawl) == []
    assert f.status(partial).stats["enqueued"] == enqueued and not client.exists(new.obs_v1)
    st = f.status("site0.test")
    assert (st.backlog, st.pending, st.delayed) == (4, 1, 1)


def test_upgrade_refuses_while_a_node_is_online(plain_redis_url: str, crawl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """An online node stops the upgrade with "stop the workers first" and nothing written;
    a dead or offline node does not, and --force runs anyway."""
    client = redis.Redis.from_url(plain_redis_url)
    old_crawl(client, crawl, "bitmap")
    f = Frontier(client, crawl, shards=1)
    now = time.time()
    f.record_node("w-alive", {"node": "w-alive", "state": "online", "last_seen": now, "heartbeat_s": 5})
    f.record_node("w-dead", {"node": "w-dead", "state": "online", "last_seen": now - 600, "heartbeat_s": 5})
    f.record_node("w-off", {"node": "w-off", "state": "offline", "last_seen": now, "heartbeat_s": 5})
    with pytest.raises(NodesOnline, match="stop the workers first") as refused:
        Upgrade(client, crawl).run()
    assert refused.value.nodes == ["w-alive"]
    assert client.exists(CrawlKeys(crawl).sites) and client.hget(CrawlKeys(crawl).meta, UPGRADE_FIELD) is None
    monkeypatch.setenv("REDIS_URL", plain_redis_url)
    runner = CliRunner()
    res = runner.invoke(main, ["upgrade", "-c", crawl])
    assert res.exit_code == 1 and res.output.startswith("error: 1 node(s) of crawl") and "stop the workers first" in res.output
    res = runner.invoke(main, ["upgrade", "-c", crawl, "--force", "--shards", "4"])
    assert res.exit_code == 0, res.output
    assert "3 site(s) moved to 4 shards" in res.output and "before: queued 4, pending 1, delayed 1, dead letters 1" in res.output
    assert "after:  queued 4, pending 1, delayed 1, dead letters 1" in res.output and "is upgraded" in res.output
    assert "already has the sharded layout" in runner.invoke(main, ["upgrade", "-c", crawl]).output


def test_revisit_filters_move_with_their_ttl(plain_redis_url: str, crawl: str) -> None:
    """With revisits on, every live time bucket's filter moves with its TTL and still dedupes."""
    client = redis.Redis.from_url(plain_redis_url)
    client.sadd(CrawlKeys.registry(), crawl)
    client.sadd(CrawlKeys(crawl).sites, "a.test")
    client.hset(CrawlKeys(crawl).meta, mapping={"dedupe": "bitmap", "revisit_seconds": "4000.0", "revisit_buckets": "4"})
    old = SiteKeys(crawl, "a.test")
    params = BloomParams(revisit_seconds=4000, revisit_buckets=4)
    older = params.buckets(time.time())[2]
    client.set(old.seen_bucket(older)[0], fp("seen-long-ago")[:8], px=params.bucket_ttl * 1000)
    assert Upgrade(client, crawl).run().keys_moved == 1
    f = worker_frontier(client, crawl, "bitmap")
    assert f.bloom.revisit_seconds == 4000
    assert 0 < client.pttl(f.site("a.test").seen_bucket(older)[0]) <= params.bucket_ttl * 1000
    assert f.enqueue("a.test", [Entry(fp("seen-long-ago"), 1, 0, b"x")])[:2] == (0, 1)


def test_an_unknown_crawl_is_an_error_not_an_empty_upgrade(plain_redis_url: str) -> None:
    """A crawl name with nothing in Redis is refused with a message naming it."""
    client = redis.Redis.from_url(plain_redis_url)
    with pytest.raises(Exception, match="no crawl named 'nosuch'"):
        Upgrade(client, "nosuch").run()
    assert client.keys("*") == []


# -- pure -----------------------------------------------------------------------------------


def test_key_pairs_cover_every_key_of_an_old_site() -> None:
    """Every key of an old-layout site but its replica-barrier marker has a new name, under the shard's tag."""
    old, new = SiteKeys("c", "a.test"), SiteKeys("c", "a.test", 3)
    pairs = key_pairs(old, new, [7, 6])
    assert {o for o, _ in pairs} | {old.sync} >= set(old.all)
    assert all(n.startswith("ss:{c/#3}:a.test:") for _, n in pairs)
    assert [o.replace("ss:{c/a.test}", "") for o, _ in pairs] == [n.replace("ss:{c/#3}:a.test", "") for _, n in pairs]
    assert (old.seen_bucket(6)[1], new.seen_bucket(6)[1]) in pairs


def test_bucket_window_spans_the_live_buckets_with_slack() -> None:
    """The buckets looked at are the dedupe window plus one newer and two older; none without revisits."""
    assert bucket_window({"revisit_seconds": "0"}, 1000.0) == []
    assert bucket_window({}, 1000.0) == []
    assert bucket_window({"revisit_seconds": "400", "revisit_buckets": "4"}, 1050.0) == [11, 10, 9, 8, 7, 6, 5, 4]


def test_online_nodes_are_the_recently_heard_ones_that_did_not_say_goodbye() -> None:
    """Online: state online and heard from within three heartbeats; dead and offline nodes are not."""
    records = {"a": {"state": "online", "last_seen": 99, "heartbeat_s": 1}, "b": {"state": "online", "last_seen": 90, "heartbeat_s": 1},
               "c": {"state": "offline", "last_seen": 100, "heartbeat_s": 1}}
    assert online_nodes(records, 100.0) == ["a"]
