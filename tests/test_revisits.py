"""Continuous crawling: tracked pages come back on their own schedule (worker/revisits.py,
ack.lua), in-process with the harness and as pure decisions."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis
import scrapy
from scrapy.http import HtmlResponse

from streams_sched.config import StreamsConfig
from streams_sched.frontier.client import Frontier
from streams_sched.worker.revisits import Spec, next_visit, spec_of

from harness import InProcessWorker
from helpers import wait_for

CONFIG = StreamsConfig(redis_url="redis://x", crawl="c", revisit_jitter=0.0, revisit_min_seconds=10.0,
                       revisit_max_seconds=100.0)
ADAPTIVE = Spec(40.0, True, 10.0, 100.0)


class TrackingSpider(scrapy.Spider):
    name = "tracking"

    def parse(self, response: Any) -> None:  # pragma: no cover - never called
        pass

    def parse_product(self, response: Any) -> None:  # pragma: no cover - never called
        pass


@pytest.fixture
def worker(redis_url: str, dedupe: str, crawl: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(redis_url, crawl, dedupe=dedupe, spider=TrackingSpider(), STREAMS_REVISIT_JITTER=0.0)
    yield w
    w.close()


def answer(w: InProcessWorker, request: scrapy.Request, status: int = 200, body: bytes = b"<p>same</p>") -> None:
    """The engine got ``request``'s answer and is done with it (as response_received and the ack hook would)."""
    revisits = w.scheduler.revisits
    assert revisits is not None
    revisits.on_response(HtmlResponse(request.url, status=status, body=body), request)
    w.scheduler.request_done(request)
    w.settle()


def delayed(r: redis.Redis, crawl: str, site: str) -> list[tuple[bytes, float]]:
    return r.zrange(Frontier(r, crawl).site(site).delayed, 0, -1, withscores=True)


def redis_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return s * 1000 + us // 1000


# -- the pure decision ---------------------------------------------------------


def test_an_unchanged_page_waits_longer_and_a_changed_one_less_within_the_bounds() -> None:
    """Unchanged multiplies the interval by 1.4, changed by 0.8, never past max or below min."""
    first = next_visit(ADAPTIVE, {}, 200, "a", CONFIG, 0.0)
    assert first is not None and first.state == {"i": 40.0, "s": "a"} and first.found == ""
    same = next_visit(ADAPTIVE, first.state, 200, "a", CONFIG, 0.0)
    assert same is not None and same.delay_s == pytest.approx(56.0) and same.found == "u"
    changed = next_visit(ADAPTIVE, same.state, 200, "b", CONFIG, 0.0)
    assert changed is not None and changed.delay_s == pytest.approx(44.8) and changed.found == "c"
    state: dict[str, Any] = changed.state
    for _ in range(20):
        v = next_visit(ADAPTIVE, state, 200, "b", CONFIG, 0.0)
        assert v is not None
        state = v.state
    assert state["i"] == 100.0
    for sig in range(20):
        v = next_visit(ADAPTIVE, state, 200, str(sig), CONFIG, 0.0)
        assert v is not None
        state = v.state
    assert state["i"] == 10.0


def test_a_gone_page_stops_after_the_count_and_a_temporary_failure_keeps_it() -> None:
    """404/410 in a row stop tracking at STREAMS_REVISIT_STOP_AFTER; a 503 or no answer keeps the interval and the count; a 200 resets it."""
    state: dict[str, Any] = {"i": 40.0, "s": "a"}
    one = next_visit(ADAPTIVE, state, 404, None, CONFIG, 0.0)
    assert one is not None and one.state["f"] == 1 and one.delay_s == 40.0
    kept = next_visit(ADAPTIVE, one.state, 503, None, CONFIG, 0.0)
    assert kept is not None and kept.state["f"] == 1 and kept.interval_s == 40.0
    none = next_visit(ADAPTIVE, kept.state, None, None, CONFIG, 0.0)
    assert none is not None and none.state["f"] == 1 and none.interval_s == 40.0
    back = next_visit(ADAPTIVE, none.state, 200, "a", CONFIG, 0.0)
    assert back is not None and "f" not in back.state
    two = next_visit(ADAPTIVE, one.state, 410, None, CONFIG, 0.0)
    assert two is not None and two.state["f"] == 2
    assert next_visit(ADAPTIVE, two.state, 404, None, CONFIG, 0.0) is None


def test_temporary_failures_in_a_row_back_the_next_visit_off_and_a_good_answer_ends_it() -> None:
    """503, no answer and 429 in a row double the delay up to STREAMS_REVISIT_BACKOFF_LIMIT x the interval (and the page's max); the interval itself stays, and a 200 brings the page back to it."""
    config = StreamsConfig(redis_url="redis://x", crawl="c", revisit_jitter=0.0, revisit_backoff_limit=8)
    spec = Spec(10.0, False, 1.0, 1000.0)
    state: dict[str, Any] = {"i": 10.0}
    delays = []
    for status in (503, None, 429, 500, 502):
        visit = next_visit(spec, state, status, None, config, 0.0)
        assert visit is not None and visit.interval_s == 10.0
        delays.append(visit.delay_s)
        state = visit.state
    assert delays == [20.0, 40.0, 80.0, 80.0, 80.0]
    capped = next_visit(Spec(10.0, False, 1.0, 30.0), {"i": 10.0, "t": 3}, 503, None, config, 0.0)
    assert capped is not None and capped.delay_s == 30.0
    ok = next_visit(spec, state, 200, None, config, 0.0)
    assert ok is not None and ok.delay_s == 10.0 and "t" not in ok.state


def test_jitter_moves_a_visit_by_at_most_its_share() -> None:
    """A draw of -1 or 1 moves the visit by STREAMS_REVISIT_JITTER of its interval, either way."""
    cfg = StreamsConfig(redis_url="redis://x", crawl="c", revisit_jitter=0.1)
    spec = Spec(100.0, False, 60.0, 1000.0)
    delays = [next_visit(spec, {}, 200, "a", cfg, j).delay_s for j in (-1.0, 0.0, 1.0)]  # type: ignore[union-attr]
    assert delays == pytest.approx([90.0, 100.0, 110.0])


def test_what_tracks_a_page() -> None:
    """meta["revisit"] as seconds or a dict tracks a page; 0 or False does not, even with the crawl's setting; a bad value is refused."""
    crawl_wide = StreamsConfig(redis_url="redis://x", crawl="c", revisit_every_seconds=3600.0)
    assert spec_of(None, CONFIG) is None
    assert spec_of(None, crawl_wide) == Spec(3600.0, False, 60.0, 31_536_000.0)
    assert spec_of(False, crawl_wide) is None and spec_of(0, crawl_wide) is None
    assert spec_of(30, CONFIG) == Spec(30.0, False, 10.0, 100.0)
    assert spec_of({"every": 50, "adaptive": True, "min": 20, "max": 90}, CONFIG) == Spec(50.0, True, 20.0, 90.0)
    with pytest.raises(ValueError):
        spec_of("often", CONFIG)
    with pytest.raises(ValueError):
        spec_of({"every": 50, "min": 90, "max": 20}, CONFIG)


# -- in-process, against Redis ---------------------------------------------------


def test_a_tracked_page_comes_back_after_its_interval_on_redis_time_as_it_was_enqueued(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """The ack puts the request in its site's delayed ZSET due Redis TIME + interval, and it comes back with its callback, meta and priority."""
    s = worker.scheduler
    spider = s.spider
    assert isinstance(spider, TrackingSpider)
    s.enqueue_request(scrapy.Request("http://shop.test/p1", callback=spider.parse_product, priority=5,
                                     meta={"revisit": 0.4, "sku": "A1"}))
    first = worker.next_request()
    assert r.hget(Frontier(r, crawl).site("shop.test").stats, "tracked") is None
    first.meta["download_latency"] = 0.2  # what Scrapy adds on the way stays out of the revisit
    before = redis_ms(r)
    answer(worker, first)
    after = redis_ms(r)
    [(member, due)] = delayed(r, crawl, "shop.test")
    assert before + 400 <= due <= after + 400
    again = worker.next_request()
    assert redis_ms(r) >= due
    assert again.url == "http://shop.test/p1" and again.callback == spider.parse_product and again.priority == 5
    assert again.meta == {"revisit": 0.4, "sku": "A1", "_rv": [400]}
    stats = Frontier(r, crawl).status("shop.test").stats
    assert (stats.get("tracked"), stats.get("revisits")) == (1, 1)


def test_an_adaptive_page_comes_back_sooner_when_it_changed_and_later_when_not(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """The body's signature decides: unchanged x1.4, changed x0.8, within the page's bounds, counted in the site's stats."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://news.test/", meta={"revisit": {"every": 0.3, "adaptive": True, "min": 0.1,
                                                                           "max": 0.5}}))
    req = worker.next_request()
    answer(worker, req, body=b"v1")
    req = worker.next_request()
    assert req.meta["_rv"][0] == 300
    answer(worker, req, body=b"v1")  # unchanged: 0.42
    req = worker.next_request()
    assert req.meta["_rv"][0] == 420
    answer(worker, req, body=b"v1")  # unchanged: 0.588, bounded to 0.5
    req = worker.next_request()
    assert req.meta["_rv"][0] == 500
    before = redis_ms(r)
    answer(worker, req, body=b"v2")  # changed: 0.4
    [(_, due)] = delayed(r, crawl, "news.test")
    assert before + 400 <= due <= redis_ms(r) + 400
    stats = Frontier(r, crawl).status("news.test").stats
    assert (stats.get("changed"), stats.get("unchanged"), stats.get("revisits")) == (1, 2, 4)


def test_a_spider_given_signature_wins_over_the_body(worker: InProcessWorker, r: redis.Redis, crawl: str) -> None:
    """meta["revisit_signature"] set by the callback is compared instead of the body, so a page whose HTML changes on every load is judged by what matters."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://ads.test/", meta={"revisit": {"every": 0.2, "adaptive": True, "min": 0.1}}))
    req = worker.next_request()
    req.meta["revisit_signature"] = "price=10"
    answer(worker, req, body=b"ad 1")
    req = worker.next_request()
    req.meta["revisit_signature"] = "price=10"
    answer(worker, req, body=b"ad 2")
    stats = Frontier(r, crawl).status("ads.test").stats
    assert (stats.get("unchanged"), stats.get("changed")) == (1, None)


def test_a_gone_page_stops_being_tracked_after_the_count(worker: InProcessWorker, r: redis.Redis, crawl: str) -> None:
    """Three 404s in a row: the third ack schedules nothing, the site's tracked count goes back to 0 and the crawl has nothing left."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://gone.test/x", meta={"revisit": 0.1}))
    for _ in range(3):
        req = worker.next_request()
        answer(worker, req, status=404)
    assert delayed(r, crawl, "gone.test") == []
    st = Frontier(r, crawl).status("gone.test")
    assert (st.stats.get("tracked"), st.backlog, st.pending, st.delayed) == (0, 0, 0, 0)


def test_a_dead_lettered_tracked_page_leaves_the_tracked_count_and_comes_back_to_it_when_requeued(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """A tracked page moved to dead letters is no longer tracked (count and demand go down); `dlq requeue` brings it back, counted once, and its next ack schedules it again."""
    s = worker.scheduler
    f = Frontier(r, crawl)
    # adaptive: its state holds a signature, which the scripts must read with the interval
    s.enqueue_request(scrapy.Request("http://dl.test/x", meta={"revisit": {"every": 0.2, "adaptive": True, "min": 0.2}}))
    answer(worker, worker.next_request())
    req = worker.next_request()
    entry = s.lease_of(req)
    assert entry is not None and f.status("dl.test").stats.get("tdemand") == 5_000_000
    assert f.dead_letter("dl.test", s.node_id, [(entry.stream, entry.id, "the spider crashed on it")]) == 1
    st = f.status("dl.test")
    assert (st.stats.get("tracked"), st.stats.get("tdemand"), st.dead_letters) == (0, 0, 1)
    [(letter, _)] = r.xrange(f.site("dl.test").dlq)
    assert f.requeue_dead("dl.test", [letter.decode()]).requeued == 1
    st = f.status("dl.test")
    assert (st.stats.get("tracked"), st.stats.get("tdemand")) == (1, 5_000_000)
    again = worker.next_request()
    assert again.url == "http://dl.test/x"
    answer(worker, again)
    assert len(delayed(r, crawl, "dl.test")) == 1 and f.status("dl.test").stats.get("tracked") == 1


def test_a_page_tracked_by_its_site_policy_is_scheduled_by_a_worker_that_took_its_lease_over_without_ever_leasing_the_site(
    r: redis.Redis, redis_url: str, crawl: str
) -> None:
    """The first visit of a policy-tracked page leased by a worker that never acks it: a second worker, which never leased the site, takes the lease over (claim.lua carries the policy revisit) and its ack schedules the next visit."""
    from streams_sched.politeness.policy import set_policy

    set_policy(Frontier(r, crawl), "claimed.test", {"revisit": "1h"})
    first = InProcessWorker(redis_url, crawl, STREAMS_LEASE_SECONDS=0.3)
    second = InProcessWorker(redis_url, crawl, STREAMS_LEASE_SECONDS=0.3, STREAMS_REVISIT_JITTER=0.0)
    try:
        first.scheduler.enqueue_request(scrapy.Request("http://claimed.test/p"))
        first.next_request()  # leased, never acked: first stops here
        req = second.next_request()
        entry = second.scheduler.lease_of(req)
        assert entry is not None and entry.suspect and entry.revisit == "1h"
        answer(second, req)
        [(_, due)] = delayed(r, crawl, "claimed.test")
        assert due >= redis_ms(r) + 3_500_000
        assert Frontier(r, crawl).status("claimed.test").stats.get("tracked") == 1
    finally:
        first.close()
        second.close()


def test_dedupe_drops_a_rediscovered_copy_while_the_revisit_goes_through(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """A link to a tracked page found again is a duplicate; the page's own revisit never meets the filter and comes back."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://blog.test/", meta={"revisit": 0.2}))
    req = worker.next_request()
    answer(worker, req)
    other = InProcessWorker(worker.scheduler.config.redis_url, crawl, dedupe=worker.scheduler.config.dedupe)
    try:  # another worker, so its local seen cache does not decide
        other.scheduler.enqueue_request(scrapy.Request("http://blog.test/"))
        other.settle()
        assert Frontier(r, crawl).status("blog.test").stats.get("duplicates") == 1
    finally:
        other.close()
    again = worker.next_request()
    assert again.url == "http://blog.test/" and "_rv" in again.meta
    assert len(delayed(r, crawl, "blog.test")) == 0 and Frontier(r, crawl).status("blog.test").backlog == 0


def test_a_retry_copy_of_a_tracked_page_is_crawled_once_and_the_page_stays_tracked_once(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """A dont_filter copy made while the page is in flight (a retry) is not tracked on its own; the page's ack schedules the one next visit."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://flaky.test/", meta={"revisit": 0.2}))
    req = worker.next_request()
    s.enqueue_request(req.replace(dont_filter=True))  # what RetryMiddleware does on a 503
    answer(worker, req, status=503)
    retry = worker.next_request()
    assert retry.meta["revisit"] is False and "_rv" not in retry.meta
    answer(worker, retry)
    assert len(delayed(r, crawl, "flaky.test")) == 1
    assert Frontier(r, crawl).status("flaky.test").stats.get("tracked") == 1


def test_a_tracked_page_that_redirects_stays_tracked_by_its_url_and_the_target_is_fetched_each_time_untracked(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """Scrapy's redirect of a tracked page (redirect_urls starts with it) is crawled once per visit, past the seen filter and untracked; the page's ack counts the redirect as an answer, so its next visit is at its interval, not backed off."""
    s = worker.scheduler
    f = Frontier(r, crawl)
    s.enqueue_request(scrapy.Request("http://moved.test/old", meta={"revisit": 0.3}))
    for visit in range(2):
        source = worker.next_request()
        assert source.url == "http://moved.test/old"
        # what RedirectMiddleware returns instead of the 301 (response_received does not fire)
        target = source.replace(url="http://moved.test/new")
        target.meta["redirect_urls"] = [source.url]
        assert s.enqueue_request(target) is True  # the second time too: not a duplicate
        before = redis_ms(r)
        s.request_done(source)
        worker.settle()
        dues = [due for m, due in delayed(r, crawl, "moved.test")]
        assert len(dues) == 1 and before + 300 <= dues[0] <= redis_ms(r) + 300  # its interval, no back-off
        got = worker.next_request()
        assert got.url == "http://moved.test/new" and got.meta["revisit"] is False and "_rv" not in got.meta
        answer(worker, got)
        assert len(delayed(r, crawl, "moved.test")) == 1
    assert f.status("moved.test").stats.get("tracked") == 1


def test_an_ack_sent_twice_schedules_the_next_visit_once(r: redis.Redis, redis_url: str, crawl: str) -> None:
    """Two acks of one tracked entry (a slow worker and the one that took its lease over): only the one that deletes the entry schedules."""
    w = InProcessWorker(redis_url, crawl, STREAMS_REVISIT_JITTER=0.0)
    try:
        w.scheduler.enqueue_request(scrapy.Request("http://twice.test/", meta={"revisit": 60}))
        req = w.next_request()
        entry = w.scheduler.lease_of(req)
        assert entry is not None and entry.payload is not None
        f = Frontier(r, crawl)
        visit = (entry.stream, entry.id, 60_000, "n", entry.payload)
        assert f.ack("twice.test", [], revisits=[visit]) == 1
        assert f.ack("twice.test", [], revisits=[visit]) == 0
        assert len(delayed(r, crawl, "twice.test")) == 1
        assert f.status("twice.test").stats.get("tracked") == 1
    finally:
        w.close()


def test_a_site_policy_tracks_its_pages_and_each_page_keeps_it(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """`site set --revisit` tracks a site's pages with no meta of their own, as the policy is at each visit: adaptive, then fixed once the policy changes."""
    from click.testing import CliRunner

    from streams_sched.cli import main

    out = CliRunner().invoke(main, ["site", "set", "-c", crawl, "--redis-url", worker.scheduler.config.redis_url,
                                    "policy.test", "--revisit", "0.3s:adaptive,min=0.1s,max=1m"])
    assert out.exit_code == 0, out.output
    bad = CliRunner().invoke(main, ["site", "set", "-c", crawl, "--redis-url", worker.scheduler.config.redis_url,
                                    "policy.test", "--revisit", "often"])
    assert bad.exit_code != 0 and "1h:adaptive" in bad.output
    worker.scheduler.enqueue_request(scrapy.Request("http://policy.test/a"))
    first = worker.next_request()
    answer(worker, first)
    again = worker.next_request()
    # interval, signature, then (the freshness rule's estimate) the Redis time of the visit
    assert "revisit" not in again.meta and again.meta["_rv"][0] == 300 and len(again.meta["_rv"]) == 8
    answer(worker, again)  # unchanged: the policy's adaptive x1.4
    third = worker.next_request()
    assert third.meta["_rv"][0] == 420
    # the site's policy as it is at each visit: a fixed 0.2 s from now on
    out = CliRunner().invoke(main, ["site", "set", "-c", crawl, "--redis-url", worker.scheduler.config.redis_url,
                                    "policy.test", "--revisit", "0.2s"])
    assert out.exit_code == 0, out.output
    answer(worker, third)  # leased before the change: its ack follows the policy it was leased with
    fourth = worker.next_request()
    assert fourth.meta["_rv"][0] == 588
    answer(worker, fourth)  # leased after it
    assert worker.next_request().meta["_rv"][0] == 200
    assert Frontier(r, crawl).status("policy.test").stats.get("tracked") == 1


def test_a_crawl_with_tracked_pages_does_not_drain_until_their_tracking_is_stopped(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """A waiting revisit keeps the crawl open; `revisits` lists it, `revisits --stop` removes it and turns the site off, and the crawl drains."""
    from click.testing import CliRunner

    from streams_sched.cli import main

    s = worker.scheduler
    url = worker.scheduler.config.redis_url
    s.enqueue_request(scrapy.Request("http://watch.test/a", meta={"revisit": 3600}))
    answer(worker, worker.next_request())
    for _ in range(6):
        worker.step()
    assert not worker.exchange.drained and len(delayed(r, crawl, "watch.test")) == 1
    listed = CliRunner().invoke(main, ["revisits", "-c", crawl, "--redis-url", url, "--json"])
    assert listed.exit_code == 0, listed.output
    [row] = __import__("json").loads(listed.output)
    assert row["url"] == "http://watch.test/a" and row["interval_s"] == 3600 and 3500 < row["due_in_s"] <= 3600
    stopped = CliRunner().invoke(main, ["revisits", "-c", crawl, "--redis-url", url, "--stop"])
    assert stopped.exit_code == 0 and "1 waiting visit" in stopped.output, stopped.output
    assert delayed(r, crawl, "watch.test") == []
    st = Frontier(r, crawl).status("watch.test")
    assert st.stats.get("tracked") == 0 and r.hget(Frontier(r, crawl).site("watch.test").policy, "revisit") == b"off"
    worker.until(lambda: worker.exchange.drained, cycles=100, what="drained")
    resumed = CliRunner().invoke(main, ["revisits", "-c", crawl, "--redis-url", url, "--resume", "watch.test"])
    assert resumed.exit_code == 0 and "1 site(s)" in resumed.output, resumed.output
    assert r.hget(Frontier(r, crawl).site("watch.test").policy, "revisit") is None


def test_a_page_in_flight_when_its_site_is_stopped_is_not_scheduled_again(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """ack.lua reads the site's `off` itself: a worker that leased a tracked page before the stop schedules no next visit."""
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://late.test/a", meta={"revisit": 0.1}))
    answer(worker, worker.next_request())
    again = worker.next_request()
    r.hset(Frontier(r, crawl).site("late.test").policy, "revisit", "off")  # what revisits --stop writes
    answer(worker, again)
    assert delayed(r, crawl, "late.test") == []
    assert Frontier(r, crawl).status("late.test").stats.get("tracked") == 0


def test_a_url_stopped_while_its_visit_is_in_flight_is_not_scheduled_again(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """`revisits SITE URL --stop` with the page's visit leased (none waiting): the visit's ack schedules no next one, the page leaves the tracked count and demand, and the stopped-URL set is emptied."""
    from streams_sched.admin.revisits import stop_tracking

    f = Frontier(r, crawl)
    s = worker.scheduler
    for n, every in ((1, 0.2), (2, 60)):
        s.enqueue_request(scrapy.Request(f"http://inflight.test/p{n}", meta={"revisit": every}))
    for _ in range(2):
        answer(worker, worker.next_request())
    req = worker.next_request()
    assert req.url == "http://inflight.test/p1"
    assert stop_tracking(f, "inflight.test", req.url) == 0  # nothing waiting: it is in flight
    answer(worker, req)
    [(member, _)] = delayed(r, crawl, "inflight.test")
    assert b"http://inflight.test/p2" in member  # only the other page comes back
    st = f.status("inflight.test")
    assert (st.stats.get("tracked"), st.stats.get("tdemand")) == (1, round(1e9 / 60_000))
    assert r.scard(f.site("inflight.test").revisit_stops) == 0


def test_the_crawl_wide_setting_tracks_every_page_and_a_stopped_crawl_tracks_none(
    redis_url: str, r: redis.Redis, crawl: str
) -> None:
    """STREAMS_REVISIT_EVERY_SECONDS tracks a page with no meta; once the crawl's tracking is stopped, a worker that read it tracks no new page."""
    from streams_sched.admin.revisits import resume_tracking, stop_tracking

    w = InProcessWorker(redis_url, crawl, STREAMS_REVISIT_EVERY_SECONDS=0.2, STREAMS_REVISIT_JITTER=0.0,
                        STREAMS_POLICY_REFRESH_SECONDS=0.05)
    try:
        w.scheduler.enqueue_request(scrapy.Request("http://all.test/a"))
        answer(w, w.next_request())
        assert len(delayed(r, crawl, "all.test")) == 1
        stop_tracking(Frontier(r, crawl))
        w.until(lambda: w.io.frontier.revisits_stopped, what="the stop read by the worker")
        w.scheduler.enqueue_request(scrapy.Request("http://other.test/b"))
        answer(w, w.next_request())
        assert delayed(r, crawl, "other.test") == [] and delayed(r, crawl, "all.test") == []
        resume_tracking(Frontier(r, crawl))
        w.until(lambda: not w.io.frontier.revisits_stopped, what="the resume read by the worker")
        w.scheduler.enqueue_request(scrapy.Request("http://third.test/c"))
        answer(w, w.next_request())
        assert len(delayed(r, crawl, "third.test")) == 1
    finally:
        w.close()


@pytest.mark.e2e
def test_a_worker_killed_while_holding_tracked_pages_loses_none_and_schedules_none_twice(
    redis_url: str, dedupe: str, crawl: str, tmp_path: Any
) -> None:
    """SIGKILL a worker mid-crawl with every page tracked: once another has taken its leases over, each page waits for its next visit exactly once."""
    from collections import Counter

    from streams_sched.admin.revisits import tracked_pages
    from streams_sched.demo.web import SyntheticWeb

    from helpers import Worker, base_settings, read_items, wait_for

    items = tmp_path / "items.jsonl"
    settings = base_settings(
        redis_url, crawl, dedupe, items, SYNTH_SEED=True, SYNTH_PAGES=100, SYNTH_DELAY_SECONDS=0.02,
        STREAMS_LEASE_SECONDS=2, CONCURRENT_REQUESTS=8, CONCURRENT_REQUESTS_PER_DOMAIN=4,
        STREAMS_REVISIT_EVERY_SECONDS=3600,
    )
    f = Frontier(redis.Redis.from_url(redis_url), crawl)
    want = SyntheticWeb(sites=3, pages=100).all_urls()

    def waiting() -> Counter[str]:
        return Counter(p.url for p in tracked_pages(f, limit=10_000))

    first = Worker({**settings, "RECORD_TAG": "first"}, tmp_path / "first.log")
    second = None
    try:
        wait_for(lambda: len(read_items(items)) >= 120, timeout=60, what="the first worker to crawl 120 pages")
        first.kill()
        assert sum(waiting().values()) < len(want)
        second = Worker({**settings, "RECORD_TAG": "second"}, tmp_path / "second.log")
        wait_for(lambda: set(waiting()) == want, timeout=90, what="every page waiting for its next visit")
        wait_for(lambda: all(f.status(s).pending == 0 for s in f.sites()), timeout=30, what="no lease left")
        assert second.alive()  # tracked pages keep the crawl open
        assert "took over" in second.log()  # the killed worker's leases, tracked pages among them
    finally:
        first.close()
        if second is not None:
            second.close()
    counts = waiting()
    assert set(counts) == want and max(counts.values()) == 1, counts.most_common(3)
    assert sum(int(f.status(s).stats.get("tracked", 0)) for s in f.sites()) == len(want)


def test_status_and_the_monitor_show_a_sites_tracked_pages_and_what_revisits_found(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """The site's stats reach `status` (TRACKED, REVISITS, CHANGED, OVERDUE) and the monitor's per-site families, and a page left waiting past its time shows as overdue by so many of its intervals."""
    from monitor.exporter import SiteLabeller, build_families
    from monitor.snapshot import read_crawl

    from streams_sched.cli.report import read_report

    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://fresh.test/", meta={"revisit": {"every": 0.1, "adaptive": True,
                                                                             "min": 0.1}}))
    answer(worker, worker.next_request(), body=b"v1")
    answer(worker, worker.next_request(), body=b"v2")
    f = Frontier(r, crawl)
    [row] = [row for row in read_report(f).rows if row["site"] == "fresh.test"]
    assert (row["tracked"], row["revisits"], row["changed"]) == (1, 2, 1)
    snap = read_crawl(f)
    labeller = SiteLabeller(10)
    labeller.update(snap)
    got = {m.name: [(x.labels["site"], x.value) for x in m.samples]
           for m in build_families([snap], {}, labeller)
           if m.name.startswith(("streams_sched_tracked", "streams_sched_revisits"))}
    assert got == {"streams_sched_tracked_pages": [("fresh.test", 1)], "streams_sched_revisits": [("fresh.test", 2)],
                   "streams_sched_revisits_changed": [("fresh.test", 1)],
                   "streams_sched_revisits_unchanged": [("fresh.test", 0)],
                   "streams_sched_revisits_change_share": [("fresh.test", 1.0)]}
    # nobody leases the page: once due it is overdue, by more and more of its 0.1 s interval
    late = wait_for(lambda: (st := f.status("fresh.test")).overdue_ratio >= 3 and st, timeout=10, what="3 intervals late")
    assert late.overdue == 1 and late.oldest_overdue_interval_s == pytest.approx(0.1)
    snap = read_crawl(f)
    got = {m.name: m.samples[0].value for m in build_families([snap], {}, labeller)
           if m.name in ("streams_sched_overdue", "streams_sched_overdue_intervals", "streams_sched_oldest_overdue_seconds",
                         "streams_sched_revisit_demand_requests_per_second")}
    assert got["streams_sched_overdue"] == 1 and got["streams_sched_overdue_intervals"] >= 3
    assert got["streams_sched_oldest_overdue_seconds"] >= 0.3
    assert got["streams_sched_revisit_demand_requests_per_second"] == pytest.approx(10.0)
    from click.testing import CliRunner

    from streams_sched.cli import main

    out = CliRunner().invoke(main, ["status", "-c", crawl, "--redis-url", worker.scheduler.config.redis_url])
    assert out.exit_code == 0, out.output
    assert "tracked 1 page(s), needing 10.0/s; overdue 1 (oldest " in out.output
    assert "adaptive revisits found a change in 100% (1/1)" in out.output


def test_tracked_pages_that_need_more_than_the_sites_budget_are_stretched_evenly(
    r: redis.Redis, redis_url: str, dedupe: str, crawl: str
) -> None:
    """Four pages every 0.5 s need 8 fetches/s of a 5/s site (budget 0.9 x 5): each next visit is stretched by the same 8/4.5, status says so, and a page no longer tracked takes its share away."""
    w = InProcessWorker(redis_url, crawl, dedupe=dedupe, spider=TrackingSpider(), STREAMS_REVISIT_JITTER=0.0,
                        STREAMS_REVISIT_STOP_AFTER=1)
    try:
        stretched_evenly(w, r, crawl)
    finally:
        w.close()


def stretched_evenly(worker: InProcessWorker, r: redis.Redis, crawl: str) -> None:
    from streams_sched.admin.revisits import stop_tracking, tracked_pages
    from streams_sched.politeness.policy import set_policy

    f = Frontier(r, crawl)
    set_policy(f, "busy.test", {"rate": 5, "burst": 4})
    s = worker.scheduler
    for n in range(4):
        s.enqueue_request(scrapy.Request(f"http://busy.test/p{n}", meta={"revisit": 0.5}))
    leased = [worker.next_request() for _ in range(4)]
    revisits = s.revisits
    assert revisits is not None
    before = redis_ms(r)
    for req in leased:
        revisits.on_response(HtmlResponse(req.url, status=200, body=b"x"), req)
        s.request_done(req)
    worker.settle()
    after = redis_ms(r)
    dues = [due for _, due in delayed(r, crawl, "busy.test")]
    stretched = 500 * 8 / 4.5
    assert len(dues) == 4 and all(before + stretched - 2 <= d <= after + stretched + 2 for d in dues)
    st = f.status("busy.test")
    assert st.stats.get("tdemand") == 8_000_000 and st.stats.get("stretch") == round(8 / 4.5 * 1000)
    from click.testing import CliRunner

    from streams_sched.cli import main

    out = CliRunner().invoke(main, ["status", "-c", crawl, "--redis-url", worker.scheduler.config.redis_url])
    assert "site busy.test: its tracked pages need 8.0/s, its revisit budget is 4.5/s (rate 5.0/s" in out.output
    assert "stretched x1.78" in out.output
    one = tracked_pages(f, "busy.test")[0]
    assert stop_tracking(f, "busy.test", one.url) == 1
    assert f.status("busy.test").stats.get("tdemand") == 6_000_000
    answer(worker, worker.next_request(), status=410)
    st = f.status("busy.test")
    assert st.stats.get("tdemand") == 4_000_000 and st.stats.get("tracked") == 2
    stop_tracking(f, "busy.test")
    assert "tdemand" not in f.status("busy.test").stats
