"""``python -m bench``: every benchmark side by side in one run.

(a) one worker crawling the synthetic web: Scrapy's in-memory scheduler,
    scrapy-redis 0.9.1 and streams-sched;
(b) two workers on one crawl: scrapy-redis and streams-sched;
(c) raw frontier operations per second;
(d) Redis memory per seen fingerprint;
(e) codec cost per request;
(f) Redis round trips per crawled page (counted during (a) and (b)).

``python -m bench broad`` runs the broad-crawl benchmark on its own (bench/broad.py:
many small sites; ``--quick``, ``--sites``). ``python -m bench replicas`` measures
what holding acks until a replica has the follow-ups costs (bench/replicas.py).
``python -m bench sites`` crawls N sites of one page each for a time window, CPU-bound,
and measures the push and the Redis memory per queued site (bench/sites.py).
``python -m bench pick`` times the reactor thread per request against the number of
ready sites, without Redis (bench/pick.py; ``--rev REV`` to compare with a revision).
``python -m bench push`` measures how fast ``Seeder.seed()`` and ``streams-sched push``
add one-URL sites, on one Redis and on a 3-master cluster (bench/push.py).
``python -m bench enqueue-cost`` measures the Redis time of one enqueue.lua call against a
revision's (bench/enqueue_cost.py).
``python -m bench transfer`` measures ``streams-sched dump`` and ``load`` of 1,000,000 queued
requests on 10,000 sites against ``push`` of the same URLs, with each command's peak RSS
(bench/transfer.py).
``python -m bench browser`` measures whether plain pages keep flowing while browser
workers render (Debian's Chromium through scrapy-playwright; bench/browser.py).
``python -m bench recrawl-scale`` measures worker and Redis CPU per fetch with 1,000,000
tracked pages waiting on 10,000 sites, against a one-off crawl (bench/recrawl_scale.py).
``python -m bench faults --minutes 30`` runs the seeded random fault campaign seed after
seed on a 3+3 Redis Cluster and under Sentinel, and tabulates the faults survived
(bench/faults.py, the engine in tests/campaign.py).
``python -m bench recrawl`` sets continuous crawling (fixed and adaptive revisits) against
re-running the spider every 10 minutes, on pages that change on Poisson clocks, and
simulates the three first to choose their parameters (bench/recrawl.py; ``--simulate``,
``--time-scale``, ``--minutes``, ``--sites``).

Crawl configs are interleaved and repeated; the tables show medians and
ratios within this run (absolute numbers on a shared machine mean little).
Results go to stdout and to bench/results/ (JSON and markdown). Throwaway
redis-servers on free ports only. ``--profile`` adds py-spy profiles of (a).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from .report import median_runs, render

RESULTS = Path(__file__).resolve().parent / "results"
SECTIONS = "abcdef"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny sizes, one run each: well under a minute")
    p.add_argument("--only", default=SECTIONS, help="sections to run, e.g. 'ab' or 'cde' (f comes with a/b; p = the profiles)")
    p.add_argument("--repeat", type=int, help="runs per crawl config (default 3, quick 1)")
    p.add_argument("--sites", type=int, help="synthetic sites (default 10, quick 3)")
    p.add_argument("--pages", type=int, help="pages per site (default 2000, quick 150)")
    p.add_argument("--kinds", help="comma-separated schedulers for (a); default memory,scrapy-redis,streams-sched"
                   " (+ streams-sched/bitmap unless --quick)")
    p.add_argument("--ops", type=int, help="requests for (c) (default 100000, quick 4000)")
    p.add_argument("--mem-sizes", help="fingerprint counts for (d) (default 1000000,10000000, quick 20000)")
    p.add_argument("--codec-loops", type=int, help="loops per codec timing (default 20000, quick 500)")
    p.add_argument("--profile", action="store_true", help="also py-spy streams-sched and memory in (a) (both threads)")
    p.add_argument("--out", type=Path, default=RESULTS, help="where to write results (default bench/results/)")
    args = p.parse_args(argv)
    args.profile = args.profile or "p" in args.only
    q = args.quick
    args.repeat = args.repeat or (1 if q else 3)
    args.sites = args.sites or (3 if q else 10)
    args.pages = args.pages or (150 if q else 2000)
    args.ops = args.ops or (4000 if q else 100_000)
    args.mem_sizes = [int(float(x)) for x in (args.mem_sizes or ("20000" if q else "1e6,1e7")).split(",")]
    args.codec_loops = args.codec_loops or (500 if q else 20000)
    default_kinds = "memory,scrapy-redis,streams-sched" + ("" if q else ",streams-sched/bitmap")
    args.kinds = (args.kinds or default_kinds).split(",")
    return args


def machine(redis_url: str | None) -> dict[str, Any]:
    import hiredis
    import redis
    import scrapy
    import scrapy_redis

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    version = "?"
    if redis_url:
        version = redis.Redis.from_url(redis_url).info("server")["redis_version"]
    return {
        "cores": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "redis": version,
        "scrapy": scrapy.__version__,
        "scrapy_redis": getattr(scrapy_redis, "__version__", "?"),
        "redis_py": redis.__version__,
        "hiredis": getattr(hiredis, "__version__", "?"),
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


def say(text: str) -> None:
    print(f"[bench] {text}", file=sys.stderr, flush=True)


def run_crawls(args: argparse.Namespace, redis_url: str, res: dict[str, Any]) -> None:
    from .crawl import CrawlSpec, run_crawl

    configs: list[tuple[str, CrawlSpec]] = []
    if "a" in args.only:
        configs += [("a", CrawlSpec(k, 1, args.sites, args.pages)) for k in args.kinds]
    if "b" in args.only:
        configs += [("b", CrawlSpec(k, 2, args.sites, args.pages, seed="preseed"))
                    for k in ("scrapy-redis", "streams-sched")]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for i in range(args.repeat):
        for section, spec in configs:
            r = run_crawl(spec, redis_url if spec.uses_redis else None, f"bench{section}{i}")
            runs.setdefault((section, spec.kind), []).append(r)
            say(f"({section}) {spec.kind} x{spec.workers} run {i + 1}/{args.repeat}: {r['pages_per_s']:.0f} pages/s,"
                f" {r['round_trips_per_page']:.3f} round trips/page, missing {r['missing']}, repeats {r['repeats']}")
    for (section, kind), rs in runs.items():
        res.setdefault(section, {})[kind] = median_runs(rs)
    # Paired ratios: each run against the baseline of the same round, then the median;
    # steadier than a ratio of medians when the machine's load drifts during the run.
    for (section, kind), rs in runs.items():
        for base in ("memory", "scrapy-redis"):
            base_runs = runs.get((section, base))
            if base_runs:
                ratios = [r["pages_per_s"] / b["pages_per_s"] for r, b in zip(rs, base_runs, strict=True)]
                res[section][kind][f"paired_vs_{base}"] = statistics.median(ratios)
                res[section][kind][f"paired_vs_{base}_all"] = ratios


def main(argv: list[str] | None = None) -> int:
    rest = sys.argv[1:] if argv is None else argv
    if rest[:1] == ["broad"]:  # python -m bench broad [--quick] [--sites N]: see bench/broad.py
        from .broad import main as broad_main

        return broad_main(rest[1:])
    if rest[:1] == ["replicas"]:  # python -m bench replicas: the cost of the replica wait (bench/replicas.py)
        from .replicas import main as replicas_main

        return replicas_main(rest[1:])
    if rest[:1] == ["sites"]:  # python -m bench sites: one-page sites, CPU-bound (bench/sites.py)
        from .sites import main as sites_main

        return sites_main(rest[1:])
    if rest[:1] == ["pick"]:  # python -m bench pick: reactor cost per request vs ready sites (bench/pick.py)
        from .pick import main as pick_main

        return pick_main(rest[1:])
    if rest[:1] == ["push"]:  # python -m bench push: Seeder and `streams-sched push` rates (bench/push.py)
        from .push import main as push_main

        return push_main(rest[1:])
    if rest[:1] == ["recrawl-scale"]:  # python -m bench recrawl-scale: CPU per fetch with tracked pages waiting
        from .recrawl_scale import main as recrawl_scale_main

        return recrawl_scale_main(rest[1:])
    if rest[:1] == ["faults"]:  # python -m bench faults: the seeded fault campaign (bench/faults.py)
        from .faults import main as faults_main

        return faults_main(rest[1:])
    if rest[:1] == ["recrawl"]:  # python -m bench recrawl: revisits against cron, on changing pages (bench/recrawl.py)
        from .recrawl import main as recrawl_main

        return recrawl_main(rest[1:])
    if rest[:1] == ["enqueue-cost"]:  # python -m bench enqueue-cost: enqueue.lua's Redis time against a revision's
        from .enqueue_cost import main as enqueue_cost_main

        return enqueue_cost_main(rest[1:])
    if rest[:1] == ["transfer"]:  # python -m bench transfer: dump and load rates against push (bench/transfer.py)
        from .transfer import main as transfer_main

        return transfer_main(rest[1:])
    if rest[:1] == ["browser"]:  # python -m bench browser: http pages/s while browsers render (bench/browser.py)
        from .browser import main as browser_main

        return browser_main(rest[1:])
    args = parse_args(argv)
    from streams_sched.testing import RedisServer

    started = time.time()
    res: dict[str, Any] = {
        "config": {
            "command": "./scripts/bench.sh " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:])),
            "sites": args.sites, "pages": args.pages, "repeat": args.repeat, "preseed_pages": 64,
            "ops": args.ops, "mem_sizes": args.mem_sizes, "kinds": args.kinds,
        },
    }
    with RedisServer(bloom=True) as server:
        res["machine"] = machine(server.url)
        if set("ab") & set(args.only):
            run_crawls(args, server.url, res)
        if "c" in args.only:
            from .frontier_ops import run_frontier_ops

            say(f"(c) frontier operations, {args.ops:,} requests")
            res["c"] = run_frontier_ops(server.url, args.ops)
    if "d" in args.only:
        from .memory import run_memory

        say(f"(d) memory per fingerprint at {args.mem_sizes}")
        res["d"] = run_memory(args.mem_sizes)
    if "e" in args.only:
        from .codec_bench import run_codec

        say("(e) codec cost")
        res["e"] = run_codec(args.codec_loops)
    if args.profile:
        from .profile import run_profiles

        say("profiling (a) with py-spy")
        res["profile"] = run_profiles(args, args.out)
    res["elapsed_s"] = time.time() - started
    text = render(res)
    if args.profile and res.get("profile"):
        from .profile import render_profiles

        text += "\n" + render_profiles(res["profile"])
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"bench-{stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / f"bench-{stamp}.md").write_text(text)
    (args.out / "latest.md").write_text(text)
    say(f"done in {res['elapsed_s']:.0f} s; wrote {args.out}/bench-{stamp}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
