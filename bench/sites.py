"""``python -m bench sites``: N sites of one page each, a CPU-bound crawl cut after a time window.

Each ``--sites`` value N (default 10,000, 100,000 and 1,000,000; one row each) is a
web of N sites with one page each and no links (bench/onepage.py: site ``i`` is
``http://s{i}.test/``), so the crawl is exactly N pages. Downloads cost nothing
(no network, no latency); CONCURRENT_REQUESTS 256 (``--concurrency``),
CONCURRENT_REQUESTS_PER_DOMAIN 2. The kinds (``--kinds``):

- ``memory``: Scrapy's in-memory scheduler, the N URLs yielded by the spider's
  ``start()``;
- ``scrapy-redis``: scrapy-redis 0.9.1 seeded its usual way, a list of JSON start
  URLs (``LPUSH``, pipelined, timed) that a RedisSpider reads in batches
  (bench/onepage_redis.py); SCHEDULER_PERSIST, and MAX_IDLE_TIME_BEFORE_CLOSE 2 s
  so a worker whose list ran dry closes;
- ``streams-sched`` (and ``streams-sched/bitmap``): the N URLs pushed with
  ``streams-sched push --file`` (the CLI, in its own process), timed; also, on an
  emptied Redis, through ``streams_sched.Seeder`` (bench/sites_seed.py), timed
  around ``seed()``. Then one worker crawls; then (unless
  ``--no-two-workers``) the URLs are pushed again to an emptied Redis and two
  workers (separate processes) crawl.

A worker crawls for ``--window-s`` seconds (default 60) and is then stopped
(SIGINT: Scrapy's graceful shutdown). The window starts at the first item (of
any worker), so process start-up, the spider's opening and the way to the first
page are left out (the time from the start gate to the first item is reported
as start-up); pages/s is the items of the window over its length. When every
page is crawled before the window ends, the window ends at the last item (such
a run is marked "all" in the tables). Also reported per run: the rate from the
start gate instead, the worker's max RSS (its own VmHWM, read by the probe at the end),
Redis CPU per page (INFO cpu, used_cpu_sys + used_cpu_user, read when the first
item comes and when the window ends, or when the workers exit if they finished
first), Redis commands per page, pages crawled twice. Per row: Redis
``used_memory`` per site with one queued URL, right after the push and before
any crawl (the difference over the push, divided by N), and the push rate:
URLs / wall time of the whole ``streams-sched push`` command, and net of its
start-up (the wall time of the same command with an empty file taken off).

A kind written ``KIND@REV`` (``--kinds streams-sched,streams-sched@HEAD~5``) runs
streams-sched as it was at git revision REV (bench/revision.py): its workers,
its ``streams-sched push`` and its Seeder import that revision's streams_sched;
the report compares today's KIND with it per row.

With ``--rounds R`` every kind runs R times in a row, the kinds in their order in odd
rounds and in reverse in even ones, so no kind always runs first (on these shared
machines the first run of a row is often the slow one). The tables then give, per kind,
the run with the median pages/s, and a table of the rounds shows every one.

After the rows (unless ``--no-reference``), each streams-sched kind crawls bench (a)'s
10 sites x 2,000 pages on the same Redis, and the report gives each row's Redis CPU per
page against that deep crawl's (the bound is 2x).

Throwaway redis-servers on free ports only. ``--quick``: 1,000 sites, 10 s
windows. A 1,000,000-site row needs several GB of Redis memory and a few
minutes per kind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from .crawl import KINDS, CrawlSpec, _launch, _redis_counters, _tail, python_for, worker_settings
from .onepage import site_url
from .revision import split_kind

RESULTS = Path(__file__).resolve().parent / "results"
#: the push rate the CLI should reach
PUSH_TARGET = 50_000
#: the deep crawl (sites, pages per site) Redis CPU per page is compared with, and the
#: most a page of a crawl of many one-page sites may cost against it
DEEP = (10, 2000)
DEEP_CPU_BOUND = 2.0


def say(text: str) -> None:
    print(f"[bench sites] {text}", file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench sites", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true",
                   help="1,000 sites, 10 s windows, a deep reference of 60 pages per site: about half a minute")
    p.add_argument("--sites", help="comma-separated site counts, one row each (default 10000,100000,1000000; quick 1000)")
    p.add_argument("--window-s", type=float, help="crawl window per run, from its first item (default 60, quick 10)")
    p.add_argument("--kinds", default="memory,scrapy-redis,streams-sched",
                   help="comma-separated kinds (default memory,scrapy-redis,streams-sched); KIND@REV = that"
                        " kind with streams_sched from git revision REV, compared with today's")
    p.add_argument("--two-workers", action=argparse.BooleanOptionalAction, default=True,
                   help="also crawl with two streams-sched workers (default: yes)")
    p.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                   help="also crawl 10 sites x 2,000 pages with each streams-sched kind on the same Redis,"
                        " for Redis CPU per page against a deep crawl (default: yes)")
    p.add_argument("--rounds", type=int, default=1,
                   help="runs of every kind per row, in alternating order; the tables give each kind's median (default 1)")
    p.add_argument("--concurrency", type=int, default=256, help="CONCURRENT_REQUESTS (default 256)")
    p.add_argument("--per-domain", type=int, default=2, help="CONCURRENT_REQUESTS_PER_DOMAIN (default 2)")
    p.add_argument("--timeout-s", type=float, default=600.0,
                   help="longest wait for a first item, and for workers to stop after the window")
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    a.sites = [int(float(x)) for x in (a.sites or ("1000" if a.quick else "10000,100000,1000000")).split(",")]
    a.window_s = a.window_s or (10.0 if a.quick else 60.0)
    a.deep = (DEEP[0], 60) if a.quick else DEEP
    a.kinds = a.kinds.split(",")
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: at least 1")
    for kind in a.kinds:
        base = split_kind(kind)[0]
        if base not in KINDS:
            p.error(f"unknown kind {kind!r} (one of {', '.join(KINDS)}, optionally @REV)")
        if split_kind(kind)[1] and not base.startswith("streams-sched"):
            p.error(f"{kind!r}: only streams-sched kinds can run at a revision")
    return a


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def empty(client: redis.Redis) -> None:
    client.flushall()
    client.script_flush()


# --- seeding -----------------------------------------------------------------------------------


def _python(kind: str, args: list[str], what: str) -> str:
    """Run ``python -m ...`` with the streams_sched of ``kind``; its stdout."""
    cwd, env = python_for(kind)
    proc = subprocess.run([sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{what} ({kind}) exited with {proc.returncode}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def _dedupe(kind: str) -> str:
    return str(KINDS[split_kind(kind)[0]].get("STREAMS_DEDUPE", "auto"))


def prepare(kind: str, url: str, crawl: str) -> None:
    _python(kind, ["bench.sites_seed", "prepare", url, crawl, _dedupe(kind)], "bench.sites_seed prepare")


def cli_push(kind: str, url: str, crawl: str, path: Path) -> tuple[int, float]:
    """``streams-sched push --file PATH`` (its own process, like an operator's): URLs added, wall seconds."""
    t = time.perf_counter()
    out = _python(kind, ["streams_sched.cli", "push", "--redis-url", url, "--crawl", crawl, "--file", str(path)],
                  "streams-sched push")
    wall = time.perf_counter() - t
    m = re.search(r"pushed (\d+) request", out)
    if m is None:
        raise RuntimeError(f"streams-sched push said {out!r}")
    return int(m.group(1)), wall


def net_rate(n: int, wall: float, startup: float) -> float | None:
    """n / (wall - startup), or None where the start-up is most of the wall time: the two
    are timed in separate runs, and their difference is then mostly noise."""
    net = wall - startup
    return n / net if net > 0.25 * wall else None


def net_text(rate: float | None) -> str:
    return f"{rate:,.0f}" if rate is not None else "-"


def push_streams(kind: str, client: redis.Redis, url: str, crawl: str, urls: Path, nothing: Path, n: int) -> dict[str, Any]:
    """Empty Redis, push the N URLs with the CLI: rate and Redis bytes per queued site."""
    empty(client)
    prepare(kind, url, crawl)
    # the command's fixed cost (interpreter, imports, connection, scripts): an empty push
    _, startup = cli_push(kind, url, crawl, nothing)
    before = used_memory(client)
    added, wall = cli_push(kind, url, crawl, urls)
    after = used_memory(client)
    if added != n:
        raise RuntimeError(f"streams-sched push added {added} of {n} URLs")
    return {"urls": n, "wall_s": wall, "startup_s": startup, "urls_per_s": n / wall, "net_urls_per_s": net_rate(n, wall, startup),
            "used_memory_bytes": after - before, "bytes_per_site": (after - before) / n}


def seeder_api(kind: str, client: redis.Redis, url: str, crawl: str, urls: Path, n: int) -> dict[str, Any]:
    """Empty Redis, seed the N URLs through ``streams_sched.Seeder`` (timed around seed())."""
    empty(client)
    before = used_memory(client)
    out = json.loads(_python(kind, ["bench.sites_seed", "api", url, crawl, _dedupe(kind), str(urls)], "Seeder"))
    after = used_memory(client)
    if out["added"] != n:
        raise RuntimeError(f"Seeder added {out['added']} of {n} URLs")
    # the difference includes the scripts the Seeder loaded: a bound, not the figure of the table
    return {**out, "urls_per_s": n / max(out["seed_s"], 1e-9), "used_memory_bytes": after - before}


def push_scrapy_redis(client: redis.Redis, key: str, n: int) -> dict[str, Any]:
    """scrapy-redis's start URLs: LPUSH of ``{"url": ...}`` JSON, 1,000 a command, 10 commands a pipeline."""
    empty(client)
    before = used_memory(client)
    t = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for start in range(0, n, 1000):
        pipe.lpush(key, *[json.dumps({"url": site_url(i)}) for i in range(start, min(start + 1000, n))])
        if len(pipe) >= 10:
            pipe.execute()
    pipe.execute()
    wall = time.perf_counter() - t
    after = used_memory(client)
    return {"urls": n, "wall_s": wall, "urls_per_s": n / wall,
            "used_memory_bytes": after - before, "bytes_per_site": (after - before) / n}


# --- a crawl window ------------------------------------------------------------------------------


class Child:
    """A worker process, reaped with ``os.wait4`` so its max RSS is known (Popen.poll would lose it)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.code: int | None = None
        self.max_rss_kb = 0

    def poll(self) -> int | None:
        if self.code is None:
            pid, status, usage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                self.code = os.waitstatus_to_exitcode(status)
                self.max_rss_kb = usage.ru_maxrss  # KiB on Linux
                self.proc.returncode = self.code
        return self.code

    def wait(self, timeout_s: float) -> int | None:
        deadline = time.monotonic() + timeout_s
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.code


def crawl_window(kind: str, workers: int, n: int, redis_url: str | None, client: redis.Redis | None,
                 crawl: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start the workers, open the gate, crawl for the window from the first item, stop them."""
    base = split_kind(kind)[0]
    wdir = Path(tempfile.mkdtemp(prefix=f"bench-sites-{kind.replace('/', '-')}-"))
    spec = CrawlSpec(kind, workers, sites=n, pages=1, seed="start" if base == "memory" else "preseed",
                     timeout_s=args.timeout_s)
    settings = []
    for i in range(workers):
        s = worker_settings(spec, redis_url, crawl, wdir, i)
        s.update({
            "DOWNLOAD_HANDLERS": {"http": "bench.onepage.OnePageHandler"},
            "BENCH_SPIDER": "bench.onepage_redis:OnePageRedisSpider" if base == "scrapy-redis"
            else "bench.onepage:OnePageSpider",
            "CONCURRENT_REQUESTS": args.concurrency,
            "CONCURRENT_REQUESTS_PER_DOMAIN": args.per_domain,
            "BENCH_FIRST_FILE": str(wdir / f"first{i}"),
            "BENCH_ITEM_TIMES": True,
            "BENCH_GATE_TIMEOUT_SECONDS": args.timeout_s,
        })
        if base == "scrapy-redis":
            s["REDIS_START_URLS_KEY"] = f"{crawl}:start_urls"
            s["MAX_IDLE_TIME_BEFORE_CLOSE"] = 2
        settings.append(s)
    children = [Child(_launch(spec, s, wdir / f"worker{i}.log", i)) for i, s in enumerate(settings)]
    servers = [client] if client is not None else []

    def failed(what: str) -> RuntimeError:
        logs = "\n".join(f"worker {i}:\n{_tail(wdir / f'worker{i}.log')}" for i in range(workers))
        return RuntimeError(f"{kind} x{workers}: {what}; logs in {wdir}\n{logs}")

    try:
        deadline = time.monotonic() + 120
        while not all((wdir / f"ready{i}").exists() for i in range(workers)):
            if any(c.poll() is not None for c in children):
                raise failed("a worker exited at start")
            if time.monotonic() > deadline:
                raise failed("the workers did not open within 120 s")
            time.sleep(0.01)
        for server in servers:
            server.config_resetstat()
        (wdir / "gate").write_text("go")
        deadline = time.monotonic() + args.timeout_s
        firsts = [wdir / f"first{i}" for i in range(workers)]
        while not any(f.exists() for f in firsts):
            if all(c.poll() is not None for c in children):
                raise failed("the workers exited without an item")
            if time.monotonic() > deadline:
                raise failed(f"no item within {args.timeout_s:g} s of the start gate")
            time.sleep(0.005)
        before = _redis_counters(servers) if servers else None
        t_first = min(float(f.read_text()) for f in firsts if f.exists())
        while time.time() < t_first + args.window_s and not all(c.poll() is not None for c in children):
            time.sleep(0.01)
        after = _redis_counters(servers) if servers else None
        for c in children:
            if c.poll() is None:
                c.proc.send_signal(signal.SIGINT)  # Scrapy's graceful shutdown: the probe writes its result
        for i, c in enumerate(children):
            if c.wait(args.timeout_s) is None:
                raise failed(f"worker {i} did not stop within {args.timeout_s:g} s of SIGINT")
            if c.code != 0:
                raise failed(f"worker {i} exited with {c.code}")
    finally:
        for c in children:
            if c.poll() is None:
                c.proc.kill()
                c.wait(30)
    results = []
    for i in range(workers):
        path = wdir / f"result{i}.json"
        if not path.exists():
            raise failed(f"worker {i} wrote no result")
        results.append(json.loads(path.read_text()))
    # the worker's own peak (VmHWM); wait4's ru_maxrss starts from this harness's RSS at the
    # fork (Linux carries it across exec), which at 1,000,000 sites is larger than a worker's
    rss_kb = [r.get("peak_rss_kb") or c.max_rss_kb for r, c in zip(results, children, strict=True)]
    return summarize(kind, workers, n, args.window_s, results, rss_kb, before, after, wdir)


def summarize(kind: str, workers: int, n: int, window_s: float, results: list[dict[str, Any]], rss_kb: list[int],
              before: dict[str, Any] | None, after: dict[str, Any] | None, wdir: Path) -> dict[str, Any]:
    times = sorted(r["t_go"] + ms / 1000 for r in results for ms in r["item_ms"])
    t_gate = min(r["t_go"] for r in results)
    t0 = times[0]
    counts: dict[str, int] = {}
    for r in results:
        for url in r["urls"]:
            counts[url] = counts.get(url, 0) + 1
    # every page crawled inside the window: the window ends at the last item
    complete = len(counts) == n and times[-1] <= t0 + window_s
    length = (times[-1] - t0) if complete else window_s
    pages = sum(1 for t in times if t <= t0 + length)
    gate_length = (times[-1] - t_gate) if complete else window_s
    out: dict[str, Any] = {
        "kind": kind,
        "workers": workers,
        "sites": n,
        "pages": pages,
        "complete": complete,
        "window_s": length,
        "pages_per_s": pages / max(length, 1e-9),
        # the same, with the window from the start gate: start-up included
        "pages_per_s_from_gate": sum(1 for t in times if t <= t_gate + gate_length) / max(gate_length, 1e-9),
        "startup_s": t0 - t_gate,
        "pages_all": len(times),
        "repeats": sum(r["repeats"] for r in results) + sum(c - 1 for c in counts.values()),
        "per_worker_pages": [sum(1 for ms in r["item_ms"] if r["t_go"] + ms / 1000 <= t0 + length) for r in results],
        "max_rss_mb": [kb / 1024 for kb in rss_kb],
        # CPU of the workers from the start gate to their last item, over every item they had
        "worker_cpu_ms_per_page": 1000 * sum(r["cpu_s"] for r in results) / max(len(times), 1),
        # the part of it spent in the garbage collector, and the collections per generation
        "worker_gc_ms_per_page": 1000 * sum(r["gc_s"] for r in results) / max(len(times), 1),
        "gc_collections": [sum(per_gen) for per_gen in zip(*(r["gc_collections"] for r in results), strict=True)],
        "streams_sched_from": results[0].get("streams_sched_from"),
        "log_dir": str(wdir),
    }
    if before is not None and after is not None:
        calls = {k: v - before["calls"].get(k, 0) for k, v in after["calls"].items()}
        calls = {k: v for k, v in calls.items() if v > 0 and k not in ("config|resetstat", "info")}
        out["redis_cpu_us_per_page"] = 1e6 * (after["cpu_s"] - before["cpu_s"]) / max(pages, 1)
        out["redis_calls_per_page"] = sum(calls.values()) / max(pages, 1)
        out["redis_calls"] = dict(sorted(calls.items(), key=lambda kv: -kv[1]))
    return out


# --- one row -----------------------------------------------------------------------------------


def report_run(r: dict[str, Any]) -> dict[str, Any]:
    say(f"{r['sites']:,} sites: {r['kind']} x{r['workers']}: {r['pages_per_s']:,.0f} pages/s over {r['window_s']:.1f} s"
        f" ({r['pages']:,} pages{', all' if r['complete'] else ''}), start-up {r['startup_s']:.1f} s,"
        f" max RSS {max(r['max_rss_mb']):,.0f} MB, repeats {r['repeats']}"
        + (f", Redis {r['redis_cpu_us_per_page']:.0f} µs/page" if "redis_cpu_us_per_page" in r else ""))
    return r


def run_row(n: int, args: argparse.Namespace, server_url: str, tmp: Path) -> dict[str, Any]:
    urls = tmp / f"urls-{n}.txt"
    urls.write_text("".join(f"{site_url(i)}\n" for i in range(n)))
    nothing = tmp / "no-urls.txt"
    nothing.write_text("")
    # no socket timeout: FLUSHALL of a million sites takes longer than redis-py's default 5 s
    client = redis.Redis.from_url(server_url, socket_timeout=None)
    crawl = "sites"
    row: dict[str, Any] = {"sites": n, "runs": [], "push": {}, "seeder": {}}
    seeders: dict[str, list[dict[str, Any]]] = {}
    for rnd in range(1, args.rounds + 1):
        for kind in round_order(args.kinds, rnd):
            runs = len(row["runs"])
            run_kind(row, seeders, kind, n, args, server_url, client, crawl, urls, nothing)
            for r in row["runs"][runs:]:
                r["round"] = rnd
    # the Seeder of the median rate stands for its kind; every call is kept
    row["seeder"] = {kind: median_by(calls, "urls_per_s") for kind, calls in seeders.items()}
    row["seeder_calls"] = seeders
    client.flushall()
    client.close()
    urls.unlink()
    return row


def round_order(kinds: list[str], rnd: int) -> list[str]:
    """The kinds in their order in odd rounds, in reverse in even ones."""
    return list(kinds) if rnd % 2 else list(reversed(kinds))


def median_by(items: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The item with the median ``key`` (the lower of the two middle ones for an even count)."""
    ranked = sorted(items, key=lambda x: x[key])
    return ranked[(len(ranked) - 1) // 2]


def run_kind(
    row: dict[str, Any], seeders: dict[str, list[dict[str, Any]]], kind: str, n: int, args: argparse.Namespace,
    server_url: str, client: redis.Redis, crawl: str, urls: Path, nothing: Path,
) -> None:
    """One kind's runs of one round: seeding, then one worker (and two, for streams-sched)."""
    base = split_kind(kind)[0]
    if base == "memory":
        say(f"{n:,} sites: {kind}, one worker")
        row["runs"].append(report_run(crawl_window(kind, 1, n, None, None, crawl, args)))
    elif base == "scrapy-redis":
        push = push_scrapy_redis(client, f"{crawl}:start_urls", n)
        row["push"].setdefault(kind, []).append(push)
        say(f"{n:,} sites: {kind}: LPUSH {push['urls_per_s']:,.0f} URLs/s, {push['bytes_per_site']:.0f} B/site;"
            " one worker")
        row["runs"].append(report_run(crawl_window(kind, 1, n, server_url, client, crawl, args)))
    else:
        api = seeder_api(kind, client, server_url, crawl, urls, n)
        seeders.setdefault(kind, []).append(api)
        say(f"{n:,} sites: {kind}: Seeder.seed() {api['urls_per_s']:,.0f} URLs/s")
        for workers in (1, 2) if args.two_workers else (1,):
            push = push_streams(kind, client, server_url, crawl, urls, nothing, n)
            row["push"].setdefault(kind, []).append(push)
            say(f"{n:,} sites: {kind}: push {push['urls_per_s']:,.0f} URLs/s ({net_text(push['net_urls_per_s'])} net"
                f" of {push['startup_s']:.1f} s start-up), {push['bytes_per_site']:,.0f} B/site;"
                f" {'one worker' if workers == 1 else 'two workers'}")
            row["runs"].append(report_run(crawl_window(kind, workers, n, server_url, client, crawl, args)))


# --- report ------------------------------------------------------------------------------------


def _runs(row: dict[str, Any], kind: str, workers: int = 1) -> list[dict[str, Any]]:
    return [r for r in row["runs"] if r["kind"] == kind and r["workers"] == workers]


def _run(row: dict[str, Any], kind: str, workers: int = 1) -> dict[str, Any] | None:
    """The run of ``kind`` with ``workers`` (of several rounds, the one with the median pages/s)."""
    runs = _runs(row, kind, workers)
    return median_by(runs, "pages_per_s") if runs else None


def _rate(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    return f"{r['pages_per_s']:,.0f}" + (" (all)" if r["complete"] else "")


def _pps(r: dict[str, Any] | None) -> float | None:
    return r["pages_per_s"] if r else None


def _rss(r: dict[str, Any] | None) -> str:
    return f"{max(r['max_rss_mb']):,.0f}" if r else "-"


def _gc(r: dict[str, Any]) -> str:
    return f"{r['worker_gc_ms_per_page']:.3f} ({' / '.join(f'{n:,}' for n in r['gc_collections'])})"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else (xs[mid - 1] + xs[mid]) / 2


def render(res: dict[str, Any]) -> str:
    cfg = res["config"]
    kinds = cfg["kinds"]
    streams = [k for k in kinds if split_kind(k)[0].startswith("streams-sched")]
    main = "streams-sched" if "streams-sched" in kinds else (streams[0] if streams else None)
    lines = [
        f"## One-page sites: a CPU-bound crawl, {cfg['window_s']:g} s windows, CONCURRENT_REQUESTS"
        f" {cfg['concurrency']}, per domain {cfg['per_domain']}, no download latency",
        "",
        f"`{cfg['command']}` (load average at start {res['load']}; {res['machine'].get('cores')} cores)",
        "",
        f"pages/s: the items of a {cfg['window_s']:g} s window from each run's first item (start-up left out);"
        " (all) = every page crawled before the window ended, the window ends at the last item."
        f" Columns after the pages/s are for {main}; push URLs/s is the whole `streams-sched push` command"
        " (its start-up included), and the Seeder's seed() call.",
        "",
        "| sites | Scrapy in-memory pages/s | streams-sched pages/s | ratio | 2 workers / 1 | scrapy-redis pages/s |"
        " vs scrapy-redis | worker max RSS (in-mem / streams) | Redis B per queued site | Redis CPU µs/page |"
        " push URLs/s (CLI / Seeder) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in res["rows"]:
        mem, sr = _run(row, "memory"), _run(row, "scrapy-redis")
        ss = _run(row, main) if main else None
        ss2 = _run(row, main, 2) if main else None
        pushes = row["push"].get(main, []) if main else []
        api = row["seeder"].get(main) if main else None
        cells = [
            f"{row['sites']:,}", _rate(mem), _rate(ss), _ratio(_pps(ss), _pps(mem)), _ratio(_pps(ss2), _pps(ss)),
            _rate(sr), _ratio(_pps(ss), _pps(sr)),
            f"{_rss(mem)} / {_rss(ss)} MB",
            f"{pushes[0]['bytes_per_site']:,.0f}" if pushes else "-",
            f"{ss['redis_cpu_us_per_page']:.0f}" if ss and "redis_cpu_us_per_page" in ss else "-",
            (f"{_median([p['urls_per_s'] for p in pushes]):,.0f}" if pushes else "-")
            + " / " + (f"{api['urls_per_s']:,.0f}" if api else "-"),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "Every run:", "",
              "| sites | kind | workers | pages/s | pages/s from the gate | start-up s | pages in window |"
              " max RSS MB | worker CPU ms/page | of it in GC (collections gen 0 / 1 / 2) | Redis CPU µs/page |"
              " Redis commands/page | repeats |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in res["rows"]:
        for r in row["runs"]:
            cpu = f"{r['redis_cpu_us_per_page']:.0f}" if "redis_cpu_us_per_page" in r else "-"
            cmds = f"{r['redis_calls_per_page']:.2f}" if "redis_calls_per_page" in r else "-"
            kind = r["kind"] + (f" (round {r['round']})" if cfg["rounds"] > 1 else "")
            lines.append(
                f"| {row['sites']:,} | {kind} | {r['workers']} | {_rate(r)} | {r['pages_per_s_from_gate']:,.0f} |"
                f" {r['startup_s']:.1f} | {r['pages']:,} | {' + '.join(f'{m:,.0f}' for m in r['max_rss_mb'])} |"
                f" {r['worker_cpu_ms_per_page']:.2f} | {_gc(r)} | {cpu} | {cmds} | {r['repeats']} |")
    lines += ["", "Seeding (Redis used_memory right after it, before any crawl):", "",
              "| sites | kind | how | URLs/s | net of start-up | Redis B per queued site |", "|---|---|---|---|---|---|"]
    for row in res["rows"]:
        for kind, pushes in row["push"].items():
            for p in pushes:
                how = "LPUSH start URLs" if split_kind(kind)[0] == "scrapy-redis" else "streams-sched push"
                net = f"{net_text(p['net_urls_per_s'])} ({p['startup_s']:.1f} s start-up)" if "net_urls_per_s" in p else "-"
                lines.append(f"| {row['sites']:,} | {kind} | {how} | {p['urls_per_s']:,.0f} | {net} |"
                             f" {p['bytes_per_site']:,.1f} |")
        for kind, calls in row["seeder_calls"].items():
            for api in calls:
                lines.append(f"| {row['sites']:,} | {kind} | Seeder.seed() | {api['urls_per_s']:,.0f} | - | - |")
    for row in res["rows"]:
        pushes = row["push"].get(main, []) if main else []
        if pushes:
            rate = _median([p["urls_per_s"] for p in pushes])
            lines.append(f"\n{row['sites']:,} sites: `streams-sched push` {rate:,.0f} URLs/s against a target of"
                         f" {PUSH_TARGET:,}: {'met' if rate >= PUSH_TARGET else 'not met'}")
    lines += against_deep(res, main)
    lines += against_revisions(res)
    lines += by_round(res)
    return "\n".join(lines)


def by_round(res: dict[str, Any]) -> list[str]:
    """With several rounds: each kind's pages/s in every round, its median, and the median's
    ratio to the in-memory scheduler's median in the same row."""
    if res["config"]["rounds"] < 2:
        return []
    out = ["", f"Rounds (every kind ran {res['config']['rounds']} times per row, in alternating order; the"
           " tables above give the median run):", "",
           "| sites | kind | workers | pages/s by round | median | against the in-memory median | worker CPU ms/page by round |",
           "|---|---|---|---|---|---|---|"]
    for row in res["rows"]:
        mem = _run(row, "memory")
        for kind in res["config"]["kinds"]:
            for workers in (1, 2):
                runs = sorted(_runs(row, kind, workers), key=lambda r: r["round"])
                if not runs:
                    continue
                med = _run(row, kind, workers)
                cpu = " / ".join(f"{r['worker_cpu_ms_per_page']:.2f}" for r in runs)
                out.append(
                    f"| {row['sites']:,} | {kind} | {workers} | {' / '.join(_rate(r) for r in runs)} | {_rate(med)} |"
                    f" {_ratio(_pps(med), _pps(mem)) if workers == 1 else '-'} |"
                    f" {cpu} |")
    return out


def against_revisions(res: dict[str, Any]) -> list[str]:
    """Each KIND@REV against today's KIND, per row, as ratios (today / then)."""
    out: list[str] = []
    for label in res["config"]["kinds"]:
        base, rev = split_kind(label)
        if not rev or base not in res["config"]["kinds"]:
            continue
        for row in res["rows"]:
            parts = []
            for workers in (1, 2):
                now, then = _run(row, base, workers), _run(row, label, workers)
                if now and then:
                    parts.append(f"pages/s x{workers} {now['pages_per_s']:,.0f} against {then['pages_per_s']:,.0f}"
                                 f" ({_ratio(now['pages_per_s'], then['pages_per_s'])})")
                    if workers == 1:
                        if "redis_cpu_us_per_page" in now and "redis_cpu_us_per_page" in then:
                            parts.append(f"Redis CPU {now['redis_cpu_us_per_page']:.0f} against"
                                         f" {then['redis_cpu_us_per_page']:.0f} µs/page"
                                         f" ({_ratio(now['redis_cpu_us_per_page'], then['redis_cpu_us_per_page'])})")
                        parts.append(f"max RSS {max(now['max_rss_mb']):,.0f} against {max(then['max_rss_mb']):,.0f} MB")
            a, b = row["push"].get(base), row["push"].get(label)
            if a and b:
                x, y = a[0]["bytes_per_site"], b[0]["bytes_per_site"]
                parts.append(f"Redis {x:,.0f} against {y:,.0f} B per queued site ({_ratio(x, y)})")
                x, y = _median([p["urls_per_s"] for p in a]), _median([p["urls_per_s"] for p in b])
                parts.append(f"push {x:,.0f} against {y:,.0f} URLs/s ({_ratio(x, y)})")
            a2, b2 = row["seeder"].get(base), row["seeder"].get(label)
            if a2 and b2:
                parts.append(f"Seeder {a2['urls_per_s']:,.0f} against {b2['urls_per_s']:,.0f} URLs/s"
                             f" ({_ratio(a2['urls_per_s'], b2['urls_per_s'])})")
            if parts:
                out += ["", f"{row['sites']:,} sites, {base} today against {label}: {'; '.join(parts)}"]
    return out


def deep_reference(kinds: list[str], server_url: str, deep: tuple[int, int]) -> dict[str, dict[str, float]]:
    """Each streams-sched kind on bench (a)'s crawl, ``deep`` = (sites, pages per site): 10 x
    2,000, or 10 x 60 with --quick; one worker, on the same Redis. Its Redis CPU per page
    is the figure a crawl of many sites is held to."""
    from .crawl import CrawlSpec, run_crawl

    out: dict[str, dict[str, float]] = {}
    for kind in kinds:
        if not split_kind(kind)[0].startswith("streams-sched"):
            continue
        r = run_crawl(CrawlSpec(kind, 1, *deep), server_url, "deep")
        if r["missing"]:
            raise RuntimeError(f"the deep reference crawl ({kind}) missed {r['missing']} pages")
        out[kind] = {"pages_per_s": r["pages_per_s"], "redis_cpu_us_per_page": 1000 * r["redis_cpu_ms_per_page"]}
        say(f"deep reference {deep[0]} sites x {deep[1]:,} pages: {kind}: {r['pages_per_s']:,.0f} pages/s,"
            f" Redis {out[kind]['redis_cpu_us_per_page']:.0f} µs/page")
    return out


def against_deep(res: dict[str, Any], main: str | None) -> list[str]:
    """Redis CPU per page of each row against the deep crawl of the same run."""
    ref = res.get("reference", {}).get(main) if main else None
    if not ref:
        return []
    deep = res["config"]["deep"]
    out = ["", f"Redis CPU per page against {deep[0]} sites x {deep[1]:,} pages in the same run ({main}, one worker,"
           f" {ref['redis_cpu_us_per_page']:.0f} µs/page; the bound is {DEEP_CPU_BOUND:g}x):", ""]
    for row in res["rows"]:
        ss = _run(row, main)
        if ss and "redis_cpu_us_per_page" in ss:
            x = ss["redis_cpu_us_per_page"] / ref["redis_cpu_us_per_page"]
            out.append(f"- {row['sites']:,} sites: {ss['redis_cpu_us_per_page']:.0f} µs/page, {x:.2f}x:"
                       f" {'met' if x <= DEEP_CPU_BOUND else 'not met'}")
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from streams_sched.testing import RedisServer

    from .__main__ import machine

    started = time.time()
    given = argv if argv is not None else sys.argv[2:]
    res: dict[str, Any] = {
        "config": {"command": "./scripts/bench.sh sites " + " ".join(shlex.quote(a) for a in given),
                   "sites": args.sites, "window_s": args.window_s, "kinds": args.kinds,
                   "two_workers": args.two_workers, "rounds": args.rounds, "deep": args.deep, "concurrency": args.concurrency, "per_domain": args.per_domain},
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "rows": [],
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench-sites-"))
    with RedisServer(bloom=True) as server:
        res["machine"] = machine(server.url)
        for n in args.sites:
            res["rows"].append(run_row(n, args, server.url, tmp))
        if args.reference:
            res["reference"] = deep_reference(args.kinds, server.url, args.deep)
    res["elapsed_s"] = time.time() - started
    text = render(res)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"sites-{stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / f"sites-{stamp}.md").write_text(text)
    say(f"done in {res['elapsed_s']:.0f} s; wrote {args.out}/sites-{stamp}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
