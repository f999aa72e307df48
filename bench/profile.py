"""Where the time goes: py-spy profiles of one-worker crawls, both threads.

``py-spy record --threads --format raw`` wraps the worker, twice per
scheduler:

- ``--gil``: only the thread holding the GIL is sampled. A worker is one
  process with one GIL (the reactor and the streams-sched I/O thread take
  turns), and it is CPU-bound, so this is the time that decides pages/s;
- ``--idle`` off (py-spy's default): every thread that the OS reports
  running or runnable. On a loaded 2-core machine "runnable" includes
  waiting for a CPU, so lock waits show up too; those samples are put in
  their own area ("waiting").

The collapsed stacks are summarised per thread as milliseconds per crawled
page: by area of the code (the file of the innermost Python frame) and by
function (inclusive). Samples under imports are left out (start-up). Run
with ``python -m bench --profile`` or ``--only p``.
"""

from __future__ import annotations

import re
import tempfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from .report import table

__all__ = ["parse_collapsed", "render_profiles", "run_profiles", "summarize_profile"]

RATE_HZ = 250

#: (area, substrings of the innermost frame's file), first match wins
AREAS: list[tuple[str, tuple[str, ...]]] = [
    ("streams-sched I/O thread (io/)", ("streams_sched/worker/io/", "streams_sched/worker/selection.py")),
    ("streams-sched codec + msgpack", ("streams_sched/wire/", "msgpack")),
    ("streams-sched frontier.py", ("streams_sched/frontier/client.py", "streams_sched/frontier/scripts/")),
    ("streams-sched scheduler.py (reactor side)", ("streams_sched/worker/scheduler.py", "streams_sched/worker/engine.py", "streams_sched/worker/seen.py")),
    ("redis-py + hiredis", ("/redis/",)),
    ("scrapy in-memory scheduler + dupefilter", ("scrapy/core/scheduler.py", "scrapy/pqueues.py", "scrapy/squeues.py", "scrapy/dupefilters.py", "queuelib")),
    ("request fingerprint", ("scrapy/utils/request.py",)),
    ("link extraction (parsel, lxml, w3lib)", ("parsel", "lxml", "cssselect", "w3lib", "scrapy/http/response/text.py")),
    ("Request/Response objects", ("scrapy/http/",)),
    ("Twisted + asyncio event loop", ("twisted/", "asyncio/", "selectors.py")),
    ("scrapy engine, scraper, middlewares", ("scrapy/",)),
    ("synthetic web + handler (demo)", ("streams_sched/demo/",)),
    ("bench probe", ("bench/",)),
    ("threading (locks, events)", ("threading.py",)),
    ("logging", ("logging/",)),
]

KEY_FUNCTIONS = (
    "StreamsScheduler.enqueue_request", "StreamsScheduler.next_request", "StreamsScheduler.request_done",
    "StreamsScheduler._absorb", "StreamsScheduler._apply_stats", "StreamsScheduler.has_pending_requests",
    "EngineHooks.wake", "RequestCodec.encode", "RequestCodec.decode",
    "IOThread._cycle", "IOThread._queue", "Leasing.queue", "IOThread._apply", "Leasing.accept", "IOThread._upkeep",
    "IOThread._check_drain", "Pipeline.execute", "Pipeline._execute_pipeline", "IOThread._wait_time",
    "Scheduler.enqueue_request", "Scheduler.next_request", "RFPDupeFilter.request_seen",
    "RequestFingerprinter.fingerprint", "SyntheticSpider.parse", "ExecutionEngine._start_scheduled_request",
)

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>.*?)(?::(?P<line>\d+))?\)$")


def parse_collapsed(path: Path) -> list[tuple[str, list[tuple[str, str]], int]]:
    """py-spy raw output -> [(thread name, [(function, file), ...outermost first], samples)]."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        parts = stack.split(";")
        thread = parts[0].split(": ", 1)[-1] if parts[0].startswith("thread") else "?"
        frames = []
        for p in parts[1:]:
            m = _FRAME.match(p)
            frames.append((m.group("func"), m.group("file")) if m else (p, ""))
        out.append((thread, frames, int(count)))
    return out


WAITS = frozenset({"Condition.wait", "Condition.wait_for", "Event.wait", "Thread.join", "sleep"})


def _area(func: str, file: str) -> str:
    if func in WAITS:
        return "waiting (lock / event wait, runnable)"
    for name, needles in AREAS:
        if any(n in file for n in needles):
            return name
    return "other (stdlib, builtins)"


def _thread_kind(name: str) -> str:
    if name == "MainThread":
        return "reactor"
    if name.startswith(("streams-sched-io", "streams-sched-pump")):  # the I/O thread (pump: an older KIND@REV revision)
        return "pump"
    return "other"


def summarize_profile(path: Path, pages: int, rate_hz: int = RATE_HZ) -> dict[str, Any]:
    """CPU ms per page by thread, by area and by function (inclusive), start-up left out."""
    ms_per_sample = 1000.0 / rate_hz
    threads: Counter[str] = Counter()
    areas: dict[str, Counter[str]] = defaultdict(Counter)
    funcs: dict[str, Counter[str]] = defaultdict(Counter)
    skipped = 0
    for thread, frames, n in parse_collapsed(path):
        if any(f == "_find_and_load" for f, _ in frames) or not frames:
            skipped += n
            continue
        kind = _thread_kind(thread)
        threads[kind] += n
        areas[kind][_area(*frames[-1])] += n
        for func in {f for f, _ in frames}:
            funcs[kind][func] += n
    scale = ms_per_sample / max(pages, 1)
    return {
        "pages": pages,
        "skipped_startup_ms": skipped * ms_per_sample,
        "threads": {k: v * scale for k, v in threads.items()},
        "areas": {k: {a: v * scale for a, v in c.most_common()} for k, c in areas.items()},
        "functions": {k: {f: v * scale for f, v in c.most_common(300)} for k, c in funcs.items()},
    }


def run_profiles(args: Any, out_dir: Path) -> dict[str, Any]:
    from streams_sched.testing import RedisServer

    from .crawl import CrawlSpec, run_crawl

    pdir = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    res: dict[str, Any] = {"dir": str(pdir), "rate_hz": RATE_HZ}
    with RedisServer(bloom=True) as server:
        for mode in ("gil", "idle-off"):
            for kind in ("memory", "streams-sched"):
                name = f"{kind.replace('/', '-')}-{mode}"
                spec = CrawlSpec(kind, 1, args.sites, args.pages,
                                 profile={"rate": RATE_HZ, "out": str(pdir), "name": name, "gil": mode == "gil"})
                r = run_crawl(spec, None if kind == "memory" else server.url, "prof")
                raw = pdir / f"{name}-0.txt"
                summary = summarize_profile(raw, r["pages"])
                summary["pages_per_s_under_profiler"] = r["pages_per_s"]
                summary["worker_cpu_ms_per_page"] = r["worker_cpu_ms_per_page"]
                summary["raw"] = str(raw)
                res.setdefault(mode, {})[kind] = summary
    return res


def render_profiles(prof: dict[str, Any]) -> str:
    out = []
    for mode, title in (("gil", "GIL holder only (--gil)"), ("idle-off", "running or runnable threads (--idle off)")):
        if mode in prof:
            out.append(_render_mode(prof[mode], f"py-spy {prof['rate_hz']} Hz, {title}; ms per crawled page"))
    return "\n".join(out)


def _render_mode(prof: dict[str, Any], title: str) -> str:
    mem, ss = prof.get("memory"), prof.get("streams-sched")
    if not (mem and ss):
        return ""
    out = [f"### Where the time goes: {title}\n"]
    rows = []
    for kind in ("reactor", "pump", "other"):
        a, b = mem["threads"].get(kind, 0.0), ss["threads"].get(kind, 0.0)
        if a or b:
            rows.append([kind + " thread", a, b, b - a])
    rows.append(["all threads", sum(mem["threads"].values()), sum(ss["threads"].values()),
                 sum(ss["threads"].values()) - sum(mem["threads"].values())])
    rows.append(["process CPU (getrusage)", mem["worker_cpu_ms_per_page"], ss["worker_cpu_ms_per_page"],
                 ss["worker_cpu_ms_per_page"] - mem["worker_cpu_ms_per_page"]])
    rows.append(["pages/s under the profiler", mem["pages_per_s_under_profiler"], ss["pages_per_s_under_profiler"], "-"])
    out.append(table(["", "memory", "streams-sched", "difference"], rows))
    out.append("\nBy area (file of the innermost Python frame), reactor thread:\n")
    ma, sa = mem["areas"].get("reactor", {}), ss["areas"].get("reactor", {})
    names = sorted(set(ma) | set(sa), key=lambda n: -(sa.get(n, 0) + ma.get(n, 0)))
    out.append(table(["area", "memory", "streams-sched", "difference"],
                     [[n, ma.get(n, 0.0), sa.get(n, 0.0), sa.get(n, 0.0) - ma.get(n, 0.0)] for n in names]))
    pa = ss["areas"].get("pump", {})
    if pa:
        out.append("\nstreams-sched I/O thread by area:\n")
        out.append(table(["area", "ms/page"], [[n, v] for n, v in pa.items()]))
    out.append("\nKey functions (inclusive CPU ms/page):\n")
    rows = []
    for func in KEY_FUNCTIONS:
        vals = [mem["functions"].get(t, {}).get(func, 0.0) for t in ("reactor", "pump")]
        vals += [ss["functions"].get(t, {}).get(func, 0.0) for t in ("reactor", "pump")]
        if any(vals):
            rows.append([func, *vals])
    out.append(table(["function", "memory: reactor", "memory: pump", "streams-sched: reactor", "streams-sched: pump"], rows))
    return "\n".join(out) + "\n"
