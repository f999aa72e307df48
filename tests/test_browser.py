"""Browser work with a real Chromium (Debian's, driven by scrapy-playwright): a spider that
needs a browser gives the in-memory items through Redis; routing and the browser cap as
the site's server measured them, with a browser worker SIGKILLed mid-render; renders that
never finish and tabs that crash go to the dead-letter stream with the reason; a stop of a
worker's whole process group hands its renders back; the demo's browser part.

The site and the spider are in tests/browserweb.py. Without /usr/bin/chromium these tests
skip locally and fail under CI (scripts/bootstrap.sh installs it as root).
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from parsel import Selector

from streams_sched.connect.clients import connect
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import BANDS
from streams_sched.testing import free_port

from browserweb import (
    BROWSER_HOST,
    PLAIN_HOST,
    BrowserServer,
    chromium_missing,
    command_name,
    descendants,
    most_at_once,
    playwright_settings,
    read_lines,
    running,
    secret,
    token,
)
from daemons import scrape, value
from helpers import _NO_REMOTE_CONTROL as NO_REMOTE_CONTROL
from helpers import Worker, crawl_to_end, missing, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SPIDER = "browserweb.BrowserSpider"


@pytest.fixture(autouse=True)
def chromium() -> None:
    reason = chromium_missing()
    if reason:
        missing(reason)


def agent(tag: str) -> str:
    return f"browser-zoo/{tag}"


def crawl_settings(site: BrowserServer, out: Path, tag: str, **extra: Any) -> dict[str, Any]:
    """A worker of the browser spider recording its items and stats in ``out``."""
    return {
        "BROWSER_SITE": site.web.index,
        "ZOO_OUT": str(out),
        "RECORD_TAG": tag,
        "ITEM_PIPELINES": {"zoo.record.ZooRecordPipeline": 100},
        "EXTENSIONS": {"zoo.record.ZooStatsDump": 100, "scrapy.extensions.telnet.TelnetConsole": None, **NO_REMOTE_CONTROL},
        "TELNETCONSOLE_ENABLED": False,
        "ROBOTSTXT_OBEY": False,
        "LOG_LEVEL": "INFO",
        "CONCURRENT_REQUESTS": 16,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 16,
        **playwright_settings(agent(tag)),
        **extra,
    }


def streams(redis_url: str, crawl: str, node: str, **extra: Any) -> dict[str, Any]:
    """What a worker adds to crawl through streams-sched (browser capable unless ``extra`` says)."""
    return {
        "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
        "REDIS_URL": redis_url,
        "STREAMS_PREFIX": crawl,
        "STREAMS_DEDUPE": "bitmap",
        "STREAMS_NODE_ID": node,
        "STREAMS_IDLE_POLL_SECONDS": 0.2,
        "STREAMS_HEARTBEAT_SECONDS": 0.5,
        "STREAMS_CAPABILITIES": ["http", "browser"],
        **extra,
    }


def items_of(out: Path) -> list[dict[str, Any]]:
    return [r["item"] for r in read_lines(out / "browser_zoo.jsonl")]


def stats_of(out: Path) -> dict[str, Any]:
    path = out / "browser_zoo.stats.json"
    return json.loads(path.read_text()) if path.exists() else {}


def raw_page(site: BrowserServer, path: str) -> Selector:
    return Selector(text=urllib.request.urlopen(site.web.url(BROWSER_HOST, path), timeout=10).read().decode())


def dump_log(hits: list[Any], path: Path) -> None:
    """The server's log, to read when a test fails (server seconds from the first request)."""
    t0 = hits[0].t if hits else 0.0
    path.write_text("".join(f"{h.t - t0:8.3f} {h.agent:24} {h.path}\n" for h in hits))


def payload_url(payload: bytes) -> str:
    """The URL of a request payload (as a dead letter keeps it)."""
    from streams_sched.admin.dlq import url_of

    url = url_of(payload)
    assert url is not None
    return url


def urlsplit_path(url: str) -> str:
    return urllib.parse.urlsplit(url).path


def canonical(items: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(i, sort_keys=True) for i in items)


def test_browser_spider_gives_the_in_memory_items_through_redis(
    plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """A spider reading script-written pages and late nested iframes (frame_locator through
    playwright_include_page) with Chromium gives through streams-sched exactly the items of
    Scrapy's in-memory scheduler; what it read is in no raw response, so no crawl without a
    browser could give it; its requests travel, but the one carrying a live page stays local."""
    with BrowserServer(plain=4, js=6, frames=3, render_delay_s=0.1) as site:
        # what the spider's selectors find in the raw HTML, as a crawl without a browser gets it
        for n in range(6):
            raw = raw_page(site, f"/js/{n}")
            assert raw.css(".token::text").get() is None and raw.css(".title").get() is None and not raw.css("a.more")
        for n in range(3):
            assert not raw_page(site, f"/frames/{n}").css("iframe") and raw_page(site, f"/frame/inner/{n}").css(".secret").get() is None
        started = time.monotonic()
        memory = Worker(crawl_settings(site, tmp_path / "memory", "memory"), tmp_path / "memory.log", spider=SPIDER, new_session=True)
        worker = Worker(crawl_settings(site, tmp_path / "streams", "streams", **streams(plain_redis_url, crawl, "w1")),
                        tmp_path / "streams.log", spider=SPIDER, new_session=True)
        crawl_to_end(memory, worker, timeout=120)
        seconds = time.monotonic() - started
        hits = site.hits()
    expected, got = items_of(tmp_path / "memory"), items_of(tmp_path / "streams")
    by_kind = Counter(i["kind"] for i in expected)
    assert by_kind == {"plain": 4 + 6, "js": 6, "frames": 3, "frames-raw": 3}, by_kind
    for item in expected:
        n = int(item["url"].split("?")[0].rsplit("/", 1)[1])
        if item["kind"] == "js":
            assert (item["title"], item["token"]) == (f"Rendered {n}", token(n)), item
        elif item["kind"].startswith("frames"):
            assert item["secret"] == secret(n), item
            assert item["kind"] == "frames" or (item["title"], item["iframes"]) == (f"Frames {n}", 0), item
    assert {i["title"] for i in expected if "js-only" in i["url"]} == {f"Only via JS {n}" for n in range(6)}
    assert canonical(got) == canonical(expected)
    stats = stats_of(tmp_path / "streams")
    assert stats["zoo/close_reason"] == "finished"
    # every request travelled through Redis but the three that carry a live page
    assert stats["streams/unserializable_local"] == 3 and stats["scheduler/dequeued/memory"] == 3
    assert stats["scheduler/dequeued/redis"] == 1 + 4 + 6 + 6 + 3
    assert stats["streams/leased_browser"] == 6 + 3
    assert "streams/render_failed" not in stats
    # the resources only a browser asks for, from each run's own browser
    for tag in ("memory", "streams"):
        fetched = {h.path for h in hits if h.agent == agent(tag) and h.path.startswith(("/data/", "/frame/inner/"))}
        assert fetched == {f"/data/{n}.json" for n in range(6)} | {f"/frame/inner/{n}" for n in range(3)}, tag
    measured(f"{len(expected)} items (js {by_kind['js']}, frames {by_kind['frames']} + {by_kind['frames-raw']} through the"
             f" kept page), equal; both crawls side by side {seconds:.1f}s")


class RedisSampler(threading.Thread):
    """Reads, every 50 ms, the browser site's browser streams (backlog and pending) and the
    browser leases each worker's node record says it holds."""

    def __init__(self, redis_url: str, crawl: str, site: str) -> None:
        super().__init__(daemon=True)
        self.frontier = Frontier(connect(redis_url), crawl)
        self.site = site
        self.samples: list[tuple[float, int, int, dict[str, int]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.05):
            try:
                st = self.frontier.status(self.site)
                nodes = {n: int(info.get("browser", 0)) for n, info in self.frontier.nodes().items()}
            except Exception:  # the crawl's keys are not there yet
                continue
            browser = [st.streams[("browser", band)] for band in BANDS]
            self.samples.append((time.monotonic(), sum(s.backlog for s in browser), sum(s.pending for s in browser), nodes))


def test_browser_tasks_go_only_to_browser_workers_within_the_cap_and_survive_a_kill(
    plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """Two browser workers (STREAMS_BROWSER_MAX=4) and an http-only one: the server sees no
    worker render more than 4 pages at once and the http-only one load no browser page nor
    start a browser; browser tasks past the caps wait in Redis while plain pages flow; a
    browser worker SIGKILLed mid-render loses no page (its leases are taken over) and its
    Chromium dies with it; the workers' metrics show their browser leases against the cap."""
    with BrowserServer(plain=80, js=24, frames=0, render_delay_s=0.6) as site:
        caps = {"b1": ["http", "browser"], "b2": ["http", "browser"], "h1": ["http"]}
        ports = {tag: free_port() for tag in caps}
        workers = {
            tag: Worker(
                crawl_settings(site, tmp_path / tag, tag, **streams(
                    plain_redis_url, crawl, tag, STREAMS_CAPABILITIES=cap, STREAMS_BROWSER_MAX=4, STREAMS_LEASE_SECONDS=4,
                    STREAMS_SITES={PLAIN_HOST: {"rate": 20, "burst": 2}}, STREAMS_METRICS_PORT=ports[tag],
                )),
                tmp_path / f"{tag}.log", spider=SPIDER, new_session=True,
            )
            for tag, cap in caps.items()
        }
        sampler = RedisSampler(plain_redis_url, crawl, BROWSER_HOST)
        sampler.start()
        browsers_of_h1: set[str] = set()
        try:
            metrics: dict[str, Any] = {}

            def b1_mid_render() -> bool:
                browsers_of_h1.update(command_name(p) for p in descendants(workers["h1"].proc.pid))
                renders = site.renders()
                done = sum(1 for r in renders if r[3] != float("inf"))
                if done < 6 or not any(r[0] == agent("b1") and r[3] == float("inf") for r in renders):
                    return False
                # the server sees a render end before its worker has the response: read the
                # workers' metrics until they show a render too
                metrics.update({tag: scrape(port) for tag, port in ports.items()})
                return any(
                    (value(metrics[tag], "streams_sched_worker_render_seconds_count", crawl=crawl, node=tag) or 0) > 0
                    for tag in ("b1", "b2")
                )

            wait_for(b1_mid_render, timeout=90, what="b1 rendering, 6 renders done and shown in its metrics")
            b1_processes = descendants(workers["b1"].proc.pid)
            b1_commands = {command_name(p) for p in b1_processes}
            workers["b1"].kill()
            killed_at = time.monotonic()
            wait_for(lambda: not running(b1_processes), timeout=15, what="the killed worker's Chromium to die with it")
            chromium_gone_s = time.monotonic() - killed_at
            in_flight = sum(1 for r in site.renders() if r[0] == agent("b1") and r[3] == float("inf"))
            crawl_to_end(workers["b2"], workers["h1"], timeout=120)
        finally:
            sampler.done.set()
            for w in workers.values():
                w.close()
        hits = site.hits()
        renders = site.renders(until={agent("b1"): killed_at})
    dump_log(hits, tmp_path / "server.log")
    # what the server saw: renders at once per worker, none by the http-only one
    peak = {tag: most_at_once([(s, e) for a, _, s, e in renders if a == agent(tag)]) for tag in caps}
    assert peak["b1"] <= 4 and peak["b2"] <= 4 and max(peak.values()) == 4, peak
    browser_paths = ("/js/", "/data/", "/mark/", "/frame")
    assert not [h.path for h in hits if h.agent == agent("h1") and h.path.startswith(browser_paths)]
    assert "chromium" in b1_commands and "chromium" not in browsers_of_h1
    # the workers' own metrics: browser leases against the cap, render times
    rendered = {}
    for tag in caps:
        m, labels = metrics[tag], {"crawl": crawl, "node": tag}
        assert value(m, "streams_sched_worker_browser_max", **labels) == (0 if tag == "h1" else 4)
        assert 0 <= value(m, "streams_sched_worker_browser_leases", **labels) <= (0 if tag == "h1" else 4)
        rendered[tag] = value(m, "streams_sched_worker_render_seconds_count", **labels)
    assert rendered["h1"] == 0 and rendered["b1"] + rendered["b2"] > 0, rendered
    h1_stats = stats_of(tmp_path / "h1")
    assert h1_stats["zoo/close_reason"] == "finished" and h1_stats.get("streams/leased_browser", 0) == 0
    # browser tasks past the caps waited in Redis: while both workers held their cap, more were queued
    assert max(max(nodes.values(), default=0) for _, _, _, nodes in sampler.samples) <= 4
    waiting = [backlog for _, backlog, _, nodes in sampler.samples if nodes.get("b1") == nodes.get("b2") == 4 and backlog > 0]
    assert waiting, "no moment with both browser workers at their cap and browser tasks queued in Redis"
    # plain pages flowed while the browsers were busy
    start, end = min(r[2] for r in renders), max(r[3] for r in renders)
    plain = [h for h in hits if h.path.startswith(("/plain/", "/js-only/")) and start <= h.t <= end]
    assert len(plain) >= 20 and agent("h1") in {h.agent for h in plain}, len(plain)
    # nothing lost: every page gave its item
    items = [i for tag in caps for i in items_of(tmp_path / tag)]
    urls = Counter(i["url"] for i in items)
    expected = {site.web.url(PLAIN_HOST, f"/plain/{n}") for n in range(80)}
    expected |= {site.web.url(BROWSER_HOST, f"/js/{n}") for n in range(24)} | {site.web.url(PLAIN_HOST, f"/js-only/{n}") for n in range(24)}
    assert set(urls) == expected, sorted(expected - set(urls))[:5]
    assert all(i["token"] == token(int(i["url"].rsplit("/", 1)[1])) for i in items if i["kind"] == "js")
    again = sum(n - 1 for n in urls.values())
    taken = stats_of(tmp_path / "b2").get("streams/reclaimed", 0) + h1_stats.get("streams/reclaimed", 0)
    measured(f"most renders at once b1 {peak['b1']}, b2 {peak['b2']}, h1 {peak['h1']} (cap 4); browser tasks queued in Redis"
             f" while both at cap: up to {max(waiting)}; plain pages during the browser phase ({end - start:.1f}s): {len(plain)};"
             f" b1 killed with {in_flight} renders in flight, its Chromium gone after {chromium_gone_s:.1f}s; leases taken over"
             f" {taken}, pages crawled twice {again}, lost 0")


def test_renders_that_never_finish_or_crash_their_tab_go_to_dead_letters_with_the_reason(
    plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """A page that never finishes loading times out (PLAYWRIGHT_DEFAULT_NAVIGATION_TIMEOUT)
    and one whose tab crashes fail on each delivery: retried by the frontier, then
    dead-lettered with the error after STREAMS_MAX_DELIVERIES, the errback run once for the
    last; the worker goes on with the other pages and finishes the crawl."""
    with BrowserServer(plain=2, js=3, frames=0, hang=1, crash=1, render_delay_s=0.05) as site:
        settings = crawl_settings(
            site, tmp_path / "w1", "w1",
            **streams(plain_redis_url, crawl, "w1", STREAMS_MAX_DELIVERIES=2),
            **playwright_settings(agent("w1"), nav_timeout_ms=1500, small_heap=True),
        )
        started = time.monotonic()
        crawl_to_end(Worker(settings, tmp_path / "w1.log", spider=SPIDER, new_session=True), timeout=120)
        seconds = time.monotonic() - started
        hits = site.hits()
    dump_log(hits, tmp_path / "server.log")
    f = Frontier(connect(plain_redis_url), crawl)
    letters = {letter["r"]: letter for letter in f.dead_letters(BROWSER_HOST)}
    assert len(letters) == 2, letters
    reasons = {}
    for letter in letters.values():
        url = payload_url(letter["r"])
        reasons[urlsplit_path(url)] = letter["reason"].decode()
        assert letter["deliveries"] == b"2" and letter["node"] == b"w1"
    hang, crash = reasons["/hang/0"], reasons["/crash/0"]
    assert hang.startswith("delivered 2 times (STREAMS_MAX_DELIVERIES=2), the last failed: TimeoutError:"), hang
    assert "Timeout 1500ms exceeded" in hang
    assert crash.startswith("delivered 2 times (STREAMS_MAX_DELIVERIES=2), the last failed:") and "crash" in crash.lower(), crash
    # each was loaded once per delivery (scrapy-playwright itself tries a crashed tab 4 times)
    loads = Counter(h.path for h in hits)
    assert loads["/hang/0"] == 2 and loads["/crash/0"] >= 2, loads
    items = items_of(tmp_path / "w1")
    failed = sorted((i["url"].rsplit("/", 2)[-2], i["error"]) for i in items if i["kind"] == "failed")
    assert [kind for kind, _ in failed] == ["crash", "hang"], failed  # the errback ran once each
    assert sorted(i["token"] for i in items if i["kind"] == "js") == sorted(token(n) for n in range(3))
    assert sum(1 for i in items if i["kind"] == "plain") == 2 + 3
    stats = stats_of(tmp_path / "w1")
    assert stats["zoo/close_reason"] == "finished"
    assert (stats["streams/render_failed"], stats["streams/delivery_failed"], stats["streams/dead_lettered"]) == (4, 2, 2)
    st = f.status(BROWSER_HOST)
    assert (st.backlog, st.pending, st.stats["failed"]) == (0, 0, 2)
    measured(f"hang and crash dead-lettered after 2 deliveries each (crash: {loads['/crash/0']} tab loads), the other"
             f" {len(items) - 2} pages crawled; {seconds:.1f}s; reasons: {hang!r}, {crash!r}")


def test_a_stop_that_takes_the_browser_down_hands_the_renders_back_uncounted(
    plain_redis_url: str, crawl: str, tmp_path: Path, measured: Any
) -> None:
    """SIGTERM to a browser worker's whole process group mid-render (systemd's stop with
    KillMode=control-group: Chromium dies at once too) hands every lease back with its
    delivery count unchanged: no failed delivery, no dead letter, nothing lost. (A render
    the dead browser leaves hanging is handed back at STREAMS_SHUTDOWN_TIMEOUT_SECONDS.)"""
    with BrowserServer(plain=0, js=8, frames=0, render_delay_s=3.0) as site:
        settings = crawl_settings(site, tmp_path / "w1", "w1", **streams(
            plain_redis_url, crawl, "w1", STREAMS_BROWSER_MAX=4, STREAMS_SHUTDOWN_TIMEOUT_SECONDS=2))
        worker = Worker(settings, tmp_path / "w1.log", spider=SPIDER, new_session=True)
        try:
            wait_for(lambda: sum(1 for r in site.renders() if r[3] == float("inf")) == 4, timeout=60, what="4 renders in flight")
            processes = descendants(worker.proc.pid)
            os.killpg(worker.proc.pid, signal.SIGTERM)
            stopping = time.monotonic()
            code = worker.wait(60)
            stopped_s = time.monotonic() - stopping
            wait_for(lambda: not running(processes), timeout=15, what="the browser to be gone")
        finally:
            worker.close()
    f = Frontier(connect(plain_redis_url), crawl)
    st = f.status(BROWSER_HOST)
    stats = stats_of(tmp_path / "w1")
    measured(f"SIGTERM to the group with 4 renders in flight: exit code {code} after {stopped_s:.1f}s; {stats.get('streams/render_failed', 0)}"
             f" renders failed as the browser died, {stats.get('streams/shutdown_handed_back', 0)} left hanging;"
             f" all {stats.get('streams/released', 0)} leases handed back, 8 queued again")
    assert code == 0, worker.log()
    assert (st.backlog, st.pending, st.dead_letters, st.stats.get("failed", 0)) == (8, 0, 0, 0)
    assert stats.get("streams/delivery_failed", 0) == 0 and stats["streams/released"] == 4
    again = f.lease(BROWSER_HOST, "next", 8, (1, 1, 1), max_browser=8, max_suspects=8).entries
    assert len(again) == 8 and {e.deliveries for e in again} == {0}


def test_the_demo_renders_its_browser_part_and_says_it_skips_it_without_chromium(
    plain_redis_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quick-start demo's browser part renders every script-written page with the system
    Chromium and says so; without a Chromium it says it skipped that part and fails nothing."""
    import argparse

    import streams_sched.demo.browser as demo_browser
    from streams_sched.demo.__main__ import browser_part

    args = argparse.Namespace(browser_pages=6, lease_seconds=5.0)
    client = connect(plain_redis_url)
    assert browser_part(client, plain_redis_url, tmp_path, args) is True
    out = capsys.readouterr().out
    assert "renders them with scrapy-playwright and /usr/bin/chromium" in out and "6/6 pages rendered and read" in out
    monkeypatch.setattr(demo_browser, "find_chromium", lambda: None)
    assert browser_part(client, plain_redis_url, tmp_path, args) is None
    assert "browser part skipped: no Chromium (Debian: apt-get install chromium)" in capsys.readouterr().out
