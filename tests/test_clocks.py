"""One clock: every time that crosses processes is Redis TIME or a duration, never a worker's
wall clock. Pure pieces, a scheduler in-process with its wall clock off, and real workers
whose wall clocks are 30 s ahead and 30 s behind (tests/skewed_clock/sitecustomize.py)."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from email.utils import formatdate
from pathlib import Path
from typing import Any

import pytest
import scrapy
from click.testing import CliRunner
from scrapy.http import HtmlResponse
from scrapy.utils.request import RequestFingerprinter

from reclaimer import Reclaimer, ReclaimerSettings
from streams_sched.cli import main as cli_main
from streams_sched.config import StreamsConfig
from streams_sched.demo.web import SyntheticWeb
from streams_sched.frontier.clock import RedisClock, time_reply_s
from streams_sched.frontier.entries import entry_for
from streams_sched.service.liveness import ALIVE, DEAD
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.scheduler import Limits, StreamsScheduler

from helpers import (
    Worker,
    base_settings,
    crawled_urls,
    frontier,
    read_items,
    subscribe_events,
    wait_for,
    wait_heartbeats,
)

#: how far the skewed workers' wall clocks are off
SKEW_S = 30.0


# -- pure pieces ---------------------------------------------------------------


class FakeClient:
    """Answers TIME with a Redis clock ``offset_s`` ahead of the fake monotonic clock; counts the calls."""

    def __init__(self, mono: list[float], offset_s: float) -> None:
        self.mono = mono
        self.offset_s = offset_s
        self.calls = 0

    def time(self) -> tuple[int, int]:
        self.calls += 1
        t = self.mono[0] + self.offset_s
        return int(t), int(round((t - int(t)) * 1e6))


def test_clock_reads_time_once_then_runs_on_the_monotonic_clock() -> None:
    """now() reads TIME on first use and again only once its reading is max_age_s old; estimate() never does."""
    mono = [100.0]
    client = FakeClient(mono, 1_700_000_000.0)
    clock = RedisClock(client, max_age_s=60.0, monotonic=lambda: mono[0])
    assert not clock.read
    assert clock.now() == pytest.approx(1_700_000_100.0, abs=1e-5) and client.calls == 1
    mono[0] = 159.0
    assert clock.now() == pytest.approx(1_700_000_159.0, abs=1e-5) and client.calls == 1
    assert clock.estimate() == pytest.approx(1_700_000_159.0, abs=1e-5) and client.calls == 1
    mono[0] = 161.0
    client.offset_s += 2.0  # the server's clock was stepped
    assert clock.now() == pytest.approx(1_700_000_163.0, abs=1e-5) and client.calls == 2


def test_clock_takes_a_reading_as_of_the_middle_of_its_round_trip() -> None:
    """A TIME reply observed between sent and received counts as read at their midpoint."""
    mono = [10.0]
    clock = RedisClock(None, monotonic=lambda: mono[0])
    clock.observe([b"1000", b"500000"], sent=8.0, received=10.0)
    assert clock.estimate() == pytest.approx(1000.5 + 1.0)
    assert time_reply_s([b"12", b"000001"]) == pytest.approx(12.000001)


def test_clock_estimate_before_any_reading_is_the_wall_clock() -> None:
    """Without a reading, estimate() falls back on this process's wall clock (and reads nothing)."""
    clock = RedisClock(None)
    assert abs(clock.estimate() - time.time()) < 1.0 and not clock.read


def test_not_before_is_read_on_the_clock_given() -> None:
    """entry_for turns meta["not_before"] into a delay against the clock it is given, not time.time()."""
    codec = RequestCodec(None)
    request = scrapy.Request("http://a.test/", meta={"not_before": 1000.0})
    assert entry_for(request, codec, RequestFingerprinter(), now=lambda: 996.5).delay_ms == 3500
    assert entry_for(request, codec, RequestFingerprinter(), now=lambda: 1030.0).delay_ms == 0


# -- against Redis, in one process ---------------------------------------------


def test_heartbeat_script_stamps_the_record_with_redis_time(plain_redis_url: str, crawl: str) -> None:
    """heartbeat.lua writes last_seen from Redis TIME (a last_seen sent along is dropped) and returns that TIME."""
    f = frontier(plain_redis_url, crawl)
    reply = f.heartbeat("n1", {"node": "n1", "state": "online", "last_seen": 5.0, "pid": 7, "caps": []})
    record = f.nodes()["n1"]
    assert record["last_seen"] == pytest.approx(time_reply_s(reply), abs=1e-6)
    assert {k: v for k, v in record.items() if k != "last_seen"} == {"node": "n1", "state": "online", "pid": 7, "caps": []}
    f.heartbeat("n2", {})
    assert list(f.nodes()["n2"]) == ["last_seen"]


def test_revisit_buckets_follow_redis_time(plain_redis_url: str, crawl: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The revisit bucket a fingerprint goes in comes from Redis TIME, whatever time.time() says."""
    f = frontier(plain_redis_url, crawl, revisit_s=40.0, revisit_buckets=4)
    expected = f.filters("a.test", time_reply_s(f.client.time()))
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SKEW_S)
    got = f.filters("a.test")
    assert got == expected or got == f.filters("a.test", time_reply_s(f.client.time()))  # a bucket may turn meanwhile
    assert got != f.filters("a.test", time.time())


@pytest.fixture
def skewed_sched(plain_redis_url: str, crawl: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[StreamsScheduler]:
    """A scheduler whose process's wall clock runs SKEW_S ahead (from before it opens)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + SKEW_S)
    config = StreamsConfig.from_settings(
        {"REDIS_URL": plain_redis_url, "STREAMS_PREFIX": crawl, "STREAMS_IDLE_POLL_SECONDS": 0.1,
         "STREAMS_FLUSH_INTERVAL_SECONDS": 0.005},
        "unit",
    )
    s = StreamsScheduler(config, fingerprinter=RequestFingerprinter(), limits=Limits(4, 4))
    s.open(scrapy.Spider(name="unit"))
    yield s
    s.close("test")


def _redis_now(client: Any) -> float:
    return time_reply_s(client.time())


def test_retry_after_becomes_a_redis_time_not_before(skewed_sched: StreamsScheduler) -> None:
    """A 429's Retry-After (seconds or an HTTP date) sets not_before on Redis time, on a worker 30 s ahead."""
    s = skewed_sched
    client = s.frontier.client
    for header, wait_s in (("5", 5.0), (formatdate(_redis_now(client) + 10, usegmt=True), 10.0)):
        request = scrapy.Request("http://a.test/")
        before = _redis_now(client)
        s.answers.on_response_downloaded(
            HtmlResponse(request.url, status=429, headers={"Retry-After": header}, request=request), request, s.spider
        )
        # an HTTP date has whole seconds
        assert before + wait_s - 1.1 <= request.meta["not_before"] <= _redis_now(client) + wait_s + 0.1, header


def test_stale_not_before_from_another_worker_waits_nothing(
    skewed_sched: StreamsScheduler, plain_redis_url: str, crawl: str
) -> None:
    """On a worker 30 s ahead, a retry whose not_before (Redis time) has passed is queued at once; one still ahead is delayed."""
    s = skewed_sched
    f = frontier(plain_redis_url, crawl)
    now = _redis_now(f.client)
    assert s.enqueue_request(scrapy.Request("http://stale.test/", meta={"not_before": now - 1}))
    assert s.enqueue_request(scrapy.Request("http://ahead.test/", meta={"not_before": now + 20}))
    def queued(site: str) -> tuple[int, int]:
        st = f.status(site)
        return st.backlog + st.pending, st.delayed  # the worker may have leased it already

    wait_for(lambda: queued("stale.test") == (1, 0) and queued("ahead.test") == (0, 1), timeout=10,
             what="both requests in Redis")
    (due,) = f.client.zrange(f.site("ahead.test").delayed, 0, -1, withscores=True)
    assert now + 19 <= due[1] / 1000 <= now + 21


def test_node_record_and_started_are_on_redis_time(skewed_sched: StreamsScheduler, plain_redis_url: str, crawl: str) -> None:
    """A worker 30 s ahead records its last_seen and its start in Redis time."""
    f = frontier(plain_redis_url, crawl)
    (record,) = f.nodes().values()
    now = _redis_now(f.client)
    assert now - 5 <= record["last_seen"] <= now + 0.5
    assert now - 5 <= record["started"] <= now + 0.5


# -- real workers with skewed wall clocks ----------------------------------------


def _downloads(path: Path, skews: dict[str, float]) -> list[dict[str, Any]]:
    """The download handler's records, each with ``real``: its time on the machine's clock
    (a worker's ``t`` is its own, skewed, clock)."""
    out = []
    for line in path.read_text().splitlines():
        d = json.loads(line)
        d["real"] = d["t"] - skews[d["worker"]]
        out.append(d)
    return out


def _http_date(epoch_s: int) -> str:
    return formatdate(epoch_s, usegmt=True)


@pytest.mark.slow
@pytest.mark.e2e
def test_retries_wait_their_delay_not_the_skew_between_workers(
    plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """Retry-After and a retry's not_before mean the same wait on workers 30 s ahead and 30 s behind."""
    items, downloads = tmp_path / "items.jsonl", tmp_path / "downloads.jsonl"
    f = frontier(plain_redis_url, crawl)
    a0 = int(_redis_now(f.client))
    date_a = a0 + 15  # a Retry-After date the +30 s worker reads
    common = dict(
        SYNTH_SITES=2, SYNTH_PAGES=8, SYNTH_RECORD_FILE=str(downloads), STREAMS_ADAPTIVE=False, RETRY_TIMES=4,
    )
    # A (+30 s) answers 429 first: site0/p/1 and site1/p/1 say "4" (seconds), site0/p/2 a date
    ahead = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SEED=True, RECORD_TAG="ahead", **common,
        SYNTH_SPECIAL={
            "http://site0.test/p/1": {"status": 429, "headers": {"Retry-After": "4"}, "times": 1},
            "http://site0.test/p/2": {"status": 429, "headers": {"Retry-After": _http_date(date_a)}, "times": 1},
            "http://site1.test/p/1": {"status": 429, "headers": {"Retry-After": "4"}, "times": 1},
        },
    )
    a = Worker(ahead, tmp_path / "ahead.log", clock_skew_s=SKEW_S)
    b: Worker | None = None
    try:
        # once A has the three 429s, it stops; the retries go to B, which starts now
        wait_for(lambda: sum(f.status(s).delayed for s in ("site0.test", "site1.test")) == 3, timeout=45,
                 what=f"A's three retries in the delay queues; log:\n{a.log()}")
        a.proc.send_signal(signal.SIGINT)
        b0 = int(_redis_now(f.client))
        date_b = b0 + 10  # a Retry-After date the -30 s worker reads
        # B (-30 s) answers the retry of site0/p/1 with a 500 (its retry copies A's not_before)
        # and the retry of site1/p/1 with a 429 and a date
        behind = base_settings(
            plain_redis_url, crawl, "bitmap", items, RECORD_TAG="behind", **common,
            SYNTH_SPECIAL={
                "http://site0.test/p/1": {"status": 500, "times": 1},
                "http://site1.test/p/1": {"status": 429, "headers": {"Retry-After": _http_date(date_b)}, "times": 1},
            },
        )
        b = Worker(behind, tmp_path / "behind.log", clock_skew_s=-SKEW_S)
        assert a.wait(30) == 0, a.log()
        code = b.wait(120)
        done = _redis_now(f.client)
        assert code == 0, b.log()
    finally:
        a.close()
        if b is not None:
            b.close()
    d = _downloads(downloads, {"ahead": SKEW_S, "behind": -SKEW_S})

    def tries(url: str) -> list[tuple[str, float]]:
        return [(x["worker"], x["real"]) for x in d if x["url"] == url]

    p1, p2, q1 = tries("http://site0.test/p/1"), tries("http://site0.test/p/2"), tries("http://site1.test/p/1")
    assert [w for w, _ in p1] == ["ahead", "behind", "behind"], p1  # 429, 500, 200
    assert [w for w, _ in p2][0] == "ahead" and len(p2) == 2, p2  # 429 (a date), 200
    assert [w for w, _ in q1] == ["ahead", "behind", "behind"], q1  # 429, 429 (a date), 200
    # the dates were ahead when they were read, or the run proves nothing about them
    assert p2[0][1] < date_a - 3 and q1[1][1] < date_b - 3, (p2, q1, date_a, date_b)
    waits = {
        "site0/p/1 429 -> 500 (Retry-After 4 s, on A)": p1[1][1] - p1[0][1],
        "site0/p/1 500 -> 200 (not_before from A, on B)": p1[2][1] - p1[1][1],
        "site0/p/2 429 date -> 200 (on A), late by": p2[1][1] - date_a,
        "site1/p/1 429 date -> 200 (on B), late by": q1[2][1] - date_b,
        "crawl (from A's start)": done - a0,
    }
    measured("retry waits (s): " + "; ".join(f"{k}: {v:.2f}" for k, v in waits.items()))
    assert p1[1][1] - p1[0][1] >= 4 - 0.5, waits
    assert p1[2][1] - p1[1][1] < 3, waits  # A's not_before, already past, is not waited again
    assert -0.5 <= p2[1][1] - date_a < 3, waits  # a date read by a worker 30 s ahead
    assert -0.5 <= q1[2][1] - date_b < 3, waits  # a date read by a worker 30 s behind
    assert set(crawled_urls(items)) == SyntheticWeb(sites=2, pages=8).all_urls()
    assert max(x["real"] for x in d) < max(date_a, date_b) + 4, waits  # nothing waited a skew


def _nodes_cli(url: str, crawl: str) -> dict[str, str]:
    res = CliRunner().invoke(cli_main, ["nodes", "-c", crawl, "--json"], env={"REDIS_URL": url}, catch_exceptions=False)
    return {n["node"]: n["state"] for n in json.loads(res.output)["nodes"]}


@pytest.mark.e2e
def test_liveness_is_judged_by_when_redis_heard_the_worker(
    plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """`nodes` and the reclaimer show a worker 30 s behind alive while it crawls, and one 30 s ahead dead soon after SIGKILL."""
    items = tmp_path / "items.jsonl"
    settings = base_settings(
        plain_redis_url, crawl, "bitmap", items, SYNTH_SITES=2, SYNTH_PAGES=300, SYNTH_DELAY_SECONDS=0.05,
        CONCURRENT_REQUESTS=2, STREAMS_CLOSE_ON_DRAIN=False,
    )
    events = subscribe_events(plain_redis_url, crawl)
    f = frontier(plain_redis_url, crawl)
    reclaimer = Reclaimer(ReclaimerSettings(redis_url=plain_redis_url))
    reclaimer.connect()
    behind = Worker({**settings, "SYNTH_SEED": True}, tmp_path / "behind.log", clock_skew_s=-SKEW_S)
    ahead = Worker(settings, tmp_path / "ahead.log", clock_skew_s=SKEW_S)
    try:
        records = wait_for(lambda: len(f.nodes()) == 2 and f.nodes(), timeout=45, what="both workers' records")
        node_of = {r["pid"]: n for n, r in records.items()}
        slow, fast = node_of[behind.proc.pid], node_of[ahead.proc.pid]
        # alive at every look over several heartbeats, while pages are crawled
        crawled = len(read_items(items))
        for _ in range(4):
            wait_heartbeats(events, 2, behind)
            assert _nodes_cli(plain_redis_url, crawl) == {slow: ALIVE, fast: ALIVE}
            states = reclaimer.node_states(f, f.nodes())
            assert {n: st.state for n, st in states.items()} == {slow: ALIVE, fast: ALIVE}
        assert len(read_items(items)) > crawled, "the workers crawled meanwhile"
        ahead.kill()
        killed = time.monotonic()
        wait_for(lambda: _nodes_cli(plain_redis_url, crawl).get(fast) == DEAD, timeout=10,
                 what="the killed worker shown dead")
        dead_after_s = time.monotonic() - killed
        assert reclaimer.node_states(f, f.nodes())[fast].state == DEAD
        assert _nodes_cli(plain_redis_url, crawl)[slow] == ALIVE
        # three heartbeats of 0.5 s, plus one heartbeat and the look itself
        measured(f"the worker 30 s ahead was shown dead {dead_after_s:.2f} s after SIGKILL")
        assert dead_after_s < 5
    finally:
        ahead.close()
        behind.close()
        reclaimer.close()
        events.close()
