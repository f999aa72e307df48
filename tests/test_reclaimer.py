"""The reclaimer against a real Redis: in-process passes and the daemon as a real process."""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from reclaimer import Reclaimer, ReclaimerSettings
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import GROUP, health_key
from streams_sched.frontier.records import Entry
from streams_sched.testing import RedisServer, free_port

from daemons import Daemon, try_scrape, value
from helpers import frontier, wait_for


def out(i: int | str, stream: int = 1, delay_ms: int = 0) -> Entry:
    return Entry(hashlib.sha1(str(i).encode()).digest(), stream, delay_ms, f"payload-{i}".encode())


#: the heartbeat the node records below claim: a consumer idle for three of them is gone
HEARTBEAT_S = 0.1


def node(f: Frontier, name: str, last_seen: float, **info: object) -> None:
    f.record_node(name, {"node": name, "state": "online", "last_seen": last_seen, "heartbeat_s": HEARTBEAT_S, **info})


def reclaimer(url: str, **kw: object) -> Reclaimer:
    r = Reclaimer(ReclaimerSettings(redis_url=url, **kw))  # type: ignore[arg-type]
    r.connect()
    return r


def test_pass_requeues_expired_leases_dead_letters_and_promotes(plain_redis_url: str, crawl: str) -> None:
    """One pass requeues expired leases, dead-letters entries over the limit and moves due delayed ones."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    f.register_sites(["a.test", "b.test"])
    f.enqueue("a.test", [out(i) for i in range(10)])
    f.enqueue("b.test", [out("later", delay_ms=1)])
    leased = f.lease("a.test", "gone", 4, (1, 1, 1)).entries
    node(f, "gone", time.time() - 100, lease_s=0.05, max_deliveries=2)
    # one entry was delivered once before (d=1): its second expiry makes 3 deliveries > 2
    first = leased[0]
    f.client.xadd(f.site("a.test").streams[first.stream], {"r": b"poison", "d": 1})
    poison = f.lease("a.test", "gone", 10, (1, 1, 1)).entries
    stream = f.site("a.test").streams[first.stream]
    wait_for(lambda: min(p["time_since_delivered"] for p in f.client.xpending_range(stream, GROUP, "-", "+", 20)) > 50,
             timeout=10, what="every lease older than lease_s")
    r = reclaimer(plain_redis_url)
    try:
        result = r.run_pass()
    finally:
        r.close()
    (c,) = result.crawls
    assert (c.requeued, c.dead_lettered, c.promoted, c.lease_s, c.max_deliveries) == (10, 1, 1, 0.05, 2)
    st = f.status("a.test")
    assert (st.backlog, st.pending, st.dead_letters) == (10, 0, 1)
    assert f.status("b.test").backlog == 1
    assert [e.payload for e in poison if e.payload == b"poison"] == [b"poison"]
    assert f.dead_letters("a.test")[0]["r"] == b"poison"


def test_lease_of_a_live_worker_is_left_alone(plain_redis_url: str, crawl: str) -> None:
    """A lease younger than the lease time its worker advertises is not requeued."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    f.register_sites(["a.test"])
    f.enqueue("a.test", [out(1)])
    f.lease("a.test", "busy", 1, (1, 1, 1))
    node(f, "busy", time.time(), lease_s=60)
    r = reclaimer(plain_redis_url)
    try:
        assert r.run_pass().total("requeued") == 0
    finally:
        r.close()
    assert f.status("a.test").pending == 1


def test_gone_consumers_without_entries_are_removed_and_owners_kept(plain_redis_url: str, crawl: str) -> None:
    """Consumers of dead nodes that own nothing are removed; one that owns a lease stays; old records go."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    f.register_sites(["a.test"])
    f.enqueue("a.test", [out(i) for i in range(3)])
    e = f.lease("a.test", "finished", 1, (1, 1, 1)).entries[0]
    f.ack("a.test", [(e.stream, e.id)])
    f.lease("a.test", "owner", 1, (1, 1, 1))
    f.lease("a.test", "alive", 1, (1, 1, 1))
    now = time.time()
    node(f, "finished", now - 10_000)
    node(f, "owner", now - 10_000, lease_s=3600)
    node(f, "alive", now)
    stream = f.site("a.test").stream("http", "default")
    wait_for(lambda: min(c["idle"] for c in f.client.xinfo_consumers(stream, GROUP)) > 3 * HEARTBEAT_S * 1000,
             timeout=10, what="consumers idle longer than 3 heartbeats")
    r = reclaimer(plain_redis_url, node_retention_s=60)
    try:
        result = r.run_pass()
    finally:
        r.close()
    names = {c["name"].decode() for c in f.client.xinfo_consumers(stream, GROUP)}
    assert "finished" not in names and {"owner", "alive"} <= names
    assert result.total("consumers_removed") == 1
    assert set(f.nodes()) == {"owner", "alive"}  # "finished" was forgotten; "owner" owns a lease
    assert f.status("a.test").pending == 2


@pytest.mark.e2e
def test_three_reclaimers_never_move_an_entry_twice_or_lose_one(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """Three reclaimer processes race over the same expired leases: every entry ends up once, none lost."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    sites = [f"s{i}.test" for i in range(3)]
    f.register_sites(sites)
    payloads: Counter[bytes] = Counter()
    for s in sites:
        items = [out(f"{s}-{i}", stream=i % 3) for i in range(400)]
        f.enqueue(s, items)
        payloads.update(o.payload for o in items)
    args = ["--redis-url", plain_redis_url, "--prefix", crawl, "--interval", "0.05", "--batch", "7",
            "--lease-seconds", "0.2", "--max-deliveries", "1000"]
    daemons = [Daemon("reclaimer", [*args, "--name", f"r{n}"], tmp_path / f"r{n}.log") for n in range(3)]
    leases = 0
    try:
        for d in daemons:
            d.wait_event("pass")
        # lease everything to consumers that never ack, several rounds, while the three race
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            for s in sites:
                leases += len(f.lease(s, f"ghost-{leases % 5}", 150, (1, 1, 1), promote_limit=0).entries)
            time.sleep(0.05)
        wait_for(lambda: sum(f.status(s).pending for s in sites) == 0, timeout=30, what="no pending entry")
        codes = [d.terminate() for d in daemons]
    finally:
        for d in daemons:
            d.close()
    assert codes == [0, 0, 0]
    found: Counter[bytes] = Counter()
    for s in sites:
        for stream in f.site(s).streams:
            found.update(fields[b"r"] for _, fields in f.client.xrange(stream))
        assert f.status(s).dead_letters == 0
    assert found == payloads  # nothing lost, nothing duplicated
    reclaimed = sum(f.status(s).stats.get("reclaimed", 0) for s in sites)
    assert reclaimed == leases  # every expired lease requeued exactly once
    requeued_by = [sum(p["requeued"] for p in d.named("pass")) for d in daemons]
    assert sum(requeued_by) == leases and leases >= 1200
    assert sum(1 for n in requeued_by if n > 0) >= 2, requeued_by  # they really raced


@pytest.mark.e2e
def test_daemon_logs_one_json_line_per_pass_and_stops_on_sigterm(plain_redis_url: str, crawl: str, tmp_path: Path) -> None:
    """The daemon logs a JSON 'pass' line with counts each interval, serves metrics, and exits 0 on SIGTERM."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    f.register_sites(["a.test"])
    f.enqueue("a.test", [out(i) for i in range(5)])
    f.lease("a.test", "gone", 5, (1, 1, 1))
    port = free_port()
    d = Daemon("reclaimer", ["--redis-url", plain_redis_url, "--interval", "0.2", "--lease-seconds", "0.1",
                             "--metrics-port", str(port), "--name", "t1"], tmp_path / "r.log")
    try:
        passes = d.wait_event("pass", count=3)
        assert {"crawls", "sites", "requeued", "dead_lettered", "promoted", "consumers_removed", "duration_s"} <= set(passes[0])
        assert sum(p["requeued"] for p in passes) == 5
        metrics = wait_for(lambda: try_scrape(port), timeout=10)
        assert value(metrics, "streams_sched_reclaimer_requeued_total", crawl=crawl) == 5
        assert value(metrics, "streams_sched_reclaimer_passes_total") >= 3
        health = json.loads(f.client.get(health_key("reclaimer", "t1")))
        assert health["crawls"] >= 1
        check = subprocess.run([sys.executable, "-m", "reclaimer", "--redis-url", plain_redis_url, "--check", "--name", "t1"],
                               capture_output=True, text=True, timeout=30)
        assert check.returncode == 0, check.stderr
        assert d.terminate() == 0
    finally:
        d.close()
    assert d.named("stopped")[0]["signal"] == signal.SIGTERM
    assert f.client.get(health_key("reclaimer", "t1")) is None  # removed on a clean stop
    check = subprocess.run([sys.executable, "-m", "reclaimer", "--redis-url", plain_redis_url, "--check", "--name", "t1"],
                           capture_output=True, text=True, timeout=30)
    assert check.returncode == 1 and "no recent pass" in check.stderr


@pytest.mark.e2e
def test_unreachable_redis_at_start_is_one_line_and_exit_3() -> None:
    """With nothing listening, the daemon exits 3 with one 'error:' line naming the URL."""
    url = f"redis://127.0.0.1:{free_port()}/0"
    for module in ("reclaimer", "monitor"):
        res = subprocess.run([sys.executable, "-m", module, "--redis-url", url, "--connect-timeout", "0.3"],
                             capture_output=True, text=True, timeout=30)
        assert res.returncode == 3, (module, res.stderr)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"streams-{module}: error: Redis at {url}") and "REDIS_URL" in lines[0]


@pytest.mark.e2e
def test_daemon_retries_with_backoff_when_redis_goes_away(tmp_path: Path) -> None:
    """Redis killed under a running reclaimer: it says so, retries with back-off, and resumes when Redis is back."""
    server = RedisServer().start()
    try:
        d = Daemon("reclaimer", ["--redis-url", server.url, "--interval", "0.1"], tmp_path / "r.log")
        try:
            d.wait_event("pass")
            server.kill()
            warnings = d.wait_event("redis_unreachable", count=2, timeout=30)
            assert warnings[1]["retry_in_s"] > warnings[0]["retry_in_s"]
            assert d.proc.poll() is None
            server.start()
            back = d.wait_event("redis_reachable_again", timeout=60)
            assert back[0]["after_s"] > 0
            n = len(d.named("pass"))
            d.wait_event("pass", count=n + 1)
            assert d.terminate() == 0
        finally:
            d.close()
    finally:
        server.cleanup()


@pytest.mark.e2e
def test_burst_runs_one_pass_and_exits(plain_redis_url: str, tmp_path: Path) -> None:
    """--burst runs exactly one pass and exits 0."""
    d = Daemon("reclaimer", ["--redis-url", plain_redis_url, "--burst"], tmp_path / "r.log")
    try:
        assert d.wait(30) == 0
    finally:
        d.close()
    assert len(d.named("pass")) == 1


def commands(client: object) -> int:
    """Commands the server has run since it started (INFO commandstats)."""
    return sum(int(v["calls"]) for v in client.info("commandstats").values())  # type: ignore[attr-defined]


def test_a_pass_costs_the_same_with_thousands_of_idle_sites(plain_redis_url: str, crawl: str, measured: Any) -> None:
    """A pass (with pruning) over a crawl of 3 busy and 3,000 idle sites runs as many
    commands as over the 3 busy sites alone: it reads the shards' indexes, not the registry."""
    f = frontier(plain_redis_url, crawl)
    f.register()
    busy = ["a.test", "b.test", "c.test"]
    f.enqueue("a.test", [out(i) for i in range(3)])
    f.lease("a.test", "gone", 3, (1, 1, 1))
    f.enqueue("b.test", [out("later", delay_ms=1)])
    f.enqueue("c.test", [out(i) for i in range(5)])
    node(f, "gone", time.time() - 100, lease_s=0.05)
    f.load_scripts()  # so that neither pass counts a script load
    r = reclaimer(plain_redis_url, prune_interval_s=0.001)

    def pass_cost() -> tuple[int, int]:
        before = commands(f.client)
        result = r.run_pass()
        return commands(f.client) - before, result.crawls[0].sites

    try:
        wait_for(lambda: f.expired_sites(50, 10), timeout=10, what="a.test's leases to be older than lease_s")
        cost, looked_at = pass_cost()
        assert looked_at == 2 and r.run_pass().total("requeued") == 0  # a.test and b.test; then nothing left
        f.enqueue("a.test", [out(i) for i in range(10, 13)])
        f.lease("a.test", "gone", 3, (1, 1, 1))
        f.enqueue("b.test", [out("later2", delay_ms=1)])
        for i in range(0, 3000, 500):
            f.register_sites([f"idle{j}.test" for j in range(i, i + 500)])
        wait_for(lambda: f.expired_sites(50, 10), timeout=10, what="a.test's new leases to expire")
        cost_with_idle, looked_at = pass_cost()
    finally:
        r.close()
    assert looked_at == 2 and len(f.sites()) == 3003
    assert cost_with_idle <= cost, (cost, cost_with_idle)  # not one command per idle site
    assert cost <= 10 * f.shards + 40, cost  # index reads per shard, the busy sites' work (commands in scripts count)
    measured(f"a pass with pruning ran {cost} commands over 3 busy sites, {cost_with_idle} with 3,000 idle"
             f" sites besides ({f.shards} shards)")
    for site in busy:
        st = f.status(site)
        assert st.pending == 0 and st.delayed == 0
