"""(a), (b) and (f): whole crawls of the synthetic web by real Scrapy worker processes.

Each run starts its workers (``bench/worker.py``), waits until every one has
opened its spider, resets Redis' counters and opens a start gate; the crawl
time runs from the gate to the last item of the last worker (start-up, drain
detection and shut-down are left out: they are constant costs, not
throughput). Every run checks that each page was crawled, and reports
repeats.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from streams_sched.demo.web import SyntheticWeb

from .revision import checkout, split_kind

__all__ = ["CrawlSpec", "KINDS", "python_for", "run_crawl"]

ROOT = Path(__file__).resolve().parent.parent

#: scheduler kinds: label -> settings that select it
KINDS: dict[str, dict[str, Any]] = {
    "memory": {},
    "scrapy-redis": {
        "SCHEDULER": "scrapy_redis.scheduler.Scheduler",
        "DUPEFILTER_CLASS": "scrapy_redis.dupefilter.RFPDupeFilter",
        # keep the queue when a worker closes: with False the first worker to
        # finish deletes the queue and the fingerprints under the other one
        "SCHEDULER_PERSIST": True,
    },
    "streams-sched": {
        "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
        "STREAMS_DEDUPE": "redisbloom",
    },
    "streams-sched/bitmap": {
        "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
        "STREAMS_DEDUPE": "bitmap",
    },
    # the URL shortcut (on by default) switched off, to measure what it saves
    "streams-sched-no-url-shortcut": {
        "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
        "STREAMS_DEDUPE": "redisbloom",
        "STREAMS_URL_SHORTCUT": False,
    },
}


@dataclass
class CrawlSpec:
    kind: str
    workers: int = 1
    sites: int = 10
    pages: int = 2000
    #: "start": the spider yields the seeds from start() (one worker only);
    #: "preseed": the harness puts pages 0..preseed_pages-1 of every site into Redis
    seed: str = "start"
    preseed_pages: int = 64
    concurrent_items: int = 8
    extra: dict[str, Any] = field(default_factory=dict)
    #: py-spy the workers: {"rate": 250, "out": dir, "name": file prefix, "gil": only GIL holders}
    profile: dict[str, Any] | None = None
    timeout_s: float = 600.0

    @property
    def base_kind(self) -> str:
        """The kind in KINDS (``kind`` may name a revision too: ``streams-sched@REV``)."""
        return split_kind(self.kind)[0]

    @property
    def uses_redis(self) -> bool:
        return self.base_kind != "memory"


def worker_settings(spec: CrawlSpec, redis_url: str | None, crawl: str, wdir: Path, n: int) -> dict[str, Any]:
    s: dict[str, Any] = {
        "DOWNLOAD_HANDLERS": {"http": "streams_sched.demo.handler.SyntheticHandler"},
        "SYNTH_SITES": spec.sites,
        "SYNTH_PAGES": spec.pages,
        "SYNTH_SEED": spec.seed == "start" and n == 0,
        "CONCURRENT_ITEMS": spec.concurrent_items,
        "ROBOTSTXT_OBEY": False,
        "TELNETCONSOLE_ENABLED": False,
        "LOG_LEVEL": "INFO",
        "EXTENSIONS": {
            "scrapy.extensions.remote_control.RemoteControl": None,
            "bench.probe.BenchProbe": 0,
        },
        "BENCH_RESULT_FILE": str(wdir / f"result{n}.json"),
        "BENCH_READY_FILE": str(wdir / f"ready{n}"),
        "BENCH_GATE_FILE": str(wdir / "gate"),
    }
    s.update(KINDS[spec.base_kind])
    if spec.uses_redis:
        s["REDIS_URL"] = redis_url
        s["STREAMS_PREFIX"] = crawl
        s["SCHEDULER_QUEUE_KEY"] = f"{crawl}:requests"
        s["SCHEDULER_DUPEFILTER_KEY"] = f"{crawl}:dupefilter"
    s.update(spec.extra)
    return s


def preseed(spec: CrawlSpec, client: redis.Redis, crawl: str, settings: dict[str, Any]) -> int:
    web = SyntheticWeb(sites=spec.sites, pages=spec.pages)
    urls = [web.url(s, p) for p in range(min(spec.preseed_pages, spec.pages)) for s in range(spec.sites)]
    if spec.base_kind.startswith("streams-sched"):
        from streams_sched import seed
        from streams_sched.frontier.bloom import detect_dedupe

        detect_dedupe(client, crawl, settings["STREAMS_DEDUPE"])
        return len(seed(client, crawl, urls).added)
    if spec.base_kind == "scrapy-redis":
        from scrapy import Request
        from scrapy_redis.dupefilter import RFPDupeFilter
        from scrapy_redis.queue import PriorityQueue

        from streams_sched.demo.spider import SyntheticSpider

        spider = SyntheticSpider()
        queue = PriorityQueue(client, spider, settings["SCHEDULER_QUEUE_KEY"])
        df = RFPDupeFilter(client, settings["SCHEDULER_DUPEFILTER_KEY"])
        added = 0
        for url in urls:
            request = Request(url, callback=spider.parse)
            if not df.request_seen(request):
                queue.push(request)
                added += 1
        return added
    raise ValueError(f"{spec.kind} cannot be pre-seeded")


def primaries(redis_url: str) -> list[redis.Redis]:
    """A client for each primary behind ``redis_url`` (every master of a cluster): the
    servers whose CPU and commands a crawl is charged with."""
    from streams_sched.connect.clients import is_cluster_url

    if not is_cluster_url(redis_url):
        # no socket timeout: a FLUSHALL of a big crawl can take longer than redis-py's 5 s
        return [redis.Redis.from_url(redis_url, socket_timeout=None)]
    from streams_sched.connect.clients import connect

    cluster = connect(redis_url)
    return [redis.Redis(host=n.host, port=n.port, socket_timeout=None) for n in cluster.get_primaries()]


def _redis_counters(clients: list[redis.Redis]) -> dict[str, Any]:
    out: dict[str, Any] = {"cpu_s": 0.0, "calls": {}, "usec": {}}
    for client in clients:
        cpu = client.info("cpu")
        cmd = client.info("commandstats")
        out["cpu_s"] += float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
        for k, v in cmd.items():
            name = k.removeprefix("cmdstat_")
            out["calls"][name] = out["calls"].get(name, 0) + int(v["calls"])
            out["usec"][name] = out["usec"].get(name, 0) + int(v["usec"])
    return out


def python_for(kind: str) -> tuple[Path, dict[str, str]]:
    """The working directory and environment of a ``python -m`` process for ``kind``:
    with ``KIND@REV``, streams_sched from that revision, ahead of today's (bench/revision.py)."""
    env = dict(os.environ)
    rev = split_kind(kind)[1]
    # the working directory comes first on sys.path with -m, so the process starts in it
    cwd = checkout(rev) if rev else ROOT
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(cwd), str(ROOT), env.get("PYTHONPATH", "")]))
    return cwd, env


def _launch(spec: CrawlSpec, settings: dict[str, Any], log: Path, n: int) -> subprocess.Popen[bytes]:
    cwd, env = python_for(spec.kind)
    profile = spec.profile
    cmd = [sys.executable, "-m", "bench.worker", json.dumps(settings)]
    if profile:
        out = Path(profile["out"]) / f"{profile.get('name', 'worker')}-{n}.txt"
        pyspy = str(Path(sys.executable).parent / "py-spy")
        # --idle is off by default: only samples of threads on the CPU count
        mode = ["--gil"] if profile.get("gil") else []
        cmd = [pyspy, "record", "--rate", str(profile.get("rate", 250)), "--threads", *mode,
               "--format", "raw", "--output", str(out), "--", *cmd]
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=cwd)


def run_crawl(spec: CrawlSpec, redis_url: str | None, crawl: str) -> dict[str, Any]:
    """Run one crawl; return its measurements (see the module docstring)."""
    wdir = Path(tempfile.mkdtemp(prefix=f"bench-{spec.kind.replace('/', '-')}-"))
    servers = primaries(redis_url) if redis_url else []
    for server in servers:
        server.flushall()
        server.script_flush()
    client = servers[0] if len(servers) == 1 else None
    settings = [worker_settings(spec, redis_url, crawl, wdir, n) for n in range(spec.workers)]
    seeded = 0
    if spec.seed == "preseed":
        assert client is not None
        seeded = preseed(spec, client, crawl, settings[0])
    procs = [_launch(spec, s, wdir / f"worker{n}.log", n) for n, s in enumerate(settings)]
    try:
        deadline = time.monotonic() + 120
        while not all((wdir / f"ready{n}").exists() for n in range(spec.workers)):
            for n, p in enumerate(procs):
                if p.poll() is not None:
                    raise RuntimeError(f"worker {n} exited at start:\n{_tail(wdir / f'worker{n}.log')}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers did not open within 120 s; logs in {wdir}")
            time.sleep(0.01)
        before = None
        if servers:
            for server in servers:
                server.config_resetstat()
            before = _redis_counters(servers)
        t_gate = time.time()
        (wdir / "gate").write_text("go")
        for n, p in enumerate(procs):
            left = max(1.0, spec.timeout_s - (time.time() - t_gate))
            try:
                code = p.wait(left)
            except subprocess.TimeoutExpired:
                raise RuntimeError(f"worker {n} did not finish within {spec.timeout_s} s; logs in {wdir}") from None
            if code != 0:
                raise RuntimeError(f"worker {n} exited with {code}:\n{_tail(wdir / f'worker{n}.log')}")
        after = _redis_counters(servers) if servers else None
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for n in range(spec.workers):
        path = wdir / f"result{n}.json"
        if not path.exists():
            raise RuntimeError(f"worker {n} wrote no result; log:\n{_tail(wdir / f'worker{n}.log')}")
        results.append(json.loads(path.read_text()))
    return summarize(spec, results, before, after, seeded, wdir)


def summarize(
    spec: CrawlSpec,
    results: list[dict[str, Any]],
    before: dict[str, Any] | None,
    after: dict[str, Any] | None,
    seeded: int,
    wdir: Path,
) -> dict[str, Any]:
    expected = SyntheticWeb(sites=spec.sites, pages=spec.pages).all_urls()
    counts: dict[str, int] = {}
    for r in results:
        for url in r["urls"]:
            counts[url] = counts.get(url, 0) + 1
    # each worker's own repeats, plus pages crawled by more than one worker
    repeats = sum(r["repeats"] for r in results) + sum(n - 1 for n in counts.values())
    pages = len(counts)
    t0 = min(r["t_go"] for r in results)
    t_end = max(r["t_last_item"] for r in results)
    elapsed = max(t_end - t0, 1e-9)
    rt = sum(r["round_trips"]["reactor"] + r["round_trips"]["io"] for r in results)
    rt_reactor = sum(r["round_trips"]["reactor"] for r in results)
    out: dict[str, Any] = {
        "kind": spec.kind,
        "workers": spec.workers,
        "pages": pages,
        "missing": len(expected - counts.keys()),
        "repeats": repeats,
        "seeded": seeded,
        "elapsed_s": elapsed,
        "pages_per_s": pages / elapsed,
        "worker_cpu_ms_per_page": 1000 * sum(r["cpu_s"] for r in results) / max(pages, 1),
        # CPU seconds per wall second of each worker: ~1.0 = CPU-bound (one GIL); lower = waiting
        "worker_busy": sum(r["cpu_s"] for r in results) / (elapsed * len(results)),
        "round_trips": rt,
        "round_trips_per_page": rt / max(pages, 1),
        "round_trips_reactor_per_page": rt_reactor / max(pages, 1),
        "per_worker_pages": [r["unique_urls"] for r in results],
        # from getrusage and /proc/self/task, sampled every 256 items: per 1,000 items
        "user_ms_per_page": _per_item(results, lambda r: r["rusage"]["user_s"] * 1000),
        "sys_ms_per_page": _per_item(results, lambda r: r["rusage"]["sys_s"] * 1000),
        "ctx_switches_per_page": _per_item(results, lambda r: r["rusage"]["vol_ctx"] + r["rusage"]["invol_ctx"]),
        # per thread, from /proc/self/task/*/schedstat: on a CPU, runnable but waiting for
        # one (other processes), and the rest of the wall time: blocked (event loop idle,
        # GIL waits, socket waits)
        **{
            f"{kind}_{what}_ms_per_page": _per_item(results, lambda r, kind=kind, what=what: 1000 * _thread(r, kind, what))
            for kind in ("reactor", "pump")
            for what in ("run", "runqueue", "blocked")
        },
        "close_tail_s": max(r["t_closed"] for r in results) - t_end,
        "streams_sched_from": results[0].get("streams_sched_from"),
        "log_dir": str(wdir),
    }
    if before is not None and after is not None:
        calls = {k: v - before["calls"].get(k, 0) for k, v in after["calls"].items()}
        calls = {k: v for k, v in calls.items() if v > 0 and k not in ("config|resetstat", "info")}
        out["redis_cpu_ms_per_page"] = 1000 * (after["cpu_s"] - before["cpu_s"]) / max(pages, 1)
        out["redis_calls_per_page"] = sum(calls.values()) / max(pages, 1)
        out["redis_calls"] = dict(sorted(calls.items(), key=lambda kv: -kv[1]))
        # time inside each command, per crawled page (a script's includes the commands it
        # calls, which are also counted under their own names)
        usec = {k: v - before["usec"].get(k, 0) for k, v in after["usec"].items() if k in calls}
        out["redis_usec_per_page"] = {
            k: round(v / max(pages, 1), 2) for k, v in sorted(usec.items(), key=lambda kv: -kv[1]) if v > 0
        }
    return out


def _thread(r: dict[str, Any], kind: str, what: str) -> float:
    t = r["thread_cpu"].get(kind)
    if not t:
        return 0.0
    if what == "blocked":
        return max(0.0, t["wall_s"] - t["run_s"] - t["runqueue_s"])
    return float(t[f"{what}_s"])


def _per_item(results: list[dict[str, Any]], value: Any) -> float:
    items = sum(r["rusage_items"] for r in results)
    return sum(value(r) for r in results) / items if items else 0.0


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""
