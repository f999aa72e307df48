"""What a benchmark worker measures about itself, as a Scrapy extension.

- counts Redis round trips client-side: every ``send_packed_command`` of
  redis-py is one request on the wire, and a pipeline sends all its commands
  with one such call, so a pipeline counts 1 (the health-check PING and the
  connection handshake count too, they are real round trips);
- holds the crawl at ``spider_opened`` until the harness opens a start gate,
  so several workers (and the harness's Redis counters) start together;
- times the crawl from the gate to the last item, counts items and pages
  crawled twice, and the process CPU time;
- with ``BENCH_FIRST_FILE``, writes the time of the first item there as soon as it
  comes, and with ``BENCH_ITEM_TIMES``, keeps the time of every item: the harness
  of a crawl cut after a time window (bench/sites.py) needs both;
- times the garbage collector (each collection, by generation, from a
  ``gc.callbacks`` hook): a worker that keeps more objects alive across a
  collection pays for it here, apart from its own code;
- writes all of it as JSON to ``BENCH_RESULT_FILE`` when the spider closes.

Not part of streams-sched: imported only by ``bench/worker.py``.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import threading
import time
from array import array
from collections import Counter
from pathlib import Path
from typing import Any

from scrapy import signals

__all__ = ["BenchProbe", "install_round_trip_counter", "round_trips"]

#: thread name -> round trips sent by that thread
_ROUND_TRIPS: dict[str, int] = {}


def install_round_trip_counter() -> None:
    """Count every request redis-py puts on the wire, per thread (idempotent)."""
    from redis.connection import AbstractConnection

    if getattr(AbstractConnection.send_packed_command, "_bench_counted", False):
        return
    original = AbstractConnection.send_packed_command

    def send_packed_command(self: Any, command: Any, check_health: bool = True) -> Any:
        name = threading.current_thread().name
        _ROUND_TRIPS[name] = _ROUND_TRIPS.get(name, 0) + 1
        return original(self, command, check_health)

    send_packed_command._bench_counted = True  # type: ignore[attr-defined]
    AbstractConnection.send_packed_command = send_packed_command  # type: ignore[method-assign]


def round_trips() -> dict[str, int]:
    """Round trips so far, by thread kind ('reactor' = the main thread, 'io' = any other)."""
    out = {"reactor": 0, "io": 0}
    for name, n in _ROUND_TRIPS.items():
        out["reactor" if name == "MainThread" else "io"] += n
    return out


class GcTimer:
    """Seconds spent in collections and how many ran, per generation, since it was made."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started
            self.collections[info["generation"]] += 1

    def read(self) -> tuple[float, list[int]]:
        return self.seconds, list(self.collections)


def _cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def _peak_rss_kb() -> int:
    """This process's own peak RSS (VmHWM, KiB), 0 where /proc has none. Unlike the
    ru_maxrss its parent gets from wait4, it does not start from the parent's RSS at
    the fork: Linux carries that high-water mark across exec."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rusage() -> dict[str, float]:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"user_s": ru.ru_utime, "sys_s": ru.ru_stime, "vol_ctx": ru.ru_nvcsw, "invol_ctx": ru.ru_nivcsw}


_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu() -> dict[str, dict[str, float]]:
    """CPU seconds (user, sys) of each live thread, by kind: 'reactor', 'pump', 'other'."""
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, dict[str, float]] = {}
    for tid, name in names.items():
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        kind = "reactor" if name == "MainThread" else "pump" if name.startswith(("streams-sched-io", "streams-sched-pump")) else "other"
        acc = out.setdefault(kind, {"user_s": 0.0, "sys_s": 0.0, "run_s": 0.0, "runqueue_s": 0.0})
        acc["user_s"] += int(fields[11]) / _TICK
        acc["sys_s"] += int(fields[12]) / _TICK
        try:  # on the CPU, and runnable but waiting for a CPU (nanoseconds)
            run_ns, wait_ns, _ = Path(f"/proc/self/task/{tid}/schedstat").read_text().split()
            acc["run_s"] += int(run_ns) / 1e9
            acc["runqueue_s"] += int(wait_ns) / 1e9
        except (OSError, ValueError):
            pass
    return out


class BenchProbe:
    def __init__(self, crawler: Any) -> None:
        s = crawler.settings
        self.crawler = crawler
        self.result_file = s.get("BENCH_RESULT_FILE")
        self.ready_file = s.get("BENCH_READY_FILE")
        self.gate_file = s.get("BENCH_GATE_FILE")
        self.gate_timeout_s = s.getfloat("BENCH_GATE_TIMEOUT_SECONDS", 120.0)
        self.first_file = s.get("BENCH_FIRST_FILE")
        #: time of every item, when the harness wants them (8 bytes each)
        self.item_times: array[float] | None = array("d") if s.getbool("BENCH_ITEM_TIMES") else None
        self.t_first = 0.0
        self.items = 0
        self.urls: Counter[str] = Counter()
        self.t_go = 0.0
        self.t_last_sample = 0.0
        self.t_last = 0.0
        self.cpu_go = 0.0
        self.cpu_last = 0.0
        self.rt_go: dict[str, int] = {}
        self.rt_last: dict[str, int] = {}
        self.ru_go: dict[str, float] = {}
        self.ru_last: dict[str, float] = {}
        self.threads_go: dict[str, dict[str, float]] = {}
        self.threads_last: dict[str, dict[str, float]] = {}
        self.gc = GcTimer()
        self.gc_go = self.gc_last = self.gc.read()
        crawler.signals.connect(self.spider_opened, signals.spider_opened)
        crawler.signals.connect(self.item_scraped, signals.item_scraped)
        crawler.signals.connect(self.spider_closed, signals.spider_closed)

    @classmethod
    def from_crawler(cls, crawler: Any) -> BenchProbe:
        return cls(crawler)

    def spider_opened(self, spider: Any) -> None:
        # Blocking the reactor here is harmless: nothing is crawled before the gate.
        if self.ready_file:
            Path(self.ready_file).write_text(str(os.getpid()))
        if self.gate_file:
            deadline = time.monotonic() + self.gate_timeout_s
            while not os.path.exists(self.gate_file):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"start gate {self.gate_file} never opened")
                time.sleep(0.005)
        self.t_go = self.t_last = self.t_last_sample = time.time()
        self.cpu_go = self.cpu_last = _cpu_seconds()
        self.rt_go = self.rt_last = round_trips()
        self.ru_go = self.ru_last = _rusage()
        self.threads_go = self.threads_last = thread_cpu()
        self.gc_go = self.gc_last = self.gc.read()

    def item_scraped(self, item: Any, response: Any, spider: Any) -> None:
        now = time.time()
        if not self.items:
            self.t_first = now
            if self.first_file:
                # renamed into place, so the harness never reads a half-written time
                tmp = f"{self.first_file}.tmp"
                Path(tmp).write_text(repr(now))
                os.replace(tmp, self.first_file)
        if self.item_times is not None:
            self.item_times.append(now)
        self.items += 1
        self.urls[item["url"]] += 1
        self.t_last = now
        # cheap enough per item (two syscalls-free reads); keeps the tail (drain, close) out
        self.cpu_last = _cpu_seconds()
        self.rt_last = round_trips()
        self.gc_last = self.gc.read()
        if self.items % 256 == 0:
            self.t_last_sample = self.t_last
            self.ru_last = _rusage()
            self.threads_last = thread_cpu()

    def spider_closed(self, spider: Any, reason: str) -> None:
        t_closed = time.time()
        stats = self.crawler.stats.get_stats()
        rt_end = round_trips()
        result = {
            "reason": reason,
            "pid": os.getpid(),
            "peak_rss_kb": _peak_rss_kb(),
            "items": self.items,
            "unique_urls": len(self.urls),
            "repeats": sum(n - 1 for n in self.urls.values()),
            "urls": sorted(self.urls),
            "t_go": self.t_go,
            "t_first_item": self.t_first,
            "t_last_item": self.t_last,
            "t_closed": t_closed,
            "cpu_s": self.cpu_last - self.cpu_go,
            "cpu_total_s": _cpu_seconds() - self.cpu_go,
            "round_trips": {k: self.rt_last.get(k, 0) - self.rt_go.get(k, 0) for k in rt_end},
            "round_trips_total": {k: rt_end[k] - self.rt_go.get(k, 0) for k in rt_end},
            "rusage": {k: self.ru_last[k] - self.ru_go[k] for k in self.ru_go},
            "rusage_items": self.items - self.items % 256,
            "thread_cpu": {
                kind: {k: v - self.threads_go.get(kind, {}).get(k, 0.0) for k, v in acc.items()}
                | {"wall_s": self.t_last_sample - self.t_go}
                for kind, acc in self.threads_last.items()
            },
            # the collector, from the gate to the last item, as cpu_s
            "gc_s": self.gc_last[0] - self.gc_go[0],
            "gc_collections": [b - a for a, b in zip(self.gc_go[1], self.gc_last[1], strict=True)],
            "calls": dict(CALLS),
            "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))},
            # where the worker's streams_sched came from (a KIND@REV run: that revision's copy)
            "streams_sched_from": getattr(sys.modules.get("streams_sched"), "__file__", None),
        }
        if self.item_times is not None:
            # milliseconds after the gate: a third of the JSON of full timestamps
            result["item_ms"] = [round((t - self.t_go) * 1000, 1) for t in self.item_times]
        if self.result_file:
            Path(self.result_file).write_text(json.dumps(result))


#: name -> calls, for --count-calls (diagnostics; the wrappers cost time, so not in timed runs)
CALLS: dict[str, int] = {}


def _count(owner: Any, attr: str, label: str, none_label: str | None = None) -> None:
    original = getattr(owner, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        CALLS[label] = CALLS.get(label, 0) + 1
        result = original(*args, **kwargs)
        if none_label is not None and result is None:
            CALLS[none_label] = CALLS.get(none_label, 0) + 1
        return result

    setattr(owner, attr, wrapper)


def install_call_counters() -> None:
    """Count calls of the engine loop, scheduler methods, event-loop turns and pump cycles."""
    import asyncio.base_events

    from scrapy.core.engine import ExecutionEngine
    from scrapy.core.scheduler import Scheduler

    from bench.layout import first as _first
    from streams_sched.scheduler import StreamsScheduler

    # a KIND@REV worker may run a revision with the flat package layout
    EngineHooks = _first("streams_sched.worker.engine", "streams_sched._engine").EngineHooks
    Exchange = _first("streams_sched.worker.exchange", "streams_sched.exchange").Exchange
    io = _first("streams_sched.worker.io.cycle", "streams_sched.worker.io.pump", "streams_sched.pump")
    IOThread = getattr(io, "IOThread", None) or io.Pump

    _count(asyncio.base_events.BaseEventLoop, "_run_once", "event loop turns")
    _count(ExecutionEngine, "_start_scheduled_requests", "engine loop runs")
    _count(ExecutionEngine, "spider_is_idle", "engine spider_is_idle")
    for cls, name in ((Scheduler, "memory"), (StreamsScheduler, "streams")):
        _count(cls, "next_request", f"{name} next_request", f"{name} next_request -> None")
        _count(cls, "enqueue_request", f"{name} enqueue_request")
        _count(cls, "has_pending_requests", f"{name} has_pending_requests")
    _count(EngineHooks, "wake", "pump wake -> reactor")
    _count(IOThread, "_cycle", "I/O cycles")
    _count(Exchange, "kick", "pump kicks")
    try:
        from scrapy_redis.scheduler import Scheduler as SRScheduler

        _count(SRScheduler, "next_request", "scrapy-redis next_request", "scrapy-redis next_request -> None")
        _count(SRScheduler, "has_pending_requests", "scrapy-redis has_pending_requests")
    except ImportError:
        pass
