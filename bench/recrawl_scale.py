"""``python -m bench recrawl-scale``: what a fetch costs when a million tracked pages wait.

Two frontiers of the same ``--sites`` sites (default 10,000), each on its own throwaway
redis-server (plain, bitmap dedupe), and one real Scrapy worker process crawling each
for ``--fetches`` pages (CLOSESPIDER_ITEMCOUNT) of a synthetic web that costs nothing to
download (site ``i`` is ``http://s{i}.test/``, its pages ``/p{j}``; CONCURRENT_REQUESTS 256,
CONCURRENT_REQUESTS_PER_DOMAIN 2):

- ``tracked``: ``--pages`` pages per site (default 100: 1,000,000 in all) waiting in their
  sites' delayed ZSETs as tracked pages (``meta["revisit"]``, adaptive, every 86,400 s),
  ``--due`` of each site due now and the rest due from 1 h to 25 h from now, spread
  evenly. They get there through the real path, once, before the first round: the pages
  are seeded (``Seeder``), leased (lease.lua), answered and acked as a worker acks them
  (``worker.revisits.Revisits.ack`` builds each ack from the page and its answer, ack.lua
  puts it in the delayed ZSET; only its delay is replaced, by the spread above). That
  they are tracked pages is checked with ``admin.revisits.tracked_pages`` (what
  ``streams-sched revisits`` lists). The worker fetches due pages only: each one's ack
  puts it back for its next visit, a day later, so every round finds due pages left as
  long as ``--due`` x sites exceeds ``--rounds`` x ``--fetches``;
- ``one-off``: a frontier without a tracked page, a one-off crawl of the same pages:
  ``--one-off-pages`` pages of every site (default ``--pages``, so the same million) seeded
  as ordinary requests, emptied and seeded again each round. Its Redis holds as much as
  the tracked one's, so what a command costs in a large data set (cache misses) is in
  both; ``--one-off-pages 7`` compares with a small frontier instead.

Per run: worker CPU per fetch (the process's CPU from the start gate to its last item,
bench/probe.py), Redis CPU per fetch (INFO cpu, used_cpu_sys + used_cpu_user, from the
start gate to the worker's exit), Redis commands and the worker's round trips per
fetch, and for ``tracked`` the delayed requests promoted (they follow the fetches, not
the million waiting). The kinds alternate in order round by round; the report gives
medians and the median of the per-round ratios, ``tracked`` against ``one-off`` (the
target is at most 1.2x).

    python -m bench recrawl-scale                        # 1,000,000 tracked pages on 10,000 sites
    python -m bench recrawl-scale --quick                # 20 sites x 50 pages, 1 round: seconds
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import redis
from scrapy import Request
from scrapy.http import HtmlResponse, Response

from .crawl import CrawlSpec, _launch, _redis_counters, _tail, worker_settings
from .onepage import OnePageHandler

RESULTS = Path(__file__).resolve().parent / "results"
#: the tracked pages' interval (s): a fetched page is not due again within a run
EVERY_S = 86_400
#: waiting pages are due from this long after the build ...
FIRST_MS = 3_600_000
#: ... over this long
SPREAD_MS = 86_400_000
#: the most CPU a fetch of a tracked page may cost against a one-off fetch (worker and Redis)
TARGET = 1.2
KINDS = ("tracked", "one-off")
CRAWL = "recrawl"
WEIGHTS = (8, 3, 1)
_URL_RE = re.compile(r"^http://s(\d+)\.test/p(\d+)$")


def say(text: str) -> None:
    print(f"[bench recrawl-scale] {text}", file=sys.stderr, flush=True)


def page_url(site: int, page: int) -> str:
    return f"http://s{site}.test/p{page}"


def page_body(site: int, page: int) -> bytes:
    """The page's HTML: the same at every visit (an adaptive page finds it unchanged)."""
    return f"<html><head><title>site {site}</title></head><body><p>page {page}</p></body></html>".encode()


class ScaleHandler(OnePageHandler):
    """Serves page ``j`` of site ``i`` (``http://s{i}.test/p{j}``) at no cost, 404 past ``SYNTH_SITES``."""

    async def _respond(self, request: Request) -> Response:
        m = _URL_RE.match(request.url)
        if m is None or int(m.group(1)) >= self.sites:
            return HtmlResponse(request.url, status=404, body=b"<html>not found</html>", request=request)
        return HtmlResponse(request.url, status=200, body=page_body(int(m.group(1)), int(m.group(2))),
                            request=request, encoding="utf-8")


# --- the frontiers -------------------------------------------------------------------------------


def tracked_meta() -> dict[str, Any]:
    return {"revisit": {"every": EVERY_S, "adaptive": True}}


def delay_ms(site: int, page: int, sites: int, pages: int, due: int) -> int:
    """When page ``page`` of site ``site`` is next due, from its ack: now for the first
    ``due`` of each site, the rest spread evenly from FIRST_MS over SPREAD_MS."""
    if page < due:
        return 0
    return FIRST_MS + (page * sites + site) * SPREAD_MS // (sites * pages)


def build_tracked(url: str, sites: int, pages: int, due: int, chunk_sites: int = 50) -> dict[str, Any]:
    """Put ``sites`` x ``pages`` tracked pages in the delayed ZSETs through the real path:
    seeded, leased, answered and acked as a worker does (see the module docstring)."""
    from streams_sched.admin.revisits import tracked_pages
    from streams_sched.config import StreamsConfig
    from streams_sched.connect.clients import connect
    from streams_sched.frontier.bloom import crawl_bloom, detect_dedupe
    from streams_sched.frontier.client import Frontier
    from streams_sched.frontier.seeding.seeder import Seeder
    from streams_sched.wire.codec import RequestCodec
    from streams_sched.worker.revisits import Revisits

    t0 = time.perf_counter()
    client = connect(url)
    detect_dedupe(client, CRAWL, "bitmap")
    config = StreamsConfig.from_settings({"REDIS_URL": url, "STREAMS_PREFIX": CRAWL}, "bench")
    codec = RequestCodec(None)
    # the first visit of every page is what these acks are: a page answered 200 with its body
    revisits = Revisits(config, codec, lambda request: True, rand=lambda: 0.5)
    added = 0
    for first in range(0, sites, chunk_sites):
        part = range(first, min(first + chunk_sites, sites))

        def requests(part: range = part) -> Iterator[Request]:
            for s in part:
                for j in range(pages):
                    yield Request(page_url(s, j), meta=tracked_meta())

        with Seeder(client, CRAWL, check_server=False) as seeder:
            added += len(seeder.seed(requests()).added)
    f = Frontier(client, CRAWL, crawl_bloom(client, CRAWL))
    f.load_scripts()
    f.use_crawl_defaults(f.crawl_meta())
    for s in range(sites):
        site = f"s{s}.test"
        left = pages
        while left:
            entries = f.lease(site, "bench-build", min(left, 500), WEIGHTS).entries
            if not entries:
                raise RuntimeError(f"{site}: nothing to lease with {left} pages left")
            acks = []
            for e in entries:
                assert e.payload is not None
                request = codec.decode(e.payload)
                j = int(_URL_RE.match(request.url).group(2))  # type: ignore[union-attr]
                revisits.handed_out(request)
                revisits.on_response(SimpleNamespace(status=200, body=page_body(s, j), headers={}), request)
                ack = revisits.ack(e, request)
                assert ack.revisit is not None, request.url
                acks.append((e.stream, e.id, delay_ms(s, j, sites, pages, due), *ack.revisit[1:]))
            f.ack(site, [], revisits=acks)
            left -= len(entries)
    waiting = sum(client.zcard(f.site(f"s{s}.test").delayed) for s in range(0, sites, max(1, sites // 50)))
    sample = max(1, len(range(0, sites, max(1, sites // 50))))
    listed = tracked_pages(f, "s0.test", limit=pages)
    if len(listed) != pages or any(p.interval_s != EVERY_S for p in listed):
        raise RuntimeError(f"streams-sched revisits lists {len(listed)} tracked pages of s0.test, not {pages}")
    out = {"seeded": added, "waiting_per_site": waiting / sample, "listed_s0": len(listed),
           "build_s": time.perf_counter() - t0, "used_memory": int(client.info("memory")["used_memory"])}
    client.close()
    return out


def seed_one_off(url: str, sites: int, due: int) -> tuple[int, float]:
    """An emptied Redis, then the ``due`` first pages of every site as ordinary requests;
    returns the pages added and the Redis CPU (s) their enqueue took: a one-off crawl
    enqueues each page it fetches once, where a revisit's ack puts it back."""
    from streams_sched.connect.clients import connect
    from streams_sched.frontier.bloom import detect_dedupe
    from streams_sched.frontier.seeding.seeder import Seeder

    client = connect(url)
    client.flushall()
    client.script_flush()
    detect_dedupe(client, CRAWL, "bitmap")
    before = _redis_counters([client])["cpu_s"]
    with Seeder(client, CRAWL, check_server=False) as seeder:
        added = len(seeder.seed(page_url(s, j) for s in range(sites) for j in range(due)).added)
    cpu_s = _redis_counters([client])["cpu_s"] - before
    client.close()
    return added, cpu_s


def stat_sum(client: redis.Redis, sites: int, field: str) -> int:
    """A counter of the sites' stats hashes summed over every site (one pipeline)."""
    from streams_sched.frontier.client import Frontier

    f = Frontier(client, CRAWL)
    pipe = client.pipeline(transaction=False)
    for s in range(sites):
        pipe.hget(f.site(f"s{s}.test").stats, field)
    return sum(int(v or 0) for v in pipe.execute())


# --- a run ---------------------------------------------------------------------------------------


def run_worker(kind: str, url: str, sites: int, fetches: int, timeout_s: float) -> dict[str, Any]:
    """One worker process crawls ``fetches`` pages (CLOSESPIDER_ITEMCOUNT) from the gate on."""
    wdir = Path(tempfile.mkdtemp(prefix=f"bench-recrawl-{kind}-"))
    spec = CrawlSpec("streams-sched/bitmap", 1, sites=sites, pages=1, seed="preseed", timeout_s=timeout_s)
    s = worker_settings(spec, url, CRAWL, wdir, 0)
    s.update({
        "DOWNLOAD_HANDLERS": {"http": "bench.recrawl_scale.ScaleHandler"},
        "BENCH_SPIDER": "bench.onepage:OnePageSpider",
        "CONCURRENT_REQUESTS": 256,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "CLOSESPIDER_ITEMCOUNT": fetches,
        "BENCH_GATE_TIMEOUT_SECONDS": timeout_s,
    })
    client = redis.Redis.from_url(url, socket_timeout=None)
    counters = ("promoted", "revisits")
    counted = {k: stat_sum(client, sites, k) for k in counters} if kind == "tracked" else {}
    proc = _launch(spec, s, wdir / "worker0.log", 0)
    try:
        deadline = time.monotonic() + 120
        while not (wdir / "ready0").exists():
            if proc.poll() is not None:
                raise RuntimeError(f"{kind}: the worker exited at start:\n{_tail(wdir / 'worker0.log')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{kind}: the worker did not open within 120 s; logs in {wdir}")
            time.sleep(0.01)
        client.config_resetstat()
        before = _redis_counters([client])
        (wdir / "gate").write_text("go")
        try:
            code = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            raise RuntimeError(f"{kind}: the worker did not finish within {timeout_s:g} s; logs in {wdir}") from None
        after = _redis_counters([client])
        if code != 0:
            raise RuntimeError(f"{kind}: the worker exited with {code}:\n{_tail(wdir / 'worker0.log')}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    path = wdir / "result0.json"
    if not path.exists():
        raise RuntimeError(f"{kind}: the worker wrote no result:\n{_tail(wdir / 'worker0.log')}")
    r = json.loads(path.read_text())
    fetched = max(int(r["items"]), 1)
    calls = {k: v - before["calls"].get(k, 0) for k, v in after["calls"].items()}
    calls = {k: v for k, v in calls.items() if v > 0 and k not in ("config|resetstat", "info")}
    out = {
        "kind": kind,
        "fetched": int(r["items"]),
        "repeats": int(r["repeats"]),
        "reason": r["reason"],
        "elapsed_s": r["t_last_item"] - r["t_go"],
        "fetches_per_s": fetched / max(r["t_last_item"] - r["t_go"], 1e-9),
        "worker_cpu_us_per_fetch": 1e6 * r["cpu_s"] / fetched,
        "redis_cpu_us_per_fetch": 1e6 * (after["cpu_s"] - before["cpu_s"]) / fetched,
        "redis_calls_per_fetch": sum(calls.values()) / fetched,
        "round_trips_per_fetch": sum(r["round_trips"].values()) / fetched,
        "redis_calls": dict(sorted(calls.items(), key=lambda kv: -kv[1])),
        # time inside each command per fetch (a script's includes the commands it calls,
        # which are also counted under their own names)
        "redis_usec_per_fetch": {
            k: (after["usec"][k] - before["usec"].get(k, 0)) / fetched for k in calls if k in after["usec"]
        },
        "log_dir": str(wdir),
    }
    if kind == "tracked":
        # delayed requests moved into the streams, and tracked pages put back for their next
        # visit, during the run: both follow the fetches, not the pages waiting
        out["promoted"] = stat_sum(client, sites, "promoted") - counted["promoted"]
        out["rescheduled"] = stat_sum(client, sites, "revisits") - counted["revisits"]
    client.close()
    return out


# --- the report ----------------------------------------------------------------------------------


def render(res: dict[str, Any]) -> str:
    c = res["config"]
    runs = res["runs"]
    lines = [
        f"Machine: {res['machine']}; load average at start {res['load']}.",
        f"Command: `{c['command']}`",
        "",
        f"### Tracked pages at scale: {c['sites'] * c['pages']:,} tracked pages on {c['sites']:,} sites,"
        f" {c['due']} due per site, {c['fetches']:,} fetches per run, median of {c['rounds']}",
        "",
        f"Tracked frontier built through the real ack path in {res['build']['build_s']:.0f} s"
        f" ({res['build']['waiting_per_site']:.0f} pages waiting per site in a sample;"
        f" `streams-sched revisits` lists all {res['build']['listed_s0']} of s0.test as tracked).",
        "",
        "| frontier | fetches/s | worker CPU µs/fetch | Redis CPU µs/fetch | Redis commands/fetch |"
        " round trips/fetch | promoted/fetch |",
        "|---|---|---|---|---|---|---|",
    ]
    for kind in KINDS:
        rs = [r for r in runs if r["kind"] == kind]
        med = {k: statistics.median(r[k] for r in rs) for k in (
            "fetches_per_s", "worker_cpu_us_per_fetch", "redis_cpu_us_per_fetch", "redis_calls_per_fetch",
            "round_trips_per_fetch")}
        prom = (f"{statistics.median(r['promoted'] / max(r['fetched'], 1) for r in rs):.2f}"
                if kind == "tracked" else "-")
        lines.append(
            f"| {kind} | {med['fetches_per_s']:,.0f} | {med['worker_cpu_us_per_fetch']:,.0f} |"
            f" {med['redis_cpu_us_per_fetch']:,.1f} | {med['redis_calls_per_fetch']:.3f} |"
            f" {med['round_trips_per_fetch']:.3f} | {prom} |")
    lines += ["", "Per-round ratios, tracked against one-off (the target: at most "
              f"{TARGET}x), and the median:", ""]
    names = {"crawl_redis_cpu_us_per_fetch": "redis cpu us per fetch, the one-off's enqueue of the page counted"
             " (a one-off crawl enqueues each page it fetches; a revisit's ack puts it back)"}
    for what in ("worker_cpu_us_per_fetch", "redis_cpu_us_per_fetch", "crawl_redis_cpu_us_per_fetch",
                 "round_trips_per_fetch"):
        ratios = res["ratios"].get(what)
        if not ratios:
            continue
        verdict = "" if what == "round_trips_per_fetch" else (
            "; met" if statistics.median(ratios) <= TARGET else "; NOT met")
        lines.append(f"- {names.get(what, what.replace('_', ' '))}: " + " / ".join(f"{x:.2f}x" for x in ratios)
                     + f", median **{statistics.median(ratios):.2f}x**{verdict}")
    enq = [r["enqueue_redis_cpu_us_per_page"] for r in runs if "enqueue_redis_cpu_us_per_page" in r]
    if enq:
        lines.append(f"- the one-off's enqueue: {statistics.median(enq):,.1f} µs of Redis CPU a page (median)")
    lines += ["", "Where Redis's time per fetch differs most (µs inside each command, medians; EVALSHA"
              " includes the commands its scripts call, which are also counted under their own names):", "",
              "| command | tracked calls/fetch | tracked µs/fetch | one-off calls/fetch | one-off µs/fetch |",
              "|---|---|---|---|---|"]
    med_usec: dict[str, dict[str, float]] = {}
    med_calls: dict[str, dict[str, float]] = {}
    for kind in KINDS:
        rs = [r for r in runs if r["kind"] == kind]
        names = {k for r in rs for k in r["redis_usec_per_fetch"]}
        med_usec[kind] = {k: statistics.median(r["redis_usec_per_fetch"].get(k, 0.0) for r in rs) for k in names}
        med_calls[kind] = {k: statistics.median(r["redis_calls"].get(k, 0) / max(r["fetched"], 1) for r in rs)
                           for k in names}
    names = set(med_usec["tracked"]) | set(med_usec["one-off"])
    top = sorted(names, key=lambda k: -abs(med_usec["tracked"].get(k, 0.0) - med_usec["one-off"].get(k, 0.0)))[:12]
    for k in top:
        lines.append(f"| {k} | {med_calls['tracked'].get(k, 0.0):.2f} | {med_usec['tracked'].get(k, 0.0):.1f} |"
                     f" {med_calls['one-off'].get(k, 0.0):.2f} | {med_usec['one-off'].get(k, 0.0):.1f} |")
    lines += ["", "Every run, in order:", "",
              "| round | frontier | fetched | fetches/s | worker CPU µs/fetch | Redis CPU µs/fetch |"
              " Redis commands/fetch | round trips/fetch | promoted | rescheduled |",
              "|---|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(
            f"| {r['round']} | {r['kind']} | {r['fetched']:,} | {r['fetches_per_s']:,.0f} |"
            f" {r['worker_cpu_us_per_fetch']:,.0f} | {r['redis_cpu_us_per_fetch']:,.1f} |"
            f" {r['redis_calls_per_fetch']:.3f} | {r['round_trips_per_fetch']:.3f} | {r.get('promoted', '-')} |"
            f" {r.get('rescheduled', '-')} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench recrawl-scale", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="20 sites x 50 pages, 5 due each, 60 fetches, 1 round")
    p.add_argument("--sites", type=int, help="sites (default 10,000; quick 20)")
    p.add_argument("--pages", type=int, help="tracked pages per site (default 100; quick 50)")
    p.add_argument("--due", type=int, help="pages of each site due at the start (default 7; quick 5)")
    p.add_argument("--fetches", type=int, help="fetches per run (default 20,000; quick 60)")
    p.add_argument("--rounds", type=int, help="runs of each kind, alternating order (default 3; quick 1)")
    p.add_argument("--one-off-pages", type=int, default=0,
                   help="pages per site of the one-off crawl (default: --pages, the same pages)")
    p.add_argument("--timeout-s", type=float, default=600.0, help="longest a run may take")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    q = a.quick
    a.sites = a.sites or (20 if q else 10_000)
    a.pages = a.pages or (50 if q else 100)
    a.due = a.due or (5 if q else 7)
    a.fetches = a.fetches or (60 if q else 20_000)
    a.rounds = a.rounds or (1 if q else 3)
    if a.due > a.pages:
        p.error(f"--due {a.due} is more than --pages {a.pages}")
    if a.rounds * a.fetches >= a.sites * a.due:
        p.error(f"{a.rounds} rounds of {a.fetches} fetches need more than --due x --sites = {a.sites * a.due}"
                " due pages, so every run has due pages left to its end")
    return a


def main(argv: list[str] | None = None) -> int:
    import os
    import platform

    from streams_sched.testing import RedisServer

    args = parse_args(argv)
    command = "./scripts/bench.sh recrawl-scale " + " ".join(
        shlex.quote(x) for x in (argv if argv is not None else sys.argv[2:]))
    res: dict[str, Any] = {
        "config": {"command": command.strip(), "sites": args.sites, "pages": args.pages, "due": args.due,
                   "fetches": args.fetches, "rounds": args.rounds},
        "machine": f"{os.cpu_count()} cores, Python {platform.python_version()}",
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "runs": [],
    }
    started = time.time()
    with RedisServer() as tracked_server, RedisServer() as one_off_server:
        version = redis.Redis.from_url(tracked_server.url).info("server")["redis_version"]
        res["machine"] += f", Redis {version}"
        say(f"building {args.sites * args.pages:,} tracked pages on {args.sites:,} sites through the ack path")
        res["build"] = build_tracked(tracked_server.url, args.sites, args.pages, args.due)
        say(f"built in {res['build']['build_s']:.0f} s, {res['build']['used_memory'] / 2**20:,.0f} MB used")
        urls = {"tracked": tracked_server.url, "one-off": one_off_server.url}
        for rnd in range(1, args.rounds + 1):
            for kind in KINDS if rnd % 2 else tuple(reversed(KINDS)):
                enqueue_us = 0.0
                if kind == "one-off":
                    added, cpu_s = seed_one_off(one_off_server.url, args.sites, args.one_off_pages or args.pages)
                    enqueue_us = 1e6 * cpu_s / max(added, 1)
                r = run_worker(kind, urls[kind], args.sites, args.fetches, args.timeout_s)
                if kind == "one-off":
                    r["enqueue_redis_cpu_us_per_page"] = enqueue_us
                    r["crawl_redis_cpu_us_per_fetch"] = r["redis_cpu_us_per_fetch"] + enqueue_us
                else:
                    r["crawl_redis_cpu_us_per_fetch"] = r["redis_cpu_us_per_fetch"]
                r["round"] = rnd
                res["runs"].append(r)
                say(f"round {rnd} {kind}: {r['fetched']:,} fetches, {r['fetches_per_s']:,.0f}/s,"
                    f" worker {r['worker_cpu_us_per_fetch']:,.0f} µs, Redis {r['redis_cpu_us_per_fetch']:,.1f} µs,"
                    f" {r['round_trips_per_fetch']:.3f} round trips a fetch"
                    + (f", promoted {r['promoted']:,}" if kind == "tracked" else ""))
    res["ratios"] = {}
    for what in ("worker_cpu_us_per_fetch", "redis_cpu_us_per_fetch", "crawl_redis_cpu_us_per_fetch",
                 "round_trips_per_fetch"):
        res["ratios"][what] = [
            t[what] / o[what] if o[what] else float("nan")
            for t, o in zip([r for r in res["runs"] if r["kind"] == "tracked"],
                            [r for r in res["runs"] if r["kind"] == "one-off"], strict=True)
        ]
    res["elapsed_s"] = time.time() - started
    text = render(res)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"recrawl-scale-{stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / f"recrawl-scale-{stamp}.md").write_text(text)
    say(f"done in {res['elapsed_s']:.0f} s; wrote {args.out}/recrawl-scale-{stamp}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
