"""``python -m bench broad``: a broad crawl, many small sites, and the Redis memory it keeps.

``--sites`` sites (default 10,000) of ``--pages`` pages (default 3) each, every page
linking to pages of its own site and to the same page of the next site; Scrapy
with CONCURRENT_REQUESTS_PER_DOMAIN = 2 and a download latency (``--latency-s``,
default 0.05) from the synthetic download handler. Crawled to the end with:

- Scrapy's in-memory scheduler (one worker),
- scrapy-redis 0.9.1 (one and two workers; SCHEDULER_PERSIST so the queue survives),
- streams-sched with RedisBloom (one and two workers) and, unless ``--quick``,
  with the bitmap back-end (one worker).

Reported per run: pages/s and its ratio to the in-memory scheduler and to
scrapy-redis, Redis CPU per crawled page (INFO cpu before and after), and the
Redis memory the finished crawl keeps, per crawled page and per site: the growth
of ``used_memory`` (INFO memory) from the empty server, and ``MEMORY USAGE`` of
every key, by kind of key. Then the two sizes that do not need a crawl:

- (3) bytes per queued plain GET with a 70-character URL, dedupe included
  (100,000 requests over 100 sites; ``--quick``: 10,000),
- (2) bytes per fingerprint of one big site at error 0.001 (1M and 10M by
  default; ``--quick``: 20,000) on both back-ends, through the same exact-set ->
  Bloom conversion as a crawl (bench/memory.py).

A kind written ``KIND@REV`` (``--kinds streams-sched:1,streams-sched@HEAD~5:1``) runs
streams-sched as it was at git revision REV (bench/revision.py) in the same run, and
the report compares today's KIND with it: Redis CPU, commands and bytes per page,
pages/s, as ratios. List both twice, alternating, to see the noise.

Throwaway redis-servers on free ports only. ``--quick`` (300 sites) takes well
under a minute of crawling.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import redis

from .crawl import CrawlSpec, run_crawl
from .revision import split_kind

RESULTS = Path(__file__).resolve().parent / "results"


def say(text: str) -> None:
    print(f"[bench broad] {text}", file=sys.stderr, flush=True)


def key_kind(key: str) -> str:
    """The kind of a key of the finished crawl, for the memory breakdown."""
    if key.endswith(":dupefilter"):
        return "scrapy-redis dupefilter"
    if key.endswith(":requests"):
        return "scrapy-redis queue"
    if ":seen" in key:
        return "seen filters"
    if ":q:" in key:
        return "streams"
    tail = key.rsplit(":", 1)[-1]
    if tail in ("stats", "policy", "window", "window", "sites", "delayed", "dlq", "nodes", "meta"):
        return "window" if tail == "window" else tail
    return "other"


def memory_by_kind(client: redis.Redis) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"keys": 0, "bytes": 0})
    batch: list[str] = []

    def flush() -> None:
        pipe = client.pipeline(transaction=False)
        for k in batch:
            pipe.memory_usage(k, samples=0)
        for k, n in zip(batch, pipe.execute(), strict=True):
            row = out[key_kind(k)]
            row["keys"] += 1
            row["bytes"] += int(n or 0)
        batch.clear()

    for raw in client.scan_iter(count=1000):
        batch.append(raw.decode() if isinstance(raw, bytes) else raw)
        if len(batch) >= 1000:
            flush()
    if batch:
        flush()
    return dict(out)


def crawl_once(kind: str, workers: int, args: argparse.Namespace, url: str | None) -> dict[str, Any]:
    extra = {
        "CONCURRENT_REQUESTS": args.concurrency,
        "CONCURRENT_REQUESTS_PER_DOMAIN": 2,
        "SYNTH_DELAY_SECONDS": args.latency_s,
        "SYNTH_PAGES": args.pages,
    }
    spec = CrawlSpec(kind, workers, args.sites, args.pages, seed="start", extra=extra, timeout_s=args.timeout_s)
    base = 0
    client = redis.Redis.from_url(url, socket_timeout=None) if url else None  # FLUSHALL may take a while
    if client is not None:
        client.flushall()
        time.sleep(0.2)
        base = int(client.info("memory")["used_memory"])
    res = run_crawl(spec, url, f"broad{workers}")
    if client is not None:
        # a finished crawl: let each site's observed-answer window (feedback.lua) expire,
        # 3 s after its last report
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(
            True for pattern in ("*:window", "*:obs") for _ in client.scan_iter(match=pattern, count=1000)
        ):
            time.sleep(0.2)
        used = int(client.info("memory")["used_memory"]) - base
        by_kind = memory_by_kind(client)
        keys_bytes = sum(v["bytes"] for v in by_kind.values())
        pages = max(res["pages"], 1)
        res.update({
            "used_memory_bytes": used,
            "used_bytes_per_page": used / pages,
            "used_bytes_per_site": used / args.sites,
            "keys_bytes": keys_bytes,
            "keys_bytes_per_page": keys_bytes / pages,
            "keys_bytes_per_site": keys_bytes / args.sites,
            "memory_by_kind": by_kind,
        })
        client.close()
    return res


def queued_bytes(url: str, n: int, sites: int = 100) -> dict[str, Any]:
    """(3) Redis bytes per queued plain GET with a 70-character URL, its dedupe included."""
    import scrapy
    from scrapy.utils.request import RequestFingerprinter

    from streams_sched.connect.clients import connect
    from streams_sched.frontier.bloom import crawl_bloom
    from streams_sched.frontier.client import Frontier
    from streams_sched.frontier.records import Entry
    from streams_sched.wire.codec import RequestCodec

    client = connect(url)
    client.flushall()
    crawl = "queued"
    f = Frontier(client, crawl, crawl_bloom(client, crawl))
    f.ensure_layout()
    f.scripts.load()
    codec = RequestCodec()
    fingerprinter = RequestFingerprinter()
    per_site = n // sites
    time.sleep(0.2)
    before = int(client.info("memory")["used_memory"])
    sample_len = 0
    for s in range(sites):
        host = f"site{s:05d}.example.com"
        items = []
        for i in range(per_site):
            u = f"http://{host}/catalogue/books/item-{i:08d}.htm"
            u = u + "x" * (70 - len(u))
            req = scrapy.Request(u)
            payload = codec.encode(req)
            sample_len = len(u)
            items.append(Entry(fingerprinter.fingerprint(req), 1, 0, payload))
        for i in range(0, len(items), 500):
            f.enqueue(host, items[i : i + 500])  # registers the site in its shard
    after = int(client.info("memory")["used_memory"])
    queued = per_site * sites
    out = {"requests": queued, "sites": sites, "url_chars": sample_len,
           "bytes_per_queued_request": (after - before) / queued}
    client.flushall()
    client.close()
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench broad", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="300 sites, no bitmap run, small size checks: under a minute")
    p.add_argument("--sites", type=int, help="sites (default 10000, quick 300)")
    p.add_argument("--pages", type=int, default=3, help="pages per site (default 3)")
    p.add_argument("--latency-s", type=float, default=0.05, help="download latency per page (default 0.05)")
    p.add_argument("--concurrency", type=int, default=64, help="CONCURRENT_REQUESTS (default 64)")
    p.add_argument("--kinds", help="comma-separated label:workers runs (default memory:1,scrapy-redis:1,"
                   "scrapy-redis:2,streams-sched:1,streams-sched:2 and streams-sched/bitmap:1 unless --quick);"
                   " KIND@REV = streams-sched at git revision REV, compared with today's")
    p.add_argument("--queued", type=int, help="requests for figure (3) (default 100000, quick 10000; 0 = skip)")
    p.add_argument("--fp-sizes", help="fingerprints for figure (2) (default 1e6,1e7, quick 20000; '' = skip)")
    p.add_argument("--timeout-s", type=float, default=1800.0)
    p.add_argument("--out", type=Path, default=RESULTS)
    a = p.parse_args(argv)
    a.sites = a.sites or (300 if a.quick else 10_000)
    default = "memory:1,scrapy-redis:1,scrapy-redis:2,streams-sched:1,streams-sched:2"
    if not a.quick:
        default += ",streams-sched/bitmap:1"
    a.runs = [(k.rpartition(":")[0], int(k.rpartition(":")[2])) for k in (a.kinds or default).split(",")]
    a.queued = (10_000 if a.quick else 100_000) if a.queued is None else a.queued
    sizes = ("20000" if a.quick else "1e6,1e7") if a.fp_sizes is None else a.fp_sizes
    a.fp_sizes = [int(float(x)) for x in sizes.split(",") if x]
    return a


def against_revisions(runs: list[dict[str, Any]]) -> list[str]:
    """For each KIND@REV run (bench/revision.py): today's KIND with as many workers against
    it, medians over the runs of each, as ratios (today / then)."""
    out: list[str] = []
    labels = dict.fromkeys((r["kind"], r["workers"]) for r in runs if split_kind(r["kind"])[1])
    for label, workers in labels:
        base = split_kind(label)[0]
        then = [r for r in runs if r["kind"] == label and r["workers"] == workers]
        now = [r for r in runs if r["kind"] == base and r["workers"] == workers]
        if not now:
            continue
        parts = []
        for key, name, scale, fmt in (("redis_cpu_ms_per_page", "Redis CPU per page", 1000, "{:.1f} µs"),
                                      ("redis_calls_per_page", "Redis commands per page", 1, "{:.1f}"),
                                      ("keys_bytes_per_page", "Redis bytes per page", 1, "{:,.0f} B"),
                                      ("pages_per_s", "pages/s", 1, "{:.0f}")):
            a = [r[key] for r in now if key in r]
            b = [r[key] for r in then if key in r]
            if a and b:
                x, y = statistics.median(a) * scale, statistics.median(b) * scale
                ratio = ("-" if not y else f"{x / y:.2f}x" if x / y >= 0.1 else f"{x / y:.2g}x")
                parts.append(f"{name} {fmt.format(x)} against {fmt.format(y)} ({ratio})")
        out += ["", f"{base} x{workers} today against {label} (medians of {len(now)} and {len(then)} runs):"
                    f" {'; '.join(parts)}"]
    return out


def render(res: dict[str, Any]) -> str:
    cfg = res["config"]
    lines = [
        f"## Broad crawl: {cfg['sites']:,} sites x {cfg['pages']} pages, per-domain concurrency 2,"
        f" {cfg['latency_s'] * 1000:.0f} ms latency, CONCURRENT_REQUESTS {cfg['concurrency']}",
        "",
        f"`{cfg['command']}` (load average at start {res['load']})",
        "",
        "| scheduler | workers | pages/s | vs memory | vs scrapy-redis | Redis CPU µs/page | Redis commands/page |"
        " Redis B/page (used_memory) | B/page (keys) | B/site (keys) | missing | repeats |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    runs = res["runs"]
    mem = next((r for r in runs if r["kind"] == "memory"), None)
    for r in runs:
        sr = next((x for x in runs if x["kind"] == "scrapy-redis" and x["workers"] == r["workers"]), None)
        vs_mem = f"{r['pages_per_s'] / mem['pages_per_s']:.2f}x" if mem else "-"
        vs_sr = f"{r['pages_per_s'] / sr['pages_per_s']:.2f}x" if sr else "-"
        cpu = f"{r['redis_cpu_ms_per_page'] * 1000:.1f}" if "redis_cpu_ms_per_page" in r else "-"
        cmds = f"{r['redis_calls_per_page']:.1f}" if "redis_calls_per_page" in r else "-"
        used = f"{r['used_bytes_per_page']:.0f}" if "used_bytes_per_page" in r else "-"
        keys = f"{r['keys_bytes_per_page']:.0f}" if "keys_bytes_per_page" in r else "-"
        site = f"{r['keys_bytes_per_site']:.0f}" if "keys_bytes_per_site" in r else "-"
        lines.append(f"| {r['kind']} | {r['workers']} | {r['pages_per_s']:.0f} | {vs_mem} | {vs_sr} | {cpu} | {cmds} |"
                     f" {used} | {keys} | {site} | {r['missing']} | {r['repeats']} |")
    lines += against_revisions(runs)
    for r in runs:
        if r.get("memory_by_kind"):
            parts = ", ".join(f"{k} {v['bytes']:,} B in {v['keys']:,} keys"
                              for k, v in sorted(r["memory_by_kind"].items(), key=lambda kv: -kv[1]["bytes"]))
            lines.append(f"\n{r['kind']} x{r['workers']}: {parts}")
    if res.get("queued"):
        q = res["queued"]
        lines += ["", f"(3) queued plain GET, {q['url_chars']}-character URL, {q['requests']:,} over {q['sites']} sites:"
                  f" {q['bytes_per_queued_request']:.0f} bytes each, dedupe included"]
    if res.get("big_site"):
        lines += ["", "(2) one big site, error 0.001: | back-end | fingerprints | bytes/fp (MEMORY USAGE) |"
                  " bytes/fp (used_memory) | measured false positives |", "|---|---|---|---|---|"]
        for m in res["big_site"]:
            lines.append(f"| {m['kind']} | {m['n']:,} | {m['bytes_per_fp']:.2f} | {m['used_bytes_per_fp']:.2f} |"
                         f" {m['false_positive_rate']:.5f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from streams_sched.testing import RedisServer

    from .memory import measure

    started = time.time()
    res: dict[str, Any] = {
        "config": {"command": "./scripts/bench.sh broad " + " ".join(argv if argv is not None else sys.argv[2:]),
                   "sites": args.sites, "pages": args.pages, "latency_s": args.latency_s,
                   "concurrency": args.concurrency},
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "runs": [],
    }
    with RedisServer(bloom=True) as server:
        for kind, workers in args.runs:
            say(f"{kind} x{workers}: {args.sites:,} sites x {args.pages} pages")
            r = crawl_once(kind, workers, args, server.url if split_kind(kind)[0] != "memory" else None)
            say(f"{kind} x{workers}: {r['pages_per_s']:.0f} pages/s, missing {r['missing']},"
                f" Redis {r.get('keys_bytes_per_page', 0):.0f} B/page,"
                f" CPU {r.get('redis_cpu_ms_per_page', 0) * 1000:.1f} µs/page")
            res["runs"].append(r)
        if args.queued:
            say(f"(3) {args.queued:,} queued requests")
            res["queued"] = queued_bytes(server.url, args.queued)
    if args.fp_sizes:
        res["big_site"] = []
        for n in args.fp_sizes:
            for kind in ("bf", "bitmap"):
                say(f"(2) {kind}: {n:,} fingerprints in one site")
                res["big_site"].append(measure(kind, n, min(100_000, n)))
    res["elapsed_s"] = time.time() - started
    text = render(res)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"broad-{stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / f"broad-{stamp}.md").write_text(text)
    say(f"done in {res['elapsed_s']:.0f} s; wrote {args.out}/broad-{stamp}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
