"""The monitor against a real Redis: /metrics over HTTP, a read-only user, node liveness, webhook alerts."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from monitor import Monitor, MonitorSettings, metric_names
from streams_sched.frontier.records import Entry
from streams_sched.testing import free_port

from daemons import Daemon, WebhookSink, scrape, try_scrape, value
from helpers import error_replies, frontier, wait_for


def out(i: int | str, stream: int = 1, delay_ms: int = 0) -> Entry:
    return Entry(hashlib.sha1(str(i).encode()).digest(), stream, delay_ms, f"payload-{i}".encode())


def record(f, name: str, last_seen: float, state: str = "online", hb: float = 5.0, local: int = 0, **extra: object) -> None:
    f.record_node(name, {"node": name, "host": "box", "state": state, "last_seen": last_seen, "heartbeat_s": hb, "local": local,
                         **extra})


@pytest.mark.e2e
def test_scraped_metrics_match_redis_after_a_known_sequence(redis_url: str, dedupe: str, crawl: str, tmp_path: Path) -> None:
    """After enqueues, duplicates, leases, acks, a dead letter and delayed requests, /metrics equals Redis."""
    f = frontier(redis_url, crawl, dedupe)
    f.register()
    f.register_sites(["a.test", "b.test"])
    f.client.hset(f.keys.meta, mapping={"dedupe": "bf" if dedupe == "redisbloom" else "bitmap"})
    items = [out(f"h{i}", 0) for i in range(4)] + [out(f"d{i}", 1) for i in range(5)] + [out(f"l{i}", 2) for i in range(3)]
    assert f.enqueue("a.test", items + [out("h0", 0), out("d1", 1), out("l2", 2)])[:2] == (12, 3)
    f.enqueue("b.test", [out("later1", delay_ms=60_000), out("later2", delay_ms=60_000)])
    leased = f.lease("a.test", "w1", 5, (1, 1, 1)).entries
    f.ack("a.test", [(e.stream, e.id) for e in leased[:3]])
    f.dead_letter("a.test", "w1", [(leased[3].stream, leased[3].id, "cannot parse")])
    now = time.time()
    record(f, "w1", now, hb=60, local=2, browser=3, browser_max=4, renders=10, render_s=12.5)
    record(f, "w2", now - 100, hb=1, local=3, browser=4, browser_max=4)
    record(f, "w4", now, hb=60, browser=0, browser_max=0)
    record(f, "w3", now - 100, state="offline")
    port = free_port()
    d = Daemon("monitor", ["--redis-url", redis_url, "--metrics-port", str(port), "--interval", "0.5", "--cache-seconds", "0"], tmp_path / "m.log")
    try:
        m = wait_for(lambda: try_scrape(port), timeout=20, what="the monitor's /metrics")
        a = f.status("a.test")
        for band in ("high", "default", "low"):
            assert value(m, "streams_sched_backlog", crawl=crawl, site="a.test", priority=band) == a.band_backlog(band)
        assert a.backlog == 12 - 5 and a.pending == 1
        assert value(m, "streams_sched_pending", crawl=crawl, site="a.test") == a.pending == 1
        assert value(m, "streams_sched_oldest_pending_seconds", crawl=crawl, site="a.test") >= 0
        assert value(m, "streams_sched_delayed", crawl=crawl, site="b.test") == f.status("b.test").delayed == 2
        assert value(m, "streams_sched_enqueued_total", crawl=crawl, site="a.test") == a.stats["enqueued"] == 12
        assert value(m, "streams_sched_acked_total", crawl=crawl, site="a.test") == a.stats["acked"] == 3
        assert value(m, "streams_sched_dead_letters", crawl=crawl) == a.dead_letters == 1
        assert value(m, "streams_sched_dead_lettered_total", crawl=crawl) == 1
        assert value(m, "streams_sched_duplicates_total", crawl=crawl) == a.stats["duplicates"] == 3
        assert value(m, "streams_sched_nodes", crawl=crawl, state="alive") == 2
        assert value(m, "streams_sched_nodes", crawl=crawl, state="dead") == 1  # w3 said goodbye
        # browser leases against the cap and renders, per live node with the browser capability
        assert value(m, "streams_sched_node_browser_leases", crawl=crawl, node="w1") == 3
        assert value(m, "streams_sched_node_browser_max", crawl=crawl, node="w1") == 4
        assert value(m, "streams_sched_node_renders_total", crawl=crawl, node="w1") == 10
        assert value(m, "streams_sched_node_render_seconds_total", crawl=crawl, node="w1") == 12.5
        assert set(m["streams_sched_node_browser_max"]) == {(("crawl", crawl), ("node", "w1"))}  # not w2 (dead), w4 (http only)
        assert value(m, "streams_sched_local_requests", crawl=crawl, state="alive") == 2
        assert value(m, "streams_sched_local_requests", crawl=crawl, state="dead") == 3  # lost with w2
        assert value(m, "streams_sched_seen_estimate", crawl=crawl) == 14
        assert value(m, "streams_sched_sites", crawl=crawl, state="active") == 2
        assert value(m, "streams_sched_redis_up") == 1
        exported = {name for name in m if name.startswith("streams_sched_")}
        created = {f"streams_sched_{name}_created" for name in ("enqueued", "acked", "node_renders", "node_render_seconds")}
        assert exported <= metric_names() | created
        # the next scrape reads Redis again
        f.ack("a.test", [(leased[4].stream, leased[4].id)])
        m = scrape(port)
        assert value(m, "streams_sched_acked_total", crawl=crawl, site="a.test") == 4
        assert value(m, "streams_sched_pending", crawl=crawl, site="a.test") == 0
        assert d.terminate() == 0
    finally:
        d.close()
    assert d.named("stopped")


@pytest.mark.e2e
def test_monitor_needs_only_a_read_only_user(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """With +@read +evalsha_ro +eval_ro +time +ping the monitor exports everything; no pub/sub is a warning."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    f.register_sites(["a.test"])
    f.client.hset(f.keys.meta, "dedupe", "bitmap")
    f.enqueue("a.test", [out(i) for i in range(7)])
    f.client.script_flush()  # the read-only user cannot SCRIPT LOAD: EVAL_RO must do
    f.client.acl_setuser(
        "monitor", enabled=True, passwords=["+pw"], keys=["ss:*"], reset_keys=True, reset_channels=True,
        commands=["+@read", "+evalsha_ro", "+eval_ro", "+time", "+ping"],
    )
    try:
        url = plain_redis_url.replace("redis://", "redis://monitor:pw@")
        port = free_port()
        d = Daemon("monitor", ["--redis-url", url, "--metrics-port", str(port), "--interval", "0.3"], tmp_path / "m.log")
        try:
            m = wait_for(lambda: try_scrape(port), timeout=20, what="/metrics")
            assert value(m, "streams_sched_backlog", crawl=crawl, site="a.test", priority="default") == 7
            assert value(m, "streams_sched_seen_estimate", crawl=crawl) == 7
            assert value(m, "streams_sched_redis_up") == 1
            d.wait_event("events_disabled")
            d.wait_event("pass", count=2)
            assert not d.named("redis_refused") and not d.named("read_failed")
            assert d.terminate() == 0
        finally:
            d.close()
        with_pw = redis.Redis.from_url(url)
        try:
            with_pw.xadd(f.site("a.test").stream("http", "high"), {"r": "x"})
            raise AssertionError("the monitor's user could write")
        except redis.exceptions.NoPermissionError:
            pass
    finally:
        f.client.acl_deluser("monitor")


@pytest.mark.e2e
def test_webhook_alert_arrives_once_and_resolves_once(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """Backlog over the threshold, a dead node and growing dead letters each POST one alert, not one per pass."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    f.register_sites(["a.test"])
    f.enqueue("a.test", [out(i) for i in range(3)])
    sink = WebhookSink()
    d = Daemon("monitor", ["--redis-url", plain_redis_url, "--metrics-port", str(free_port()), "--interval", "0.2",
                           "--backlog-threshold", "5", "--webhook-url", sink.url, "--dlq-quiet-seconds", "1"],
               tmp_path / "m.log")
    try:
        d.wait_event("pass")
        assert sink.bodies == []  # nothing to say yet
        f.enqueue("a.test", [out(i) for i in range(3, 10)])  # backlog 10 > 5
        record(f, "w-dead", time.time() - 60, hb=1)
        e = f.lease("a.test", "w1", 1, (1, 1, 1)).entries[0]
        f.dead_letter("a.test", "w1", [(e.stream, e.id, "boom")])
        wait_for(lambda: len(sink.alerts("firing")) >= 3, timeout=20, what=f"three alerts; got {sink.bodies}")
        passes = len(d.named("pass"))
        d.wait_event("pass", count=passes + 5)  # five more passes with the conditions still true
        firing = sink.alerts("firing")
        assert sorted(b["alert"]["kind"] for b in firing) == ["backlog", "dead_letters", "node_dead"]
        backlog = sink.alerts("firing", "backlog")[0]
        assert backlog["msgtype"] == "text" and "backlog of site a.test" in backlog["text"]["content"]
        assert backlog["path"].endswith("access_token=test")
        f.lease("a.test", "w1", 5, (1, 1, 1))  # backlog 9 - 5 = 4: clears
        f.client.hdel(f.keys.nodes, "w-dead")
        wait_for(lambda: len(sink.alerts("resolved")) >= 3, timeout=20, what=f"three resolved; got {sink.bodies}")
        passes = len(d.named("pass"))
        d.wait_event("pass", count=passes + 3)
        assert len(sink.alerts("firing")) == 3 and len(sink.alerts("resolved")) == 3
        assert d.terminate() == 0
    finally:
        d.close()
        sink.close()


@pytest.mark.e2e
def test_restarted_monitor_with_a_state_file_does_not_repeat_a_firing_alert(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """With --state-file, a monitor restarted (SIGKILL) while an alert holds sends no second firing, then one resolved."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    f.register_sites(["a.test"])
    f.enqueue("a.test", [out(i) for i in range(10)])  # backlog 10 > 5
    sink = WebhookSink()
    state = tmp_path / "alerts.json"
    args = ["--redis-url", plain_redis_url, "--metrics-port", "0", "--interval", "0.2", "--prefix", crawl,
            "--backlog-threshold", "5", "--webhook-url", sink.url, "--state-file", str(state)]
    first = Daemon("monitor", args, tmp_path / "m1.log")
    second = None
    try:
        wait_for(lambda: len(sink.alerts("firing")) == 1 and state.exists(), timeout=20, what="one firing alert, saved")
        first.close()  # SIGKILL
        second = Daemon("monitor", args, tmp_path / "m2.log")
        assert second.wait_event("state_loaded")[0]["active_alerts"] == 1
        second.wait_event("pass", count=5)
        assert len(sink.alerts("firing")) == 1  # not sent again after the restart
        f.lease("a.test", "w1", 8, (1, 1, 1))  # backlog 2: clears
        wait_for(lambda: len(sink.alerts("resolved")) == 1, timeout=20, what=f"one resolved; got {sink.bodies}")
        assert second.terminate() == 0
    finally:
        first.close()
        if second is not None:
            second.close()
        sink.close()


def test_node_heard_on_pubsub_is_alive_then_dead_after_three_heartbeats(plain_redis_url: str, crawl: str) -> None:
    """A node known only from its events is alive while it beats and dead three heartbeats after it stops."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    mon = Monitor(MonitorSettings(redis_url=plain_redis_url, metrics_port=0, crawls=(crawl,)))
    mon.connect()
    mon.read()
    mon.start()
    try:
        def beat() -> None:
            f.publish({"event": "heartbeat", "node": "w-ev", "crawl": crawl, "heartbeat_s": 0.1})

        def state() -> str | None:
            beat() if beating else None
            ns = mon.read().states[crawl].get("w-ev")
            return ns.state if ns else None

        beating = True
        assert wait_for(lambda: state() == "alive", timeout=10, interval=0.05)
        beating = False
        stopped = time.monotonic()
        wait_for(lambda: state() == "dead", timeout=10, interval=0.05)
        assert time.monotonic() - stopped >= 0.25  # 3 x 0.1 s, less the last beat's age
        m = scrape(mon.metrics_server.port)
        assert value(m, "streams_sched_nodes", crawl=crawl, state="dead") == 1
        f.publish({"event": "node_offline", "node": "w-ev", "crawl": crawl})
        wait_for(lambda: state() == "offline", timeout=10, interval=0.05)
    finally:
        mon.close()


@pytest.mark.e2e
def test_burst_prints_the_metrics_once(plain_redis_url: str, crawl: str) -> None:
    """--burst reads once, prints the exposition on stdout and exits 0."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    f.register_sites(["a.test"])
    f.enqueue("a.test", [out(1)])
    res = subprocess.run([sys.executable, "-m", "monitor", "--redis-url", plain_redis_url, "--burst"],
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert f'streams_sched_enqueued_total{{crawl="{crawl}",site="a.test"}} 1.0' in res.stdout
    assert [json.loads(line)["event"] for line in res.stderr.splitlines()].count("pass") == 1


def test_seen_estimate_sums_the_live_revisit_buckets(redis_url: str, dedupe: str, crawl: str) -> None:
    """With revisits on, the seen estimate counts the fingerprints of every live time bucket."""
    from monitor.snapshot import read_crawl
    from streams_sched.frontier.bloom import crawl_bloom
    from streams_sched.frontier.client import Frontier

    client = redis.Redis.from_url(redis_url)
    params = crawl_bloom(client, crawl, dedupe, revisit_s=1000, revisit_buckets=4)
    f = Frontier(client, crawl, params)
    f.register_sites(["a.test"])
    f.enqueue("a.test", [out(i) for i in range(5)])
    assert read_crawl(Frontier(client, crawl)).seen_estimate == 5


def test_seen_estimate_counts_exact_sets_and_converted_filters_and_fails_no_call(
    redis_url: str, dedupe: str, crawl: str
) -> None:
    """The seen estimate counts a small site's exact set and a site past 1,024 URLs (a Bloom
    filter) on either back-end, without a command that fails on the other form of key."""
    from monitor.snapshot import read_crawl
    from streams_sched.frontier.bloom import crawl_bloom
    from streams_sched.frontier.client import Frontier

    client = redis.Redis.from_url(redis_url)
    f = Frontier(client, crawl, crawl_bloom(client, crawl, dedupe, capacity=5000))
    f.load_scripts()
    f.register_sites(["small.test", "big.test"])
    f.enqueue("small.test", [out(i) for i in range(3)])
    for i in range(0, 1500, 500):
        f.enqueue("big.test", [out(f"b{j}") for j in range(i, i + 500)])
    assert f.client.hget(f.site("big.test").seen_meta, "w") == b"8"  # converted
    before = error_replies(f.client)
    estimate = read_crawl(Frontier(f.client, crawl)).seen_estimate
    assert estimate is not None and 3 + 1490 <= estimate <= 3 + 1510  # a Bloom count is an estimate
    assert error_replies(f.client) == before


def commands(client: object) -> int:
    """Commands the server has run since it started (INFO commandstats; those in scripts too)."""
    return sum(int(v["calls"]) for v in client.info("commandstats").values())  # type: ignore[attr-defined]


def idle_sites(f, first: int, n: int) -> None:
    """``n`` sites that were crawled out: registered, with counters, no work left."""
    names = [f"idle{i}.test" for i in range(first, first + n)]
    f.register_sites(names)
    pipe = f.client.pipeline(transaction=False)
    for name in names:
        pipe.hset(f.site(name).stats, mapping={"enqueued": 2, "acked": 2})
    pipe.execute()


def test_a_read_costs_the_same_whatever_the_number_of_idle_sites(plain_redis_url: str, crawl: str, measured) -> None:
    """With 3 busy sites, a read with 3,000 idle sites besides costs as much as with 6,000:
    it reads the indexes, the labelled sites and a bounded slice of the registry."""
    from monitor.snapshot import SiteBook, read_crawl
    from streams_sched.frontier.client import Frontier

    f = frontier(plain_redis_url, crawl)
    f.register()
    f.enqueue("a.test", [out(i) for i in range(5)])
    f.lease("a.test", "w1", 2, (1, 1, 1))
    f.enqueue("b.test", [out("later", delay_ms=60_000)])
    f.enqueue("c.test", [out(i) for i in range(3)])
    f.load_scripts()
    reader = Frontier(f.client, crawl)

    def cost(book: SiteBook) -> tuple[int, int]:
        before = commands(f.client)
        snap = read_crawl(reader, seen=False, book=book, sweep=160)
        return commands(f.client) - before, len(snap.sites)

    idle_sites(f, 0, 3000)
    book = SiteBook()
    cost(book)
    three_k = [cost(book) for _ in range(3)]
    idle_sites(f, 3000, 3000)
    six_k = [cost(book) for _ in range(3)]
    assert all(read <= 3 + 2 * 160 for _, read in three_k + six_k)  # busy + about one sweep slice
    assert max(c for c, _ in six_k) <= 1.3 * max(c for c, _ in three_k), (three_k, six_k)
    measured(f"commands per read (3 busy sites, sweep 160): {[c for c, _ in three_k]} with 3,000 idle sites,"
             f" {[c for c, _ in six_k]} with 6,000")


def test_crawl_totals_catch_up_with_sites_read_in_turn_and_forget_purged_ones(plain_redis_url: str, crawl: str) -> None:
    """Crawl-wide sums cover every site once the registry sweep went round, include a site
    that went through all its work between two reads, and drop purged sites."""
    from monitor.snapshot import SiteBook, read_crawl
    from streams_sched.frontier.client import Frontier

    f = frontier(plain_redis_url, crawl)
    f.register()
    idle_sites(f, 0, 400)
    f.client.xadd(f.site("idle7.test").dlq, {"r": b"x", "reason": "boom"})
    reader, book = Frontier(f.client, crawl), SiteBook()

    def reads_until(acked: int, dead: int = 1) -> int:
        for n in range(1, 30):
            snap = read_crawl(reader, seen=False, book=book, sweep=32)
            assert snap.site_count == len(f.sites())
            if snap.stat("acked") == acked and snap.dead_letters == dead:
                return n
        raise AssertionError(f"the sums never reached acked={acked}: {book.totals}")

    assert reads_until(800) <= 4  # 400 sites, about 160 per read
    f.enqueue("quick.test", [out("q")])
    e = f.lease("quick.test", "w1", 1, (1, 1, 1)).entries
    f.ack("quick.test", [(x.stream, x.id) for x in e])  # in and out of the indexes between two reads
    assert reads_until(801) <= 4
    for i in range(10):
        f.purge_site(f"idle{i}.test")
    # a purged site is forgotten when a sweep round ends without finding it: at most two
    # rounds (of about three reads here: 25 sites a shard, 10 per step)
    assert reads_until(781, dead=0) <= 8  # idle7 held the dead letter
