"""``python -m bench pick``: the reactor thread's cost per request against the number of ready sites.

No Redis, no I/O thread, no Scrapy engine: a StreamsScheduler whose Exchange is fed by
hand, as the I/O thread feeds it (a weight written for the site, then the arrival), and
a stand-in for Scrapy's downloader (its ``slots`` and ``get_slot_key``; one slot per
site, CONCURRENT_REQUESTS_PER_DOMAIN = 8). The crawl is a broad one, one page per site:
N sites are ready, and each step hands one arrival of a new site to the scheduler, takes
one request from ``next_request`` into the "downloader", and finishes the oldest of the
CONCURRENT_REQUESTS = 256 in flight (response_downloaded, then ``request_done``), so that
N sites stay ready. Reported: microseconds per step, i.e. per request, and how many
sites ``Exchange.served`` and ``Exchange.weights`` hold at the end (they should follow
the sites held, not the sites crawled).

``--rev REV`` (repeatable) measures ``streams_sched`` as it was at git revision REV too
(bench/revision.py), interleaved with today's, each measurement in a fresh process.
Where a revision has no cheap way in (the plain scan: building N ready sites one by
one costs O(N^2) there), its ready set is built directly; that part is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

from .report import table
from .revision import checkout

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
CONCURRENCY = 256
PER_SLOT = 8


def say(text: str) -> None:
    print(f"[bench pick] {text}", file=sys.stderr, flush=True)


class _Slot:
    __slots__ = ("active", "concurrency")

    def __init__(self, concurrency: int) -> None:
        self.active: set[Any] = set()
        self.concurrency = concurrency


class _Downloader:
    """What the scheduler reads of Scrapy's downloader: its slots and their keys."""

    def __init__(self) -> None:
        self.slots: dict[str, _Slot] = {}

    def get_slot_key(self, request: Any) -> str:
        return request.meta.get("download_slot") or request.meta["host"]


def measure(n_ready: int, seconds: float, max_steps: int) -> dict[str, Any]:
    """Time steps of the broad crawl with ``n_ready`` sites ready (in this process)."""
    import scrapy
    from scrapy.http import Response
    from scrapy.utils.request import RequestFingerprinter

    import streams_sched
    from streams_sched.config import StreamsConfig
    try:
        from streams_sched.frontier.records import LeasedEntry
        from streams_sched.worker.exchange import Exchange
    except ModuleNotFoundError:  # a revision with the flat package layout
        from streams_sched.exchange import Exchange  # type: ignore[no-redef]
        from streams_sched.frontier import LeasedEntry  # type: ignore[no-redef]

    from streams_sched.scheduler import StreamsScheduler

    config = StreamsConfig(redis_url="redis://unused", crawl="pick")
    try:
        from streams_sched.worker.scheduler import Limits
    except ModuleNotFoundError:  # a revision with the flat package layout
        sched = StreamsScheduler(config, fingerprinter=RequestFingerprinter(), concurrency=CONCURRENCY, per_site_concurrency=PER_SLOT)
    else:
        sched = StreamsScheduler(config, fingerprinter=RequestFingerprinter(), limits=Limits(CONCURRENCY, PER_SLOT))
    ready_queues: Any = getattr(sched, "ready", None)
    x = sched._x = Exchange()
    downloader = _Downloader()
    if ready_queues is not None:
        ready_queues.exchange = x
        ready_queues.downloader = downloader
        sched.answers.exchange = x
    else:
        sched._downloader = downloader
    slots = downloader.slots
    response = Response("http://unused.test/")

    def arrival(i: int) -> tuple[Any, Any]:
        site = f"s{i}.test"
        request = scrapy.Request(f"http://{site}/", meta={"host": site})
        return request, LeasedEntry(site, 1, b"%d-0" % i, None, 0, leased_at=time.monotonic())

    def weigh(site: str) -> None:  # what the I/O thread does with each lease reply
        if x.weights.get(site) != 1.0:
            x.weights[site] = 1.0

    ready = [arrival(i) for i in range(n_ready)]
    for _request, entry in ready:
        weigh(entry.site)
        slots.setdefault(entry.site, _Slot(PER_SLOT))
    direct = ready_queues is None and not hasattr(sched, "_fair")
    if direct:
        # the plain scan: O(N) per site added through _absorb; lay out its ready set as it keeps it
        for request, entry in ready:
            sched._ready[entry.site] = deque([(request, entry, entry.site)])
        sched._nready = len(ready)
    else:
        x.arrivals.extend(ready)
        (ready_queues.absorb if ready_queues is not None else sched._absorb)()
    ready.clear()
    flight: deque[Any] = deque()
    on_answer = sched.answers.on_response_downloaded if ready_queues is not None else sched._on_response_downloaded

    def step(request: Any, entry: Any) -> None:
        weigh(entry.site)
        slots.setdefault(entry.site, _Slot(PER_SLOT))
        x.arrivals.append((request, entry))
        got = sched.next_request()
        assert got is not None
        key = downloader.get_slot_key(got)
        got.meta["download_slot"] = key
        slots[key].active.add(got)
        flight.append(got)
        if len(flight) > CONCURRENCY:
            done = flight.popleft()
            on_answer(response, done, None)
            slot = slots.pop(done.meta["download_slot"])  # one page per site: its slot goes
            slot.active.discard(done)
            sched.request_done(done)

    i = n_ready
    warm = min(50, max_steps // 10)
    for _ in range(warm):
        step(*arrival(i))
        i += 1
    timed = 0
    elapsed = 0.0
    while timed < max_steps and (timed < 20 or elapsed < seconds):
        # requests are made between the timed stretches: their cost is not the scheduler's
        batch = [arrival(i + k) for k in range(min(2048, max_steps - timed))]
        i += len(batch)
        x.outbox.clear()
        x.feedback.clear()
        t0 = time.perf_counter()
        for request, entry in batch:
            step(request, entry)
            timed += 1
            if timed >= 20 and time.perf_counter() - t0 + elapsed >= seconds:
                break
        elapsed += time.perf_counter() - t0
    assert len(sched) == n_ready, (len(sched), n_ready)
    return {
        "ready_sites": n_ready,
        "steps": timed,
        "us_per_request": 1e6 * elapsed / timed,
        "served_entries": len(x.served),
        "weights_entries": len(x.weights),
        "held_sites": len({r.meta["host"] for r in flight}),
        "sites_crawled": warm + timed,
        "ready_set_built": "directly" if direct else "through _absorb",
        "streams_sched_from": str(Path(streams_sched.__file__).resolve().parent.parent),
    }


def run_one(n_ready: int, rev: str | None, seconds: float, max_steps: int) -> dict[str, Any]:
    """One measurement in a fresh interpreter, with streams_sched of ``rev`` (None: today's)."""
    cwd = checkout(rev) if rev else ROOT
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([str(cwd), str(ROOT), env.get("PYTHONPATH", "")]))
    proc = subprocess.run(
        [sys.executable, "-m", "bench.pick", "--one", str(n_ready), "--seconds", str(seconds), "--max-steps", str(max_steps)],
        cwd=cwd, env=env, capture_output=True, text=True, check=False,
    )
    if proc.returncode:
        raise RuntimeError(f"bench pick at {rev or 'today'} with {n_ready} sites failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench pick", description=__doc__.splitlines()[0])
    p.add_argument("--sizes", help="ready sites, comma-separated (default 10,1000,100000; quick 10,1000)")
    p.add_argument("--rev", action="append", default=[], help="also measure streams_sched at this git revision (repeatable)")
    p.add_argument("--repeat", type=int, help="measurements per size and version (default 3, quick 1; the median is shown)")
    p.add_argument("--seconds", type=float, help="time each measurement for about this long (default 2, quick 0.3)")
    p.add_argument("--max-steps", type=int, default=200_000, help="most requests per measurement (default 200,000)")
    p.add_argument("--quick", action="store_true", help="small sizes, one short run each")
    p.add_argument("--out", type=Path, default=RESULTS, help="where to write results (default bench/results/)")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    q = args.quick
    args.repeat = args.repeat or (1 if q else 3)
    args.seconds = args.seconds or (0.3 if q else 2.0)
    args.sizes = [int(float(s)) for s in (args.sizes or ("10,1000" if q else "10,1000,100000")).split(",")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one is not None:
        print(json.dumps(measure(args.one, args.seconds, args.max_steps)))
        return 0
    versions: list[str | None] = [None, *args.rev]
    runs: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for size in args.sizes:
        for i in range(args.repeat):
            for rev in versions:
                name = rev or "today"
                r = run_one(size, rev, args.seconds, args.max_steps)
                runs.setdefault((size, name), []).append(r)
                say(f"{size:,} ready sites, {name}, run {i + 1}/{args.repeat}: {r['us_per_request']:.2f} us/request"
                    f" over {r['steps']:,} requests; served {r['served_entries']:,} / weights {r['weights_entries']:,}"
                    f" entries after {r['sites_crawled']:,} sites")
    names = [rev or "today" for rev in versions]
    header = ["ready sites", *[f"{n} us/request" for n in names]]
    header += [f"{n} time / today's" for n in names[1:]]
    header += [f"{n} served/weights entries" for n in names]
    rows = []
    summary: dict[str, Any] = {}
    for size in args.sizes:
        med = {n: statistics.median(r["us_per_request"] for r in runs[(size, n)]) for n in names}
        row = [f"{size:,}", *[f"{med[n]:.2f}" for n in names]]
        row += [f"{med[n] / med[names[0]]:,.2f}x" for n in names[1:]]
        row += [f"{runs[(size, n)][-1]['served_entries']:,} / {runs[(size, n)][-1]['weights_entries']:,}" for n in names]
        rows.append(row)
        summary[str(size)] = {n: {"median_us_per_request": med[n], "runs": runs[(size, n)]} for n in names}
    text = (
        f"### Reactor thread per request, broad crawl (1 page per site, CONCURRENT_REQUESTS = {CONCURRENCY}),"
        f" median of {args.repeat}\n\n" + table(header, rows) + "\n\n"
        "Per request: one arrival absorbed, one next_request, one response_downloaded + request_done."
        " Entries: sizes of Exchange.served / Exchange.weights at the end of the last run.\n"
    )
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (args.out / f"pick-{stamp}.json").write_text(json.dumps(summary, indent=1))
    (args.out / f"pick-{stamp}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
