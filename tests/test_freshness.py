"""The freshness rule: the change-rate estimate, the interval that spends a site's budget
best, the site's multiplier in ack.lua (and its Lua mirror), and conditional revisits."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import scrapy
from scrapy.http import HtmlResponse, Response

from streams_sched.config import StreamsConfig
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.scripts._source import read_lua
from streams_sched.politeness.policy import set_policy
from streams_sched.worker import freshness as fr
from streams_sched.worker.revisits import Spec, next_visit, pack_state, unpack_state

from harness import InProcessWorker

CONFIG = StreamsConfig(redis_url="redis://x", crawl="c", revisit_jitter=0.0)
SPEC = Spec(40.0, True, 1.0, 1000.0)

# the issue's site: 10 pages changing every 2 s on average, 10 every 8 s, 10 every 30 s,
# 10 never, 2 fetches a second
EXAMPLE_RATES = [0.5] * 10 + [1 / 8] * 10 + [1 / 30] * 10 + [0.0] * 10


# -- the math ------------------------------------------------------------------


def test_the_estimate_is_cho_and_garcia_molinas_and_stays_finite_when_every_visit_saw_a_change() -> None:
    """r = -ln((n - X + 0.5) / (n + 0.5)) / I, 0 with no change seen, finite with every visit changed."""
    assert fr.estimate_rate(10, 3, 100.0) == pytest.approx(-math.log(7.5 / 10.5) / 10.0)
    assert fr.estimate_rate(10, 0, 100.0) == 0.0
    assert fr.estimate_rate(10, 10, 100.0) == pytest.approx(math.log(21) / 10.0)
    assert fr.estimate_rate(0, 0, 0.0) == 0.0


def test_the_dated_estimate_is_changes_over_exposure_and_finds_the_true_rate_from_ages() -> None:
    """With Last-Modified a visit's age is exposure: one age a gives 1/a, and pooled Poisson ages give back the true rate."""
    import random

    assert fr.estimate_rate_dated(1, 300.0) == pytest.approx(1 / 300)
    assert fr.estimate_rate_dated(0, 300.0) == 0.0 and fr.estimate_rate_dated(1, 0.0) == 0.0
    rng = random.Random(7)
    for rate in (1 / 60, 1 / 600):
        ages = [rng.expovariate(rate) for _ in range(4000)]  # a Poisson page's age at a random time
        assert fr.estimate_rate_dated(len(ages), sum(ages)) == pytest.approx(rate, rel=0.05)


def test_the_frequency_makes_the_marginal_freshness_equal_the_multiplier_or_is_zero() -> None:
    """dF/df = mu at the chosen frequency; a page with mu * r >= 1 or r = 0 gets no visits of its own."""
    for r in (0.001, 0.01, 0.1, 1.0):
        for mu in (0.5, 5.0, 50.0):
            f = fr.frequency(r, mu)
            if mu * r >= 1:
                assert f == 0.0
            else:
                assert f > 0 and fr.marginal(r, f) == pytest.approx(mu, rel=1e-9)
    assert fr.frequency(0.0, 5.0) == 0.0


def test_the_optimum_of_the_example_skips_the_fastest_pages_and_beats_uniform_visits() -> None:
    """40 pages at 2/s: the optimum gives the 2 s pages nothing, spends the budget exactly, and reaches 0.61 against uniform's 0.55."""
    mu = fr.optimal_mu(EXAMPLE_RATES, 2.0)
    fs = [fr.frequency(r, mu) for r in EXAMPLE_RATES]
    assert sum(fs) == pytest.approx(2.0, rel=1e-6)
    assert fs[0] == 0.0 and fs[10] > fs[20] > 0 and fs[30] == 0.0
    best = sum(fr.freshness(r, f) for r, f in zip(EXAMPLE_RATES, fs)) / 40
    uniform = sum(fr.freshness(r, 2.0 / 40) for r in EXAMPLE_RATES) / 40
    assert round(uniform, 2) == 0.55 and round(best, 2) == 0.61


def test_the_multiplier_rises_over_budget_falls_under_it_and_moves_a_gain_share_per_round() -> None:
    """next_mu: demand above the budget raises mu (fewer visits), below lowers it; one round of the pages moves GAIN of the log gap."""
    assert fr.next_mu(10.0, 2.0, 1.0, 5, 100) > 10.0
    assert fr.next_mu(10.0, 0.5, 1.0, 5, 100) < 10.0
    assert fr.next_mu(10.0, 1.0, 1.0, 5, 100) == 10.0
    assert fr.next_mu(10.0, 2.0, 1.0, 100, 100) == pytest.approx(10.0 * 2.0 ** fr.GAIN)
    assert fr.next_mu(None, 1.0, 4.0, 1, 100) == fr.next_mu(fr.first_mu(100, 4.0), 1.0, 4.0, 1, 100)


def test_the_lua_mirror_agrees_with_python_on_a_grid(r: redis.Redis) -> None:
    """lib/freshness.lua's next_mu and first_mu return what worker/freshness.py does, on a grid of inputs."""
    r.script_flush()
    lib = read_lua("lib/freshness.lua")
    script = r.register_script(lib + """
local out = {}
for i = 1, #ARGV, 5 do
  local mu = tonumber(ARGV[i])
  if mu and mu <= 0 then mu = nil end
  out[#out + 1] = string.format('%.17g', next_mu(mu, tonumber(ARGV[i + 1]), tonumber(ARGV[i + 2]),
    tonumber(ARGV[i + 3]), tonumber(ARGV[i + 4])))
  out[#out + 1] = string.format('%.17g', first_mu(tonumber(ARGV[i + 4]), tonumber(ARGV[i + 2])))
end
return out
""")
    grid = [(mu, d, b, a, n) for mu in (0, 0.01, 3.7, 120.0, 1e8) for d in (0.0, 0.3, 1.0, 7.5, 1e4)
            for b in (0.05, 1.0, 20.0) for a, n in ((1, 1), (3, 100), (100, 100), (7, 0))]
    argv: list[Any] = [x for row in grid for x in row]
    got = [float(v) for v in script(args=argv)]
    for k, (mu, d, b, a, n) in enumerate(grid):
        assert got[2 * k] == pytest.approx(fr.next_mu(mu or None, d, b, a, n), rel=1e-12)
        assert got[2 * k + 1] == pytest.approx(fr.first_mu(n, b), rel=1e-12)


# -- a page's state and next interval ----------------------------------------


def test_the_state_packs_the_estimate_and_the_validators_and_unpacks_them() -> None:
    """pack_state / unpack_state keep visits, changes, time spanned, the last visit's time, ETag and Last-Modified."""
    state = {"i": 12.5, "s": 7, "n": 4, "x": 1, "o": 50.25, "l": 1_000_000.123, "e": '"abc"', "m": 1_765_000_000}
    assert unpack_state(pack_state(state)) == state
    # the last visit's time modulo 2**32 ms: 5 bytes, and the time between visits still right
    wrapped = unpack_state(pack_state({"i": 60.0, "s": 1, "l": 1_765_000_000.5}))
    assert wrapped is not None and wrapped["l"] == (1_765_000_000_500 % 2**32) / 1000
    later = next_visit(SPEC, {**wrapped, "i": 60.0}, 200, 1, CONFIG, 0.0, mu=20.0, at_s=1_765_000_061.5)
    assert later is not None and later.state["o"] == pytest.approx(61.0)
    assert pack_state({"i": 1.0, "s": 3}) == [1000, 3]


def test_under_the_freshness_rule_a_page_counts_its_visits_and_takes_the_interval_of_the_sites_multiplier() -> None:
    """A compared visit counts in n, X and the time spanned (from the entries' Redis times); the interval is interval_for's."""
    first = next_visit(SPEC, {}, 200, 1, CONFIG, 0.0, mu=20.0, at_s=1000.0)
    assert first is not None and first.state["l"] == 1000.0 and "n" not in first.state
    second = next_visit(SPEC, first.state, 200, 2, CONFIG, 0.0, mu=20.0, at_s=1030.0)
    assert second is not None and second.found == "c"
    assert (second.state["n"], second.state["x"], second.state["o"]) == (1, 1, 30.0)
    want = fr.interval_for(fr.estimate_rate(1, 1, 30.0), 20.0, SPEC.min_s, SPEC.max_s, 40.0)
    assert second.interval_s == pytest.approx(want)


def test_a_dated_first_visit_estimates_the_rate_from_the_pages_age_and_takes_the_optimums_interval() -> None:
    """A first answer with the page's age counts one change over that age (found 'e'): an old page goes to its max at once, a young one takes interval_for's."""
    old = next_visit(SPEC, {}, 200, 1, CONFIG, 0.0, mu=20.0, at_s=1000.0, age_s=86400.0 * 30)
    assert old is not None and old.found == "e" and old.interval_s == SPEC.max_s
    young = next_visit(SPEC, {}, 200, 1, CONFIG, 0.0, mu=20.0, at_s=1000.0, age_s=60.0)
    assert young is not None and (young.state["n"], young.state["x"], young.state["o"]) == (1, 1, 60.0)
    assert young.interval_s == pytest.approx(fr.interval_for(1 / 60, 20.0, SPEC.min_s, SPEC.max_s))
    assert SPEC.min_s < young.interval_s < SPEC.max_s / 10  # neither bound: the optimum for its rate
    unknown = next_visit(SPEC, {}, 200, 1, CONFIG, 0.0, mu=None, at_s=1000.0, age_s=60.0)
    assert unknown is not None and unknown.found == "e" and unknown.interval_s == SPEC.every_s
    undated = next_visit(SPEC, {}, 200, 1, CONFIG, 0.0, mu=20.0, at_s=1000.0)
    assert undated is not None and undated.found == "" and "n" not in undated.state
    nutch = StreamsConfig(redis_url="redis://x", crawl="c", revisit_jitter=0.0, revisit_rule="nutch")
    plain = next_visit(SPEC, {}, 200, 1, nutch, 0.0, mu=20.0, at_s=1000.0, age_s=60.0)
    assert plain is not None and plain.found == "" and plain.interval_s == SPEC.every_s


def test_a_dated_change_adds_its_age_and_an_unchanged_visit_the_time_spanned() -> None:
    """After a dated answer, a change seen 10 s old adds 10 s of exposure, not the 30 s spanned; an unchanged visit adds the span."""
    first = next_visit(SPEC, {}, 200, 1, CONFIG, 0.0, mu=20.0, at_s=1000.0, age_s=100.0)
    assert first is not None
    state = {**first.state, "m": 900}
    changed = next_visit(SPEC, state, 200, 2, CONFIG, 0.0, mu=20.0, at_s=1030.0, age_s=10.0)
    assert changed is not None and changed.found == "c"
    assert (changed.state["n"], changed.state["x"], changed.state["o"]) == (2, 2, 110.0)
    want = fr.interval_for(fr.estimate_rate_dated(2, 110.0), 20.0, SPEC.min_s, SPEC.max_s, state["i"])
    assert changed.interval_s == pytest.approx(want)
    same = next_visit(SPEC, {**changed.state, "m": 1020}, 304, None, CONFIG, 0.0, mu=20.0, at_s=1060.0, age_s=40.0)
    assert same is not None and same.found == "u" and (same.state["x"], same.state["o"]) == (2, 140.0)


def test_a_page_never_seen_to_change_grows_at_most_twofold_a_visit_up_to_its_max() -> None:
    """Unchanged visits give r = 0: the interval doubles each visit until the page's max."""
    state: dict[str, Any] = {}
    at, seen = 0.0, []
    for _ in range(8):
        visit = next_visit(SPEC, state, 200, 5, CONFIG, 0.0, mu=20.0, at_s=at)
        assert visit is not None
        state, at = visit.state, at + visit.delay_s
        seen.append(visit.interval_s)
    assert seen[:6] == [40.0, 80.0, 160.0, 320.0, 640.0, 1000.0]


def test_a_page_changing_faster_than_the_budget_can_follow_goes_to_its_max() -> None:
    """A page changing at every visit every second, with mu = 20 s, gets no visits of its own (max), within the growth bound."""
    state: dict[str, Any] = {"i": 1.0, "s": 0, "l": 0.0}
    at = 0.0
    for k in range(1, 30):
        at += 1.0
        visit = next_visit(SPEC, {**state, "i": 1.0, "l": at - 1.0}, 200, k, CONFIG, 0.0, mu=20.0, at_s=at)
        assert visit is not None
        state = visit.state
    assert visit.interval_s == 2.0  # doubled from 1 s: the target is its max
    assert fr.interval_for(fr.estimate_rate(state["n"], state["x"], state["o"]), 20.0, 1.0, 1000.0) == 1000.0


def test_a_304_is_an_unchanged_visit_that_keeps_the_signature() -> None:
    """next_visit counts a 304 as unchanged and keeps the last signature."""
    first = next_visit(SPEC, {}, 200, 9, CONFIG, 0.0)
    assert first is not None
    again = next_visit(SPEC, first.state, 304, None, CONFIG, 0.0)
    assert again is not None and again.found == "u" and again.state["s"] == 9


def test_without_a_multiplier_or_under_nutchs_rule_the_factors_apply() -> None:
    """No mu (a site with no rate, or a taken-over lease) or STREAMS_REVISIT_RULE = nutch: x0.8 / x1.4, no estimate kept."""
    nutch = StreamsConfig(redis_url="redis://x", crawl="c", revisit_jitter=0.0, revisit_rule="nutch")
    first = next_visit(SPEC, {}, 200, 1, nutch, 0.0, mu=20.0, at_s=5.0)
    assert first is not None and "l" not in first.state
    second = next_visit(SPEC, first.state, 200, 1, nutch, 0.0, mu=20.0, at_s=50.0)
    assert second is not None and second.interval_s == pytest.approx(56.0) and "n" not in second.state
    plain = next_visit(SPEC, {"i": 40.0, "s": 1}, 200, 2, CONFIG, 0.0)
    assert plain is not None and plain.interval_s == pytest.approx(32.0)


def test_a_bad_rule_fails_at_start_naming_the_setting() -> None:
    """STREAMS_REVISIT_RULE takes freshness or nutch."""
    from streams_sched.errors import ConfigError

    with pytest.raises(ConfigError, match="STREAMS_REVISIT_RULE"):
        StreamsConfig.from_settings({"REDIS_URL": "redis://x", "STREAMS_PREFIX": "c", "STREAMS_REVISIT_RULE": "cho"})


# -- in a worker ---------------------------------------------------------------


class ConditionalSpider(scrapy.Spider):
    name = "conditional"

    def parse(self, response: Any) -> Any:
        yield {"url": response.url, "status": response.status}


@pytest.fixture
def worker(redis_url: str, dedupe: str, crawl: str) -> Iterator[InProcessWorker]:
    w = InProcessWorker(redis_url, crawl, dedupe=dedupe, spider=ConditionalSpider(), STREAMS_REVISIT_JITTER=0.0)
    yield w
    w.close()


def answer(w: InProcessWorker, request: scrapy.Request, response: Response) -> None:
    revisits = w.scheduler.revisits
    assert revisits is not None
    revisits.on_response(response, request, None)
    w.scheduler.request_done(request)
    w.settle()


def test_the_sites_multiplier_moves_in_ack_lua_and_the_lease_carries_it_to_the_pages_next_interval(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """A compared visit of an adaptive page on a site with a rate writes rv_mu; the next lease carries it and the interval follows from it."""
    f = Frontier(r, crawl)
    set_policy(f, "fresh.test", {"rate": 10})
    spec = {"every": 0.2, "adaptive": True, "min": 0.05, "max": 60}
    worker.scheduler.enqueue_request(scrapy.Request("http://fresh.test/a", meta={"revisit": spec}))
    first = worker.next_request()
    answer(worker, first, HtmlResponse(first.url, body=b"one"))
    assert r.hget(f.site("fresh.test").policy, "rv_mu") is None  # nothing compared yet
    second = worker.next_request()
    answer(worker, second, HtmlResponse(second.url, body=b"two"))
    mu = float(r.hget(f.site("fresh.test").policy, "rv_mu") or 0)
    # one page of budget 0.9 x 10/s asking 5/s: under budget, so mu falls from its start
    assert 0 < mu < fr.first_mu(1, 9.0)
    third = worker.next_request()
    leased = worker.scheduler._leases[third]
    assert leased.mu == pytest.approx(mu, rel=1e-5)
    before = unpack_state(third.meta["_rv"])
    assert before is not None and (before["n"], before["x"]) == (1, 1)
    answer(worker, third, HtmlResponse(third.url, body=b"three"))
    state = unpack_state(worker.next_request().meta["_rv"])
    assert state is not None and (state["n"], state["x"]) == (2, 2)
    rate = fr.estimate_rate(2, 2, state["o"])
    assert state["i"] == pytest.approx(fr.interval_for(rate, float(leased.mu), 0.05, 60, before["i"]), abs=1e-3)


def test_a_dated_first_answer_estimates_the_page_and_moves_the_sites_multiplier_at_once(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """A first answer with Date and Last-Modified: the page's state holds one change over its age, ack.lua counts it tracked and writes rv_mu."""
    f = Frontier(r, crawl)
    set_policy(f, "dated.test", {"rate": 10})
    spec = {"every": 0.2, "adaptive": True, "min": 0.05, "max": 60}
    worker.scheduler.enqueue_request(scrapy.Request("http://dated.test/a", meta={"revisit": spec}))
    first = worker.next_request()
    headers = {"Date": "Wed, 02 Dec 2026 10:00:30 GMT", "Last-Modified": "Wed, 02 Dec 2026 10:00:00 GMT"}
    answer(worker, first, HtmlResponse(first.url, body=b"one", headers=headers))
    mu = float(r.hget(f.site("dated.test").policy, "rv_mu") or 0)
    assert 0 < mu  # the first visit's estimate moved the multiplier
    assert f.status("dated.test").stats.get("tracked") == 1
    second = worker.next_request()
    state = unpack_state(second.meta["_rv"])
    assert state is not None and (state["n"], state["x"], state["o"]) == (1, 1, 30.0)
    assert second.headers[b"If-Modified-Since"] == b"Wed, 02 Dec 2026 10:00:00 GMT"


def test_a_revisit_asks_with_the_validators_and_a_304_produces_no_item_and_counts_unchanged(
    worker: InProcessWorker, r: redis.Redis, crawl: str
) -> None:
    """The ETag and Last-Modified of a page's answer go out as If-None-Match / If-Modified-Since; its 304 calls no spider callback, counts unchanged and keeps the signature."""
    f = Frontier(r, crawl)
    spec = {"every": 0.1, "adaptive": True, "min": 0.05, "max": 60}
    worker.scheduler.enqueue_request(scrapy.Request("http://etag.test/a", meta={"revisit": spec}))
    first = worker.next_request()
    assert b"If-None-Match" not in first.headers
    headers = {"ETag": '"v1"', "Last-Modified": "Wed, 02 Dec 2026 10:00:00 GMT"}
    answer(worker, first, HtmlResponse(first.url, body=b"body", headers=headers))
    second = worker.next_request()
    assert second.headers[b"If-None-Match"] == b'"v1"'
    assert second.headers[b"If-Modified-Since"] == b"Wed, 02 Dec 2026 10:00:00 GMT"
    sig = second.meta["_rv"][1]
    not_modified = Response(second.url, status=304, request=second)
    revisits = worker.scheduler.revisits
    assert revisits is not None
    revisits.on_response(not_modified, second, None)
    assert list(second.callback(not_modified)) == []  # the spider's parse is not called
    assert 304 in second.meta["handle_httpstatus_list"]  # HttpErrorMiddleware lets it through silently
    worker.scheduler.request_done(second)
    worker.settle()
    assert f.status("etag.test").stats.get("unchanged") == 1
    third = worker.next_request()
    assert third.meta["_rv"][1] == sig and third.headers[b"If-None-Match"] == b'"v1"'
    assert third.callback is None  # the next visit is built from the payload as leased


def test_a_spider_that_handles_304_gets_it_and_one_can_turn_conditional_revisits_off(
    worker: InProcessWorker, crawl: str
) -> None:
    """handle_httpstatus_list with 304 keeps the callback; meta revisit_conditional False sends no validators."""
    spec = {"every": 0.1, "adaptive": True, "min": 0.05, "max": 60}
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://etag.test/own", meta={"revisit": spec, "handle_httpstatus_list": [304]}))
    s.enqueue_request(scrapy.Request("http://etag.test/off", meta={"revisit": spec, "revisit_conditional": False}))
    got = {req.url: req for req in (worker.next_request(), worker.next_request())}
    for url, req in got.items():
        answer(worker, req, HtmlResponse(url, body=b"b", headers={"ETag": "W/\"x\""}))
    again = {req.url: req for req in (worker.next_request(), worker.next_request())}
    own, off = again["http://etag.test/own"], again["http://etag.test/off"]
    assert own.headers[b"If-None-Match"] == b'W/"x"' and b"If-None-Match" not in off.headers
    revisits = s.revisits
    assert revisits is not None
    revisits.on_response(Response(own.url, status=304, request=own), own, None)
    assert own.callback is None and own.meta["handle_httpstatus_list"] == [304]


def test_a_retry_copy_of_a_conditional_revisit_asks_without_the_validators(worker: InProcessWorker) -> None:
    """RetryMiddleware's copy of a revisit sent with If-None-Match is crawled once, untracked, for the page itself: no validators."""
    spec = {"every": 0.1, "adaptive": True, "min": 0.05, "max": 60}
    s = worker.scheduler
    s.enqueue_request(scrapy.Request("http://flaky.test/", meta={"revisit": spec}))
    first = worker.next_request()
    answer(worker, first, HtmlResponse(first.url, body=b"b", headers={"ETag": '"e"'}))
    again = worker.next_request()
    assert again.headers[b"If-None-Match"] == b'"e"'
    s.enqueue_request(again.replace(dont_filter=True))  # what RetryMiddleware does on a 503
    answer(worker, again, Response(again.url, status=503))
    retry = worker.next_request()
    assert retry.meta["revisit"] is False and b"If-None-Match" not in retry.headers


# -- against Scrapy and a server with validators -----------------------------


def _validating_server() -> tuple[Any, list[tuple[str, str | None, int]]]:
    """A server of /same (ETag "v1", never changes) and /plain (no validators), logging
    (path, If-None-Match, status) per request."""
    from streams_sched.demo.serving import answering_server

    log: list[tuple[str, str | None, int]] = []

    def get(handler: Any) -> tuple[int, dict[str, str], bytes]:
        asked = handler.headers.get("If-None-Match")
        if handler.path == "/same":
            headers = {"ETag": '"v1"', "Last-Modified": "Wed, 02 Dec 2026 10:00:00 GMT", "Cache-Control": "no-cache"}
            status, body = (304, b"") if asked == '"v1"' else (200, b"<html>" + b"x" * 4000 + b"</html>")
        else:
            headers, status, body = {}, 200, b"<html>plain</html>"
        log.append((handler.path, asked, status))
        return status, {**headers, "Content-Type": "text/html"} if status == 200 else headers, body

    return answering_server(get), log


@pytest.mark.e2e
@pytest.mark.parametrize("cache", [False, True], ids=["plain", "httpcache-rfc2616"])
def test_a_real_crawl_revisits_with_validators_and_its_304s_give_no_item(
    redis_url: str, crawl: str, tmp_path: Any, cache: bool
) -> None:
    """Scrapy with streams-sched against a server that answers 304: revisits ask with the ETag, get 304s, the spider's callback gets only the 200 (with RFC 2616 HTTP caching, the cache turns each 304 into its cached 200), and the page stays tracked."""
    import threading

    from helpers import Worker, base_settings, read_items, wait_for

    server, log = _validating_server()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    record = tmp_path / "items.jsonl"
    extra: dict[str, Any] = {"HTTPCACHE_ENABLED": True, "HTTPCACHE_POLICY": "scrapy.extensions.httpcache.RFC2616Policy",
                             "HTTPCACHE_DIR": str(tmp_path / "cache")} if cache else {}
    settings = base_settings(redis_url, crawl, "bitmap", record, DOWNLOAD_HANDLERS={}, STREAMS_REVISIT_JITTER=0.0,
                             COND_URLS=[f"http://127.0.0.1:{port}/same", f"http://127.0.0.1:{port}/plain"],
                             CLOSESPIDER_TIMEOUT=30, **extra)
    w = Worker(settings, tmp_path / "worker.log", spider="spiders.ConditionalSpider")
    try:
        wait_for(lambda: sum(1 for p, _, s in log if p == "/same" and s == 304) >= 3, timeout=30,
                 what="three 304s of /same")
        wait_for(lambda: sum(1 for p, _, _ in log if p == "/plain") >= 3, timeout=30, what="three visits of /plain")
    finally:
        w.close()
        server.shutdown()
        server.server_close()
    same = [(asked, status) for p, asked, status in log if p == "/same"]
    assert same[0] == (None, 200) and all(asked == '"v1"' for asked, _ in same[1:])
    assert all(asked is None for p, asked, _ in log if p == "/plain")
    items = [i for i in read_items(record) if i["url"].endswith("/same")]
    if cache:
        # the cache answers the spider with its stored 200 each time the server says 304
        assert len(items) >= 3 and {i["status"] for i in items} == {200}
    else:
        assert [i["status"] for i in items] == [200]
    stats = Frontier(redis.Redis.from_url(redis_url), crawl).status("127.0.0.1").stats
    assert stats.get("unchanged", 0) >= 2 and stats.get("tracked") == 2
