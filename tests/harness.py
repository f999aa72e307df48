"""An in-process worker whose I/O cycles the test runs: no thread, no engine, a real Redis.

``StreamsScheduler(io_thread=False)`` opens without starting its I/O thread; the test
calls :meth:`InProcessWorker.run_cycle` where the thread would run one, so what the
reactor side queued and what one cycle sends, reads and decides happen in an order the
test chooses. :meth:`step` first waits for what the thread would wait for (the next
lease call, drain check or takeover that is due), bounded by a short cap, so tests do not
spin on a shard that backs off.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import scrapy
from scrapy.utils.request import RequestFingerprinter

from streams_sched.config import StreamsConfig
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.io.cycle import CycleResult, IOThread
from streams_sched.worker.scheduler import Limits, StreamsScheduler

__all__ = ["InProcessWorker"]

T = TypeVar("T")

#: longest a step waits for the I/O thread's next due time
STEP_WAIT_CAP_S = 0.2


class HarnessSpider(scrapy.Spider):
    name = "unit"

    def parse(self, response: Any) -> None:  # pragma: no cover - never called
        pass


class InProcessWorker:
    """A StreamsScheduler plus the cycles of its I/O thread, run by the test."""

    def __init__(
        self, redis_url: str, crawl: str, *, dedupe: str = "bitmap", limits: Limits | None = None,
        spider: scrapy.Spider | None = None, **settings: Any,
    ) -> None:
        config = StreamsConfig.from_settings(
            {"REDIS_URL": redis_url, "STREAMS_PREFIX": crawl, "STREAMS_DEDUPE": dedupe,
             "STREAMS_IDLE_POLL_SECONDS": 0.1, "STREAMS_FLUSH_INTERVAL_SECONDS": 0.005, **settings},
            "unit",
        )
        self.scheduler = StreamsScheduler(
            config, fingerprinter=RequestFingerprinter(), limits=limits or Limits(4, 4), io_thread=False,
        )
        self.scheduler.open(spider or HarnessSpider())
        assert self.io is not None and not self.io.is_alive()
        self.closed = False

    @property
    def io(self) -> IOThread:
        io = self.scheduler.io
        assert io is not None, "the worker is closed"
        return io

    @property
    def exchange(self) -> Exchange:
        return self.io.exchange

    def run_cycle(self) -> CycleResult:
        """One I/O cycle, now."""
        return self.io.run_cycle()

    def step(self) -> CycleResult:
        """One I/O cycle, once the thread would run it (at most STEP_WAIT_CAP_S from now)."""
        wait = min(self.io._wait_time(), STEP_WAIT_CAP_S)
        if wait > 0:
            time.sleep(wait)
        return self.run_cycle()

    def until(self, condition: Callable[[], T], *, cycles: int = 100, what: str = "") -> T:
        """Step until ``condition()`` is true; fail after ``cycles`` steps."""
        for _ in range(cycles):
            value = condition()
            if value:
                return value
            self.step()
        value = condition()
        assert value, f"not after {cycles} I/O cycles: {what or condition}"
        return value

    def next_request(self, cycles: int = 100) -> scrapy.Request:
        """The next request the scheduler hands out, stepping cycles until it has one."""
        return self.until(self.scheduler.next_request, cycles=cycles, what="a leased request")

    def crawl(self, n: int) -> set[str]:
        """Hand out ``n`` requests and finish each, as the engine would; return their URLs
        once every operation is confirmed."""
        urls = set()
        for _ in range(n):
            request = self.next_request()
            urls.add(request.url)
            self.scheduler.request_done(request)
        self.settle()
        return urls

    def settle(self, cycles: int = 100) -> None:
        """Step until every queued operation is sent and confirmed."""
        x = self.exchange
        self.until(lambda: not x.outbox and not self.io.gate, cycles=cycles, what="the operations to be confirmed")

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.scheduler.close("test")
