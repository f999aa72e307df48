"""One request's trip, enqueue to ack, as the functions that carry it: at most 30, and as docs/development.md lists them.

A hop is a streams_sched function (or a Lua script) that receives the request or what
stands for it on its way: the ``scrapy.Request``, its ``Entry``, the payload bytes, the
leased entry, the ``Ack`` and the pipeline records and replies that hold them. Each
counts once, however often it is called: it is what a reader follows. The trip is
traced with ``sys.setprofile`` on an in-process worker (tests/harness.py), so the count
follows the code, not a hand list; the Lua side is counted by script, since Redis runs
it. Nothing else in the cycle (heartbeats, drain checks, stats) carries the request, so
it does not count.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections import deque
from pathlib import Path
from types import FrameType
from typing import Any

import scrapy
from harness import InProcessWorker

from streams_sched.frontier.records import Entry, LeasedEntry
from streams_sched.worker.exchange import Exchange

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = str(ROOT / "streams_sched")
MAX_HOPS = 30
URL = "http://trip.test/page"
SITE = "trip.test"
#: the scripts a request runs through on its trip: Redis runs them, so each counts one hop
LUA_HOPS = ("enqueue.lua", "lease.lua", "ack.lua")


#: the stream entry ids the request had in Redis, once leased: the ack carries only those
ENTRY_IDS: set[bytes] = set()


def _carries(value: Any, depth: int = 0) -> bool:
    """Whether ``value`` is, or holds, the request on its trip."""
    if depth > 6:
        return False
    if isinstance(value, scrapy.Request):
        return value.url == URL
    if isinstance(value, (Entry, LeasedEntry)):
        if value.site == SITE and isinstance(value, LeasedEntry):
            ENTRY_IDS.add(value.id)
        return value.site == SITE
    if isinstance(value, (bytes, bytearray, memoryview)):
        return URL.encode() in bytes(value) or bytes(value) in ENTRY_IDS
    if isinstance(value, (list, tuple, deque, set, frozenset)):
        return any(_carries(v, depth + 1) for v in value)
    if isinstance(value, dict):
        return any(_carries(v, depth + 1) for v in value.values())
    if isinstance(value, Exchange):
        return False  # the hub both threads share: handing it over is not a hop of the request
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_carries(getattr(value, f.name, None), depth + 1) for f in dataclasses.fields(value))
    return False


class Trip:
    """The streams_sched functions that receive the request, in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    @property
    def hops(self) -> list[str]:
        """Each function once, in the order the request first reached it."""
        return list(dict.fromkeys(self.calls))

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        code = frame.f_code
        if not code.co_filename.startswith(PACKAGE) or code.co_name.startswith("<"):
            return
        names = code.co_varnames[: code.co_argcount + code.co_kwonlyargcount]
        args = [frame.f_locals.get(n) for n in names if n not in ("self", "cls")]
        if any(_carries(a) for a in args):
            self.calls.append(f"{Path(code.co_filename).relative_to(PACKAGE).as_posix()}:{code.co_qualname}")


def trace_trip(redis_url: str, dedupe: str, crawl: str) -> list[str]:
    """Enqueue one request, lease it, hand it out and ack it, one I/O cycle at a time."""
    worker = InProcessWorker(redis_url, crawl, dedupe=dedupe)
    trip = Trip()
    ENTRY_IDS.clear()
    try:
        s = worker.scheduler
        sys.setprofile(trip)
        try:
            assert s.enqueue_request(scrapy.Request(URL))
            worker.run_cycle()  # the enqueue, and a lease call behind it
            request = worker.next_request()
            assert request.url == URL
            s.request_done(request)
            worker.settle()
        finally:
            sys.setprofile(None)
    finally:
        worker.close()
    return trip.hops + [f"frontier/lua/{name}" for name in LUA_HOPS]


def _documented() -> list[str]:
    """The hops docs/development.md lists under "Follow one request", in order."""
    page = (ROOT / "docs" / "development.md").read_text(encoding="utf-8")
    section = page.split("## Follow one request through the code", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\s*\d+\. `([^`]+)`", section, re.M)


def test_one_request_takes_at_most_30_hops_and_the_docs_list_them(redis_url: str, dedupe: str, crawl: str) -> None:
    """Traced enqueue -> enqueue.lua -> lease -> next_request -> ack: at most 30 hops, the same as docs/development.md's numbered list."""
    hops = trace_trip(redis_url, dedupe, crawl)
    assert len(hops) <= MAX_HOPS, "\n".join(hops)
    documented = _documented()
    assert sorted(documented) == sorted(hops), (
        "docs/development.md's trip differs from the traced one:\n" + "\n".join(f"{i}. `{h}`" for i, h in enumerate(hops, 1))
    )
