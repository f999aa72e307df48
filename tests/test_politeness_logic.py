"""The politeness decisions one by one: feedback.lua's AIMD against a real Redis (time is
Redis TIME, so the tests move the stored timestamps instead of sleeping), lease.lua's use
of it, and the pure helpers (effective rate, answer batching, Crawl-delay, site keys)."""

from __future__ import annotations

import hashlib
import socket
from collections import deque
from typing import Any

import pytest

from streams_sched.connect.clients import connect
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts.feedback import FeedbackReply
from streams_sched.frontier.sitekey import site_keyer
from streams_sched.politeness.adaptive import (
    EffectiveRate,
    FeedbackBatch,
    crawl_delay_of,
    decode_window,
    effective_rate,
    encode_window,
    is_timeout,
)
from streams_sched.politeness.policy import set_policy

SITE = "s.test"
PARAMS = ("1", "0.7", "0.5", "0.1", 600_000)


@pytest.fixture
def f(plain_redis_url: str, crawl: str) -> Frontier:
    frontier = Frontier(connect(plain_redis_url), crawl)
    frontier.scripts.load()
    return frontier


def put(f: Frontier, fields: dict[str, Any]) -> None:
    """Set a site's shared politeness state: o_* fields (the observed window) live in its window
    string, the rest in its policy hash (as feedback.lua keeps them)."""
    k = f.site(SITE)
    observed = {n: v for n, v in fields.items() if n.startswith("o_")}
    rest = {n: v for n, v in fields.items() if not n.startswith("o_")}
    if observed:
        f.client.set(k.window, encode_window({**decode_window(f.client.get(k.window)), **observed}))
    if rest:
        f.client.hset(k.policy, mapping=rest)


def now_ms(f: Frontier) -> int:
    sec, usec = f.client.time()
    return int(sec) * 1000 + int(usec) // 1000


def state(f: Frontier) -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in f.client.hgetall(f.site(SITE).policy).items()}


def feedback(f: Frontier, ok: int = 0, throttled: int = 0, timeouts: int = 0, retry_ms: int = 0,
             robots: str = "", params: tuple[Any, ...] = PARAMS) -> FeedbackReply:
    return f.feedback(SITE, (ok, throttled, timeouts, retry_ms), robots, params)


def test_congestion_cuts_the_rate_once_per_cooldown_and_never_below_the_floor(f: Frontier) -> None:
    """A 429 multiplies the effective rate by the decrease factor; more 429s within the
    cooldown do not cut again; after it they do, down to the floor and no further."""
    set_policy(f, SITE, {"rate": 10})
    assert feedback(f, throttled=1).cut
    assert float(state(f)["a_rate"]) == pytest.approx(7.0)
    assert not feedback(f, throttled=3).cut  # answers to requests sent before the cut
    assert float(state(f)["a_rate"]) == pytest.approx(7.0)
    f.client.hset(f.site(SITE).policy, "a_cut", now_ms(f) - 1500)
    feedback(f, timeouts=1)
    assert float(state(f)["a_rate"]) == pytest.approx(4.9)
    put(f, {"a_rate": "0.12", "a_cut": now_ms(f) - 60_000})
    feedback(f, throttled=1)
    assert float(state(f)["a_rate"]) == pytest.approx(0.1)
    f.client.hset(f.site(SITE).policy, "a_cut", now_ms(f) - 60_000)
    feedback(f, throttled=1)
    assert float(state(f)["a_rate"]) == pytest.approx(0.1)
    stats = f.client.hgetall(f.site(SITE).stats)
    assert stats[b"throttled"] == b"6" and stats[b"timeouts"] == b"1" and stats[b"backoffs"] == b"3"  # at the floor: no cut


def test_healthy_answers_climb_additively_only_while_the_rate_is_used(f: Frontier) -> None:
    """Healthy answers add `increase` req/s per second, but only when the site used at least
    80% of its rate over the last second (RFC 7661); never above the policy rate."""
    set_policy(f, SITE, {"rate": 10})
    now = now_ms(f)
    put(f, {"a_rate": "5", "a_inc": now - 2000, "a_cut": now - 2000, "o_rate": "4.5", "o_ts": now})
    feedback(f, ok=3)
    # 5 + 0.5/s over the 2 s set back, plus what passed on the clock until the call ran
    # (on a loaded machine that is a few hundred ms)
    climbed = float(state(f)["a_rate"])
    assert 6.0 <= climbed <= 5 + 0.5 * (2000 + now_ms(f) - now) / 1000
    put(f, {"a_inc": now_ms(f) - 2000, "o_rate": "1"})  # hardly used
    feedback(f, ok=3)
    assert float(state(f)["a_rate"]) == climbed
    put(f, {"a_rate": "9.8", "a_inc": now_ms(f) - 2000, "o_rate": "9.7"})
    feedback(f, ok=3)
    assert "a_rate" not in state(f)  # back at the policy rate: the back-off is over


def test_first_429_of_an_unlimited_site_starts_from_what_it_served(f: Frontier) -> None:
    """Without a policy rate the first cut starts from the rate of healthy answers over the
    last second (what the site actually served), not from the much higher request rate."""
    now = now_ms(f)
    put(f, {"o_ts": now - 200, "o_n": 0, "o_ok": 0, "o_rate": "120", "o_okrate": "20"})
    feedback(f, throttled=5)
    assert float(state(f)["a_rate"]) == pytest.approx(14.0)


def test_an_unlimited_site_is_forgiven_after_the_forget_time(f: Frontier) -> None:
    """A site without a policy or robots rate drops its adaptive rate (unlimited again)
    after STREAMS_ADAPTIVE_FORGET_SECONDS without congestion."""
    now = now_ms(f)
    put(f, {"a_rate": "3", "a_cut": now - 700_000, "a_inc": now - 1000, "o_rate": "3"})
    feedback(f, ok=2)
    assert "a_rate" not in state(f)


def test_retry_after_pauses_the_site_for_every_worker(f: Frontier) -> None:
    """A Retry-After sets the site's paused-until time; lease.lua hands out nothing until then
    and tells the worker how long to wait."""
    f.enqueue(SITE, [Entry(b"", 1, 0, b"payload")])
    f.politeness = "a"
    until = feedback(f, throttled=1, retry_ms=3000).paused_until_ms
    assert 2500 <= until - now_ms(f) <= 3000
    lease = f.lease(SITE, "c1", 5, (8, 3, 1))
    assert lease.entries == [] and 2000 <= lease.wait_ms <= 3000
    assert f.status(SITE).rate.reason == "retry-after"
    f.politeness = ""  # STREAMS_ADAPTIVE=False: the pause is not applied
    assert len(f.lease(SITE, "c1", 5, (8, 3, 1)).entries) == 1


def test_adaptive_off_records_counts_but_changes_no_rate(f: Frontier) -> None:
    """With STREAMS_ADAPTIVE=False feedback only counts answers."""
    feedback(f, ok=4, throttled=2, retry_ms=1000, params=("0", *PARAMS[1:]))
    assert "a_rate" not in state(f) and "a_until" not in state(f)
    assert f.client.hget(f.site(SITE).stats, "throttled") == b"2"


def test_lease_applies_the_backed_off_rate_with_a_small_burst(f: Frontier) -> None:
    """lease.lua uses the adaptive rate when it is below the policy rate, with a burst of a
    tenth of it (at least 1), and reports it as the site's rate."""
    f.enqueue(SITE, [Entry(b"", 1, 0, b"p%d" % i) for i in range(20)])
    set_policy(f, SITE, {"rate": 100})
    f.client.hset(f.site(SITE).policy, "a_rate", "20")
    f.politeness = "a"
    lease = f.lease(SITE, "c1", 10, (8, 3, 1))
    assert lease.rate == 20 and len(lease.entries) == 2 and lease.wait_ms > 0


def test_robots_delay_is_the_rate_and_an_unknown_robots_gets_one_probe(f: Frontier) -> None:
    """With robots obeyed and no policy rate, a site whose robots.txt nobody read yet gets a
    single probe request; once a Crawl-delay is reported it is the site's rate (1 / delay)."""
    f.enqueue(SITE, [Entry(b"", 1, 0, b"p%d" % i) for i in range(10)])
    f.politeness = "ar"
    first = f.lease(SITE, "c1", 5, (8, 3, 1))
    second = f.lease(SITE, "c2", 5, (8, 3, 1))
    assert len(first.entries) == 1 and second.entries == [] and second.wait_ms > 0
    feedback(f, robots="0.5")
    assert f.status(SITE).rate == EffectiveRate(2.0, "robots")
    assert f.lease(SITE, "c2", 5, (8, 3, 1)).rate == 2.0
    set_policy(f, SITE, {"rate": 7})  # the policy's rate wins over robots.txt
    assert f.lease(SITE, "c2", 5, (8, 3, 1)).rate == 7.0


def test_page_cap_drops_and_counts_and_a_live_change_applies(f: Frontier) -> None:
    """enqueue.lua accepts max_pages requests with a fingerprint, drops and counts the rest,
    lets dont_filter requests through, and a raised cap admits new requests at once."""
    set_policy(f, SITE, {"max_pages": 3})
    out = [Entry(hashlib.sha1(b"%d" % i).digest(), 1, 0, b"p") for i in range(5)]
    reply = f.enqueue(SITE, [*out, Entry(b"", 1, 0, b"retry")])
    assert reply.added == 4 and reply.flags == b"111cc1" and reply.over_cap == 2
    set_policy(f, SITE, {"max_pages": 6})
    reply = f.enqueue(SITE, [Entry(hashlib.sha1(b"%d" % i).digest(), 1, 0, b"p") for i in range(5, 10)])
    assert reply.added == 3 and reply.flags == b"111cc"
    stats = f.client.hgetall(f.site(SITE).stats)
    assert stats[b"pages"] == b"6" and stats[b"over_cap"] == b"4"


#: (policy fields, the crawl's default rate, its default pause, the rate in force); an
#: ``a_until`` of "+5000" / "-500" is that many ms from Redis time now
RATE_CASES: list[tuple[dict[str, str], str, bool, EffectiveRate]] = [
    ({}, "", False, EffectiveRate(0.0, "unlimited")),
    ({}, "3", False, EffectiveRate(3.0, "policy")),
    ({"rate": "0.0"}, "3", False, EffectiveRate(0.0, "unlimited")),  # the site's own 0: no limit
    ({"rate": "5", "robots_delay": "2"}, "", False, EffectiveRate(5.0, "policy")),
    ({"robots_delay": "2"}, "", False, EffectiveRate(0.5, "robots")),
    ({"robots_delay": "2"}, "4", False, EffectiveRate(4.0, "policy")),
    ({"rate": "5", "a_rate": "2"}, "", False, EffectiveRate(2.0, "backoff")),
    ({"rate": "5", "a_rate": "9"}, "", False, EffectiveRate(5.0, "policy")),
    ({"a_rate": "2"}, "", False, EffectiveRate(2.0, "backoff")),
    ({"a_rate": "2", "a_until": "+5000"}, "", False, EffectiveRate(2.0, "retry-after", 5000)),
    ({"a_rate": "2", "a_until": "-500"}, "", False, EffectiveRate(2.0, "backoff")),
    ({"paused": "1", "rate": "5"}, "", False, EffectiveRate(0.0, "paused")),
    ({"rate": "5"}, "", True, EffectiveRate(0.0, "paused")),
    ({"paused": "0", "rate": "5"}, "", True, EffectiveRate(5.0, "policy")),
]


@pytest.mark.parametrize("fields, default_rate, default_paused, expected", RATE_CASES)
def test_status_reports_the_rate_lua_computes_and_the_python_copy_agrees(
    f: Frontier, fields: dict[str, str], default_rate: str, default_paused: bool, expected: EffectiveRate
) -> None:
    """status.lua reports the rate lua/lib/rate.lua computes (pause, Retry-After, back-off,
    robots, policy, unlimited), lease.lua leases at it, and politeness.adaptive's copy for
    code without a status read agrees."""
    now = now_ms(f)
    until = fields.get("a_until", "")
    if until:
        fields = {**fields, "a_until": str(now + int(until))}
    f.enqueue(SITE, [Entry(b"", 1, 0, b"p")])
    if fields:
        f.client.hset(f.site(SITE).policy, mapping=fields)
    f.use_crawl_defaults({"default_rate": default_rate, "default_paused": "1" if default_paused else ""})
    f.politeness = "ar"
    st = f.status(SITE)
    until_in = st.rate.paused_until_ms - now if st.rate.paused_until_ms else 0
    assert (st.rate.reason, st.rate.rate) == (expected.reason, pytest.approx(expected.rate))
    assert until_in == expected.paused_until_ms or 0 <= expected.paused_until_ms - until_in < 1000
    python = effective_rate(state(f), st.now_ms, default_rate=float(default_rate or 0), default_paused=default_paused)
    assert python == EffectiveRate(pytest.approx(st.rate.rate), st.rate.reason, st.rate.paused_until_ms)
    if expected.reason not in ("paused", "retry-after"):
        assert f.lease(SITE, "c1", 1, (8, 3, 1)).rate == pytest.approx(expected.rate)


def test_feedback_batch_sums_per_site_and_reports_congestion_at_once() -> None:
    """Healthy answers wait for the interval; a 429, timeout or robots.txt makes the batch due at once."""
    batch = FeedbackBatch(0.5)
    q: deque[tuple[str, str, Any]] = deque([("a", "ok", 1), ("a", "ok", 1), ("b", "ok", 1)])
    batch.absorb(q)
    assert batch.due(0.0)  # never reported yet
    assert sorted(batch.take(0.0)) == [("a", (2, 0, 0, 0), ""), ("b", (1, 0, 0, 0), "")]
    batch.absorb(deque([("a", "ok", 1)]))
    assert not batch.due(0.1)
    batch.absorb(deque([("a", "throttled", 2000), ("a", "throttled", 500), ("a", "timeout", 1), ("c", "robots", "0.5")]))
    assert batch.due(0.1)
    assert sorted(batch.take(0.1)) == [("a", (1, 2, 1, 2000), ""), ("c", (0, 0, 0, 0), "0.5")]


def test_healthy_answers_take_the_ack_of_their_site_only_when_nothing_else_is_to_report() -> None:
    """take_healthy hands a site's healthy answers to its ack when that ack ends the worker's
    last lease of the site or they waited an interval; a site with a 429, timeout or
    robots.txt report keeps them for its own feedback.lua call."""
    batch = FeedbackBatch(0.5)
    batch.absorb(deque([("a", "ok", 1), ("a", "ok", 1), ("b", "ok", 1), ("b", "throttled", 0), ("c", "robots", "1")]), 10.0)
    assert batch.take_healthy("a", 10.1, last=False) == 0  # more acks of a to come, and young
    assert batch.take_healthy("a", 10.1, last=True) == 2
    assert batch.take_healthy("a", 10.1, last=True) == 0  # taken
    assert all(batch.take_healthy(s, 11.0, last=True) == 0 for s in "bcd")
    assert sorted(site for site, _, _ in batch.take(11.0)) == ["b", "c"]
    batch.absorb(deque([("a", "ok", 1), ("b", "ok", 1), ("b", "timeout", 1)]), 20.0)
    assert [site for site, _, _ in batch.take(20.1, acking={"a", "b"})] == ["b"]  # a waits for its ack
    assert batch.take_healthy("a", 20.6, last=False) == 1  # waited an interval: goes with any ack


def test_healthy_answers_riding_on_an_ack_count_as_a_feedback_call_would(f: Frontier) -> None:
    """ack.lua with answers records what feedback.lua records for the same healthy answers
    (counter, observed window with its expiry, the additive climb) and still acks."""
    set_policy(f, SITE, {"rate": 10})
    f.enqueue(SITE, [Entry(b"", 1, 0, b"p1"), Entry(b"", 1, 0, b"p2")])
    entries = f.lease(SITE, "w1", 2, (1, 1, 1)).entries
    assert len(entries) == 2
    now = now_ms(f)
    put(f, {"a_rate": "5", "a_inc": now - 2000, "a_cut": now - 2000, "o_rate": "4.5", "o_ts": now})
    assert f.ack(SITE, [(e.stream, e.id) for e in entries], answers=(3, PARAMS)) == 2
    assert float(state(f)["a_rate"]) == pytest.approx(6.0, abs=0.05)  # as feedback(f, ok=3)
    k = f.site(SITE)
    assert f.client.hget(k.stats, "answers_ok") == b"3" and f.client.hget(k.stats, "acked") == b"2"
    assert decode_window(f.client.get(k.window))["o_n"] == "3" and 0 < f.client.pttl(k.window) <= 3000
    assert f.ack(SITE, [(entries[0].stream, entries[0].id)]) == 0  # without answers: as before
    assert f.client.hget(k.stats, "answers_ok") == b"3"


def test_crawl_delay_is_read_from_scrapys_parsers() -> None:
    """crawl_delay_of reads Crawl-delay from Scrapy's Protego and urllib parsers, per user agent."""
    from scrapy.robotstxt import ProtegoRobotParser, PythonRobotParser

    # whole seconds: urllib's parser ignores a fractional Crawl-delay (Protego reads "0.5" too)
    body = b"User-agent: slowbot\nCrawl-delay: 4\n\nUser-agent: *\nCrawl-delay: 2\n"
    for cls in (ProtegoRobotParser, PythonRobotParser):
        parser = cls(body, None)
        assert crawl_delay_of(parser, "slowbot") == 4.0
        assert crawl_delay_of(parser, "otherbot") == 2.0
        assert crawl_delay_of(cls(b"User-agent: *\nDisallow:\n", None), "x") is None

    class Old:  # a parser of Scrapy < 2.18: no crawl_delay(), the delay is on its rp
        def __init__(self) -> None:
            self.rp = ProtegoRobotParser(body, None).rp

    assert crawl_delay_of(Old(), "slowbot") == 4.0


def test_is_timeout_knows_twisteds_timeouts() -> None:
    """Twisted's download timeouts count as congestion; a refused connection does not."""
    from twisted.internet import error

    assert is_timeout(error.TimeoutError()) and is_timeout(error.TCPTimedOutError())
    download_timeout = getattr(__import__("scrapy.exceptions").exceptions, "DownloadTimeoutError", None)
    if download_timeout is not None:  # Scrapy 2.14+
        assert is_timeout(download_timeout("took longer than 1 s"))
    assert not is_timeout(error.ConnectionRefusedError())


def test_domain_site_key_uses_the_shipped_suffix_list_offline(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """STREAMS_SITE_KEY="domain" groups by registered domain with the public suffix list
    shipped in tldextract: no network, no cache written."""

    def no_network(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("tldextract tried the network")

    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TLDEXTRACT_CACHE", str(tmp_path / "cache"))
    key = site_keyer("domain")
    assert key("a.shop.co.uk") == key("b.shop.co.uk") == "shop.co.uk"
    assert key("www.example.com") == "example.com"
    assert key("127.0.0.1") == "127.0.0.1" and key("localhost") == "localhost"
    assert site_keyer("host")("a.shop.co.uk") == "a.shop.co.uk"
    assert list(tmp_path.iterdir()) == []


def test_monitor_exports_each_sites_rate_reason_and_pause() -> None:
    """The monitor's families carry each labelled site's rate in force with its reason, the
    paused-until time, 429/503 answers, back-offs and requests over the page cap."""
    from monitor.exporter import SiteLabeller, build_families
    from monitor.snapshot import CrawlSnapshot
    from streams_sched.frontier.records import SiteStatus

    def site(name: str, policy: dict[str, str], stats: dict[str, int]) -> SiteStatus:
        return SiteStatus(name, 1_000_000, {}, 0, -1, 0, stats, policy)

    snap = CrawlSnapshot("c", 1000.0, [
        site("a.test", {"rate": "5", "a_rate": "2", "a_until": "1003000"}, {"throttled": 7, "backoffs": 2}),
        site("b.test", {"robots_delay": "0.5"}, {"over_cap": 4}),
        site("c.test", {}, {}),
    ])
    labeller = SiteLabeller(10)
    labeller.update(snap)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for fam in build_families([snap], {}, labeller) for s in fam.samples}
    assert samples[("streams_sched_site_rate_limit", (("crawl", "c"), ("reason", "retry-after"), ("site", "a.test")))] == 2.0
    assert samples[("streams_sched_site_paused_until_seconds", (("crawl", "c"), ("site", "a.test")))] == 1003.0
    assert samples[("streams_sched_site_rate_limit", (("crawl", "c"), ("reason", "robots"), ("site", "b.test")))] == 2.0
    assert samples[("streams_sched_site_rate_limit", (("crawl", "c"), ("reason", "unlimited"), ("site", "c.test")))] == 0.0
    assert samples[("streams_sched_throttled_total", (("crawl", "c"), ("site", "a.test")))] == 7
    assert samples[("streams_sched_backoffs_total", (("crawl", "c"),))] == 2
    assert samples[("streams_sched_over_cap_total", (("crawl", "c"), ("site", "b.test")))] == 4


def test_status_and_site_set_show_and_change_politeness(plain_redis_url: str, crawl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`streams-sched status` shows each site's rate in force, why, and a paused-until time;
    `site set --max-pages` sets the page cap and domain-mode pushes group by registered domain."""
    import json

    from click.testing import CliRunner

    from streams_sched.cli import main
    from streams_sched.frontier.seeding import Seeder

    r = connect(plain_redis_url)
    r.hset(f"ss:{{{crawl}}}:meta", "site_key", "domain")
    Seeder(r, crawl).seed(["http://a.shop.co.uk/1", "http://b.shop.co.uk/2", "http://x.test/1"])
    f = Frontier(r, crawl)
    f.scripts.load()
    assert f.sites() == ["shop.co.uk", "x.test"]
    f.feedback("shop.co.uk", (0, 1, 0, 5000), "", PARAMS)
    monkeypatch.setenv("REDIS_URL", plain_redis_url)
    runner = CliRunner()
    res = runner.invoke(main, ["site", "set", "x.test", "--max-pages", "9", "-c", crawl], catch_exceptions=False)
    assert res.exit_code == 0 and "max_pages=9" in res.output
    out = json.loads(runner.invoke(main, ["status", "--json", "-c", crawl], catch_exceptions=False).output)
    rows = {row["site"]: row for row in out["sites"]}
    assert rows["shop.co.uk"]["limit_reason"] == "retry-after" and rows["shop.co.uk"]["paused_until_ms"] > 0
    assert rows["shop.co.uk"]["throttled"] == 1
    assert rows["x.test"]["limit_reason"] == "unlimited" and rows["x.test"]["max_pages"] == 9
    text = runner.invoke(main, ["status", "-c", crawl], catch_exceptions=False).output
    assert "WHY" in text and "retry-after" in text and "PAUSED UNTIL" in text
    print(text)


def test_crawl_delay_from_a_robots_body_for_older_scrapy() -> None:
    """Without Scrapy's robots_parsed signal the delay is read from the robots.txt body with Protego."""
    from streams_sched.politeness.adaptive import robots_body_crawl_delay

    body = b"User-agent: slowbot\nCrawl-delay: 4\n\nUser-agent: *\nCrawl-delay: 0.5\n"
    assert robots_body_crawl_delay(body, "slowbot") == 4.0
    assert robots_body_crawl_delay(body, "Mozilla/5.0 otherbot") == 0.5
    assert robots_body_crawl_delay(b"<html>404</html>", "x") is None
    assert robots_body_crawl_delay(b"\xff\xfe garbage", "x") is None


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("STREAMS_SITE_KEY", "tld", '"host" or "domain"'),
        ("STREAMS_ADAPTIVE", "maybe", "True or False"),
        ("STREAMS_ADAPTIVE_DECREASE", 1.5, "between 0 and 1"),
        ("STREAMS_ADAPTIVE_INCREASE", 0, "greater than 0"),
        ("STREAMS_ADAPTIVE_MIN_RATE", -1, "greater than 0"),
        ("STREAMS_MAX_CRAWL_DELAY", 0, "greater than 0"),
        ("STREAMS_FEEDBACK_INTERVAL_SECONDS", "soon", "expected a number"),
        ("STREAMS_SITES", {"*": {"max_pages": 10}}, "per site"),
        ("STREAMS_SITES", {"a.test": {"max_pages": -1}}, "0 or more"),
    ],
)
def test_bad_politeness_settings_fail_naming_the_setting(name: str, value: Any, message: str) -> None:
    """A bad politeness setting fails at start with a ConfigError naming the setting and value."""
    from streams_sched.config import StreamsConfig
    from streams_sched.errors import ConfigError

    with pytest.raises(ConfigError) as info:
        StreamsConfig.from_settings({"REDIS_URL": "redis://localhost:6379/0", name: value}, "spider")
    assert name in str(info.value) and message in str(info.value)


def test_observed_window_string_round_trips() -> None:
    """encode_window and decode_window agree; a malformed or missing value reads as no window."""
    fields = {"o_ts": "1733000000000", "o_n": "3", "o_ok": "2", "o_rate": "4.5", "o_okrate": "3"}
    assert decode_window(encode_window(fields)) == fields
    assert decode_window(encode_window({"o_rate": "1"})) == {"o_rate": "1"}
    assert decode_window(None) == {} and decode_window(b"1,2") == {}


def test_late_429s_do_not_cut_below_what_the_site_served(f: Frontier) -> None:
    """429s that answer requests sent before a cut (the rate is already below decrease x the
    rate the site served over the last second) cut nothing; once the site serves less, they do."""
    now = now_ms(f)
    put(f, {"a_rate": "14", "a_cut": now - 5000, "o_ts": now, "o_n": 0, "o_ok": 0,
                                "o_rate": "30", "o_okrate": "20"})
    assert not feedback(f, throttled=2).cut
    assert float(state(f)["a_rate"]) == pytest.approx(14.0)
    put(f, {"o_okrate": "14"})  # the site now serves only what it is sent
    assert feedback(f, throttled=1).cut
    assert float(state(f)["a_rate"]) == pytest.approx(9.8)
