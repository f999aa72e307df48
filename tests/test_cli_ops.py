"""The operating CLI against a real Redis: status, watch, dlq, pause/resume, nodes; exit codes and messages."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from click.testing import CliRunner

from streams_sched import seed
from streams_sched.cli import main
from streams_sched.frontier.records import Entry
from streams_sched.testing import free_port

from helpers import frontier


@pytest.fixture
def cli(plain_redis_url: str, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("REDIS_URL", plain_redis_url)
    monkeypatch.setenv("STREAMS_CONNECT_TIMEOUT_SECONDS", "0.3")
    runner = CliRunner()

    def run(*args: str, input: str | None = None):
        return runner.invoke(main, list(args), input=input, catch_exceptions=False)

    return run


def seeded(url: str, crawl: str, n: int = 9):
    seed(__import__("redis").Redis.from_url(url), crawl, [f"http://a{i % 3}.test/p/{i}" for i in range(n)])
    return frontier(url, crawl)


def test_status_shows_bands_pending_and_rate_over_the_last_minute(plain_redis_url: str, crawl: str, cli) -> None:
    """status lists each site with its backlog by band, pending, dead letters and the ack rate."""
    f = seeded(plain_redis_url, crawl)
    leased = f.lease("a0.test", "w1", 3, (1, 1, 1)).entries
    f.ack("a0.test", [(e.stream, e.id) for e in leased[:2]])
    res = cli("status", "-c", crawl, "--all")
    assert res.exit_code == 0, res.output
    header, a0 = res.output.splitlines()[:2]
    assert header.split()[:6] == ["SITE", "HIGH", "DEFAULT", "LOW", "BROWSER", "PENDING"] and "RATE 1M" in header
    assert a0.split()[:7] == ["a0.test", "0", "0", "0", "0", "1", a0.split()[6]]
    assert "/s" in a0  # 2 acks within the last minute
    assert "TRACKED" in header and "OVERDUE" in header and "429/503" in header
    data = json.loads(cli("status", "-c", crawl, "--json", "--sort", "pending", "-n", "1").output)
    assert [r["site"] for r in data["sites"]] == ["a0.test"]
    assert data["totals"]["acked"] == 2 and data["totals"]["backlog"] == 6 and data["totals"]["sites"] == 3
    assert data["sites"][0]["rate_per_s"] == pytest.approx(2 / 50, rel=0.25)


def test_status_leaves_out_the_columns_a_crawl_does_not_use(plain_redis_url: str, crawl: str, cli) -> None:
    """Without --all, status shows the core columns and those a row has something in: a crawl
    that tracks, renders and throttles nothing gets no revisit, browser or 429 columns."""
    f = seeded(plain_redis_url, crawl)
    f.lease("a0.test", "w1", 1, (1, 1, 1))
    header = cli("status", "-c", crawl).output.splitlines()[0]
    assert header.split() == ["SITE", "DEFAULT", "PENDING", "OLDEST", "LEASE", "DELAYED", "DEAD", "ENQUEUED", "ACKED",
                              "RATE", "1M", "LIMIT", "WHY"]
    seed(__import__("redis").Redis.from_url(plain_redis_url), crawl, ["http://b.test/"], meta={"task_type": "browser"})
    header = cli("status", "-c", crawl).output.splitlines()[0]
    assert "BROWSER" in header and "TRACKED" not in header and "HIGH" not in header


def test_ack_of_a_finished_site_costs_one_counter(plain_redis_url: str, crawl: str) -> None:
    """An ack that leaves a site with no stream counts it in acked alone: no rate buckets, no stream, no lease left."""
    f = frontier(plain_redis_url, crawl)
    k = f.site("a.test")
    f.enqueue("a.test", [Entry(b"", 1, 0, b"x")])
    entries = f.lease("a.test", "w", 1, (1, 1, 1)).entries
    assert f.ack("a.test", [(e.stream, e.id) for e in entries]) == 1
    stats = {n.decode(): int(v) for n, v in f.client.hgetall(k.stats).items()}
    assert stats["acked"] == 1 and not any(n.startswith("ack") and n != "acked" for n in stats)
    assert not f.client.exists(*k.streams) and f.client.zscore(k.index.leased, "a.test") is None


def test_ack_buckets_count_acks_of_the_last_minute(plain_redis_url: str, crawl: str) -> None:
    """ack.lua keeps per-10-second counts of a site with work left, so its rate reflects recent acks only."""
    from streams_sched.politeness.rates import acks_last_minute

    f = frontier(plain_redis_url, crawl)
    # six queued, five leased: the site still has work after the acks
    f.enqueue("a.test", [Entry(hashlib.sha1(b"%d" % i).digest(), 1, 0, b"x") for i in range(6)])
    entries = f.lease("a.test", "w", 5, (1, 1, 1)).entries
    f.ack("a.test", [(e.stream, e.id) for e in entries[:3]])
    f.ack("a.test", [(e.stream, e.id) for e in entries[3:]])
    st = f.status("a.test")
    assert acks_last_minute(st.stats, st.now_ms)[0] == 5
    assert acks_last_minute(st.stats, st.now_ms + 70_000)[0] == 0


def test_ack_in_a_new_bucket_deletes_the_skipped_slots(plain_redis_url: str, crawl: str) -> None:
    """An ack in a new 10-second bucket drops the slots of the buckets skipped since the last
    ack, starts its own slot at its count, keeps the last bucket's, and adds to the total."""
    f = frontier(plain_redis_url, crawl)
    k = f.site("a.test")
    for _attempt in range(3):  # a bucket boundary between the two TIME reads: once more
        f.client.delete(k.stats)
        # one more than leased: the site still has work after the ack
        f.enqueue("a.test", [Entry(b"", 1, 0, b"x"), Entry(b"", 1, 0, b"y"), Entry(b"", 1, 0, b"z")])
        entries = f.lease("a.test", "w", 2, (1, 1, 1)).entries
        sec, _ = f.client.time()
        b = int(sec) // 10
        f.client.hset(k.stats, mapping={"acked": 10, "ack_b": b - 3, f"ack{(b - 3) % 6}": 4,
                                        f"ack{(b - 2) % 6}": 99, f"ack{b % 6}": 50})
        assert f.ack("a.test", [(e.stream, e.id) for e in entries]) == 2
        if int(f.client.time()[0]) // 10 == b:
            break
    stats = {n.decode(): int(v) for n, v in f.client.hgetall(k.stats).items() if n.startswith(b"ack")}
    assert stats == {"acked": 12, "ack_b": b, f"ack{(b - 3) % 6}": 4, f"ack{b % 6}": 2}


def test_ack_after_the_clock_went_back_still_counts(plain_redis_url: str, crawl: str) -> None:
    """An ack whose bucket is older than the newest one written (a failover to a Redis with a
    slower clock) succeeds and counts in its own bucket."""
    f = frontier(plain_redis_url, crawl)
    k = f.site("a.test")
    f.enqueue("a.test", [Entry(b"", 1, 0, b"x"), Entry(b"", 1, 0, b"y")])
    entries = f.lease("a.test", "w", 1, (1, 1, 1)).entries
    b = int(f.client.time()[0]) // 10
    f.client.hset(k.stats, mapping={"acked": 3, "ack_b": b + 2, f"ack{(b + 2) % 6}": 3})
    assert f.ack("a.test", [(e.stream, e.id) for e in entries]) == 1
    stats = {n.decode(): int(v) for n, v in f.client.hgetall(k.stats).items() if n.startswith(b"ack")}
    assert stats["acked"] == 4 and stats["ack_b"] in (b, b + 1) and stats[f"ack{stats['ack_b'] % 6}"] == 1


def test_exit_codes_scripts_can_rely_on(plain_redis_url: str, crawl: str, cli) -> None:
    """Unknown crawl 1, usage error 2, Redis unreachable 3, each with one 'error:' line (usage: click's)."""
    res = cli("status", "-c", "nosuchcrawl")
    assert res.exit_code == 1 and res.output.strip().startswith("error: no crawl named 'nosuchcrawl'")
    res = cli("status", "-c", crawl, "--redis-url", f"redis://127.0.0.1:{free_port()}/0")
    assert res.exit_code == 3 and res.output.count("\n") == 1 and "did not answer" in res.output
    assert cli("status", "-c", "bad name").exit_code == 2
    assert cli("dlq", "requeue", "-c", crawl).exit_code == 2


def test_dlq_list_requeue_and_purge(plain_redis_url: str, crawl: str, cli) -> None:
    """Dead letters are listed with reason and URL, requeued once into their stream, and purged."""
    f = seeded(plain_redis_url, crawl)
    e = f.lease("a1.test", "w1", 3, (1, 1, 1)).entries
    f.dead_letter("a1.test", "w1", [(x.stream, x.id, f"parse error {n}") for n, x in enumerate(e)])
    res = cli("dlq", "list", "-c", crawl)
    assert res.exit_code == 0 and "3 of 3 dead letter(s)" in res.output and "http://a1.test/p/" in res.output
    rows = [json.loads(line) for line in cli("dlq", "list", "-c", crawl, "--json", "--match", "error 1").output.splitlines()]
    assert len(rows) == 1 and rows[0]["reason"] == "parse error 1" and rows[0]["queue"] == "http:default"
    res = cli("dlq", "requeue", "-c", crawl, "--site", "a1.test", rows[0]["id"], "9999999999999-0")
    assert res.exit_code == 1 and "requeued 1" in res.output and "1 of the 2 given id(s) are not" in res.output
    st = f.status("a1.test")
    assert (st.dead_letters, st.backlog, st.stats["dlq_requeued"]) == (2, 1, 1)
    again = f.lease("a1.test", "w2", 5, (1, 1, 1)).entries
    assert len(again) == 1 and again[0].deliveries == 0  # a fresh delivery count
    assert cli("dlq", "requeue", "-c", crawl, "--all").output.startswith("requeued 2 dead letter(s)")
    f.dead_letter("a1.test", "w2", [(again[0].stream, again[0].id, "still broken")])
    assert cli("dlq", "purge", "-c", crawl).exit_code == 1  # asks, no terminal: aborted
    res = cli("dlq", "purge", "-c", crawl, "--yes")
    assert res.exit_code == 0 and "deleted 1 dead letter(s)" in res.output
    assert f.status("a1.test").dead_letters == 0


def test_pause_stops_leasing_and_resume_restarts_it(plain_redis_url: str, crawl: str, cli) -> None:
    """A paused site keeps its backlog and leases nothing until resumed; unknown sites need --force."""
    f = seeded(plain_redis_url, crawl)
    res = cli("pause", "-c", crawl, "a2.test")
    assert res.exit_code == 0 and "paused 1 site(s)" in res.output
    reply = f.lease("a2.test", "w1", 5, (1, 1, 1))
    assert reply.entries == [] and reply.wait_ms == -1 and reply.backlog_http == 3
    assert "yes" in [line for line in cli("status", "-c", crawl).output.splitlines() if line.startswith("a2.test")][0]
    assert cli("resume", "-c", crawl, "a2.test").exit_code == 0
    assert len(f.lease("a2.test", "w1", 5, (1, 1, 1)).entries) == 3
    res = cli("pause", "-c", crawl, "typo.test")
    assert res.exit_code == 1 and "--force" in res.output
    assert cli("pause", "-c", crawl, "typo.test", "--force").exit_code == 0
    assert cli("pause", "-c", crawl, "bad site!").exit_code == 2


def test_watch_until_drained_exits_0_or_4_on_timeout(plain_redis_url: str, crawl: str, cli) -> None:
    """watch --until-drained exits 0 once nothing is left, and 4 when --timeout passes first."""
    f = seeded(plain_redis_url, crawl, n=3)
    res = cli("watch", "-c", crawl, "--until-drained", "--timeout", "0.3", "-i", "0.1", "--progress-only")
    assert res.exit_code == 4 and "not drained after 0.3s (3 left)" in res.output
    assert "done 0/3" in res.output.splitlines()[0]
    for s in f.sites():
        e = f.lease(s, "w", 5, (1, 1, 1)).entries
        f.ack(s, [(x.stream, x.id) for x in e])
    res = cli("watch", "-c", crawl, "--until-drained", "-i", "0.1")
    assert res.exit_code == 0 and "100.0%" in res.output and "drained" in res.output.splitlines()[-1]


def test_nodes_lists_alive_dead_and_offline(plain_redis_url: str, crawl: str, cli) -> None:
    """nodes shows each worker's state from its heartbeats, and a browser worker's leases against its cap."""
    f = seeded(plain_redis_url, crawl)
    now = time.time()
    for name, seen, state in (("n-alive", now, "online"), ("n-dead", now - 60, "online"), ("n-off", now - 60, "offline")):
        f.record_node(name, {"node": name, "host": "h", "pid": 1, "state": state, "last_seen": seen, "heartbeat_s": 1, "lease_s": 30,
                             "browser": 3, "browser_max": 4 if name == "n-alive" else 0})
    data = json.loads(cli("nodes", "-c", crawl, "--json").output)
    assert {n["node"]: n["state"] for n in data["nodes"]} == {"n-alive": "alive", "n-dead": "dead", "n-off": "offline"}
    assert {n["node"]: n["browser"] for n in data["nodes"]} == {"n-alive": "3/4", "n-dead": "", "n-off": ""}
    assert "1 alive, 1 dead, 1 offline" in cli("nodes", "-c", crawl).output
    out = json.loads(cli("crawls", "--json").output)
    assert [c["crawl"] for c in out] == [crawl] and out[0]["backlog"] == 9


def test_status_reads_rows_only_for_sites_with_work_unless_all(plain_redis_url: str, crawl: str, cli) -> None:
    """With 500 idle sites besides 3 with work, status runs the status script on the 3
    only and takes the crawl's totals from the shards; --top bounds the rows, --all reads all."""
    f = seeded(plain_redis_url, crawl)
    f.register_sites([f"idle{i}.test" for i in range(500)])
    # as a worker does: a lease call names a0 (moving its shard's new sites into the ready index), then leases it
    f.lease_shard(f.site("a0.test").shard or 0, "w1", [], (1, 1, 1), name=8)
    f.lease("a0.test", "w1", 1, (1, 1, 1))
    calls = lambda: int(f.client.info("commandstats").get("cmdstat_evalsha_ro", {}).get("calls", 0))  # noqa: E731
    before = calls()
    data = json.loads(cli("status", "-c", crawl, "--json").output)
    assert calls() - before == 3
    t = data["totals"]
    assert [r["site"] for r in data["sites"]] == ["a0.test", "a1.test", "a2.test"]
    assert (t["sites"], t["ready_http"], t["leased_sites"], t["enqueued"], t["backlog"], t["pending"]) == (503, 3, 1, 9, 8, 1)
    assert t["complete"] and t["done"] == 0
    res = cli("status", "-c", crawl, "--top", "1")
    assert res.exit_code == 0 and "a0.test" in res.output and "a1.test" not in res.output
    assert "503 site(s), 3 with work ready" in res.output and "figures are partial" in res.output
    data = json.loads(cli("status", "-c", crawl, "--json", "--all").output)
    assert len(data["sites"]) == 503 and data["totals"]["sites"] == 503


def test_push_site_show_and_purge_on_the_sharded_layout(plain_redis_url: str, crawl: str, cli) -> None:
    """push adds requests, site show lists every site's policy, purge --site removes one site
    from its shard's registry and indexes, purge the whole crawl."""
    res = cli("push", "-c", crawl, "http://x.test/1", "http://x.test/2", "http://y.test/1")
    assert res.exit_code == 0 and "pushed 3 request(s)" in res.output
    assert cli("site", "set", "-c", crawl, "y.test", "--rate", "2").exit_code == 0
    shown = json.loads(cli("site", "show", "-c", crawl, "--json").output)
    assert shown["y.test"] == {"rate": "2.0"} and shown["x.test"] == {} and "*" in shown
    f = frontier(plain_redis_url, crawl)
    assert f.sites() == ["x.test", "y.test"]
    assert cli("purge", "-c", crawl, "--site", "x.test", "--yes").exit_code == 0
    assert f.sites() == ["y.test"] and not any(f.client.zscore(k, "x.test") for k in f.site("x.test").index.readies)
    assert json.loads(cli("status", "-c", crawl, "--json").output)["totals"]["backlog"] == 1
    res = cli("purge", "-c", crawl, "--yes")
    assert res.exit_code == 0 and f.client.keys(f"ss:{{{crawl}*") == []
