"""``streams-sched url``: where a URL is in a crawl, and why (:func:`find_url`).

A URL's site and fingerprint come from the one path of frontier/entries.py (its host, or
registered domain with STREAMS_SITE_KEY="domain", and Scrapy's fingerprint of a GET).
Then, in the site only:

- its seen filters (seen.lua, read-only): never seen, or seen, and how sure (an exact set
  is certain; a Bloom filter says seen for a URL it never took at most at its error rate);
- its inbox (one HGET), its six streams and its dead letters (XRANGE, ``chunk`` entries a
  call), its delayed requests (ZSCAN with the URL as MATCH pattern, ``chunk`` members a
  call: Redis filters them): queued (band, how many of the stream's backlog are ahead,
  when the site may be leased), leased (by which node, since when, after how many
  deliveries, when the lease expires), delayed (until when, and why: a retry, a
  Retry-After, a revisit and its stretch), tracked (interval, next visit, failures),
  dead (the reason);
- seen and in none of them: done.

What it costs Redis: one short call per ``chunk`` entries of the site (about 0.5 ms for
1,000), and it waits as long as each call took before the next, so it never holds more
than about half of one connection's share of Redis. A site with 1,000,000 queued requests
is 1,000 calls over a few seconds; every other site costs nothing. No Lua runs over a
backlog, and a read-only user can run it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import msgpack
from scrapy import Request

from streams_sched.frontier.client import Frontier
from streams_sched.frontier.entries import site_for, stored_fingerprint, url_facts
from streams_sched.frontier.keys import GROUP, STREAMS
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts import seen as seen_script
from streams_sched.frontier.sitekey import site_keyer
from streams_sched.transfer.records import queue_name
from streams_sched.transfer.sitereader import inbox_items

__all__ = ["Place", "UrlReport", "find_url"]


@dataclass
class Place:
    """One place the URL is in (a request of it: a URL can be queued and dead at once)."""

    state: str  # queued | leased | delayed | tracked | dead
    queue: str = ""
    #: queued: backlog entries of its stream before it
    ahead: int | None = None
    #: queued: when its site may be leased next (Redis ms; 0: now)
    site_ready_ms: int = 0
    node: str = ""
    leased_ms_ago: int = 0
    deliveries: int = 0
    lease_expires_ms: int = 0
    due_ms: int = 0
    why: str = ""
    interval_s: float = 0.0
    failures: int = 0
    reason: str = ""
    dead_at_ms: int = 0
    method: str = "GET"
    callback: str = ""
    priority: int = 0


@dataclass
class UrlReport:
    """Where a URL is, and what finding it cost."""

    url: str
    request_url: str
    site: str
    fingerprint: str
    #: None: not asked (a URL of a site the crawl never had)
    seen: bool | None = None
    #: "exact" (certain) or "bloom" (a yes may be a false positive, at most the error rate)
    seen_by: str = ""
    error_rate: float = 0.0
    places: list[Place] = field(default_factory=list)
    now_ms: int = 0
    calls: int = 0
    entries_read: int = 0

    @property
    def verdict(self) -> str:
        if self.places:
            return ", ".join(sorted({p.state for p in self.places}))
        if self.seen:
            return "done" if self.seen_by == "exact" else "done (probably: a Bloom filter says seen)"
        return "never seen"

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["verdict"] = self.verdict
        return out


def _meta(payload: bytes) -> dict[str, Any]:
    try:
        d = msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=lambda c, b: None)
    except Exception:  # noqa: BLE001 - unreadable: nothing to say of it
        return {}
    return d if isinstance(d, dict) else {}


def _describe(place: Place, d: dict[str, Any]) -> Place:
    place.method = str(d.get("m", "GET"))
    place.callback = str(d.get("c", "")) if d.get("c") else ""
    place.priority = int(d.get("p", 0)) if isinstance(d.get("p", 0), int) else 0
    return place


def _why_delayed(d: dict[str, Any], stretch: float) -> tuple[str, float, int]:
    """(why, interval s, failures) of a waiting request, from its meta."""
    mt = d.get("mt")
    meta: dict[str, Any] = mt if isinstance(mt, dict) else {}
    state = meta.get("_rv")
    if isinstance(state, list) and state and isinstance(state[0], (int, float)):
        failures = sum(int(v) for v in state[2:4] if isinstance(v, int))
        why = "a revisit (tracked page)" + (f", its schedule stretched x{stretch:g} to fit the site's rate" if stretch > 1 else "")
        return why, state[0] / 1000.0, failures
    retries = meta.get("retry_times")
    if meta.get("not_before") is not None and retries:
        return f"a retry (retry_times={retries}) after the site's Retry-After", 0.0, 0
    if retries:
        return f"a retry (retry_times={retries})", 0.0, 0
    if meta.get("not_before") is not None:
        return "meta['not_before'] (a Retry-After, or the spider's own)", 0.0, 0
    return "a delay", 0.0, 0


def _glob(text: bytes) -> bytes:
    out = bytearray()
    for b in text:
        if b in b"*?[]\\":
            out += b"\\"
        out.append(b)
    return bytes(out)


class _Scan:
    """Chunked reads of one site, paced: after each call it waits as long as the call took."""

    def __init__(self, frontier: Frontier, chunk: int, report: UrlReport) -> None:
        self.client = frontier.client
        self.chunk = chunk
        self.report = report

    def _paced(self, started: float) -> None:
        self.report.calls += 1
        time.sleep(min(0.05, time.monotonic() - started))

    def stream(self, key: str) -> Iterator[tuple[bytes, dict[bytes, bytes]]]:
        cursor = b"-"
        while True:
            t = time.monotonic()
            rows: list[Any] = self.client.xrange(key, cursor, "+", count=self.chunk) or []
            self._paced(t)
            self.report.entries_read += len(rows)
            yield from rows
            if len(rows) < self.chunk:
                return
            cursor = b"(" + rows[-1][0]

    def delayed(self, key: str, needle: bytes) -> Iterator[tuple[bytes, float]]:
        cursor = 0
        pattern = b"*" + _glob(needle) + b"*"
        while True:
            t = time.monotonic()
            cursor, rows = self.client.zscan(key, cursor, match=pattern, count=self.chunk)
            found: list[Any] = rows
            self._paced(t)
            self.report.entries_read += len(found)
            yield from found
            if int(cursor) == 0:
                return


def find_url(frontier: Frontier, url: str, *, fingerprinter: Any = None, site: str | None = None,
           chunk: int = 1000) -> UrlReport:
    """Where ``url`` is in the crawl (see the module docstring). ValueError for a URL Scrapy
    refuses."""
    from scrapy.utils.request import RequestFingerprinter

    request_url = url_facts(url)[0]
    meta = frontier.crawl_meta()
    site = site or site_for(Request(request_url), site_keyer(meta.get("site_key") or "host"))
    fp = stored_fingerprint(request_url, fingerprinter or RequestFingerprinter())
    f = frontier
    now_s, now_us = f.client.time()
    report = UrlReport(url, request_url, site, fp.hex(), now_ms=int(now_s) * 1000 + int(now_us) // 1000,
                       error_rate=f.bloom.error_rate)
    k = f.site(site)
    if not f.client.sismember(k.index.sites, site):
        report.seen = False
        return report
    answers = seen_script.call(f, site, [fp]).run()
    report.calls += 1
    hits = [a for a in answers if a.seen[0]]
    report.seen = bool(hits)
    report.seen_by = hits[0].form if hits else (answers[0].form if answers else "exact")
    needle = msgpack.packb(request_url, use_bin_type=True)
    scan = _Scan(f, chunk, report)
    pipe = f.client.pipeline(transaction=False)
    pipe.hget(k.index.inbox, site)
    pipe.hgetall(k.stats)
    pipe.hgetall(f.keys.nodes)
    for index in k.index.readies:
        pipe.zscore(index, site)
    inbox, raw_stats, nodes, *ready = pipe.execute()
    report.calls += 1
    stats = {text(a): text(b) for a, b in (raw_stats or {}).items()}
    stretch = max(1000, int(float(stats.get("stretch", 1000) or 1000))) / 1000.0
    lease_s = _lease_s(nodes)
    ready_ms = min((int(float(r)) for r in ready if r is not None), default=0)
    for item in inbox_items(inbox or b""):
        if needle in item.payload and _meta(item.payload).get("u") == request_url:
            d = _meta(item.payload)
            report.places.append(_describe(Place("queued", queue_name(item.stream), ahead=None,
                                                 site_ready_ms=ready_ms), d))
    for s, key in enumerate(k.streams):
        _stream_places(f, scan, s, key, needle, request_url, ready_ms, lease_s, report)
    for member, score in scan.delayed(k.delayed, needle):
        code, _, payload = (member.split(b":", 2) + [b"", b""])[:3]
        d = _meta(payload)
        if d.get("u") != request_url:
            continue
        why, interval, failures = _why_delayed(d, stretch)
        state = "tracked" if interval else "delayed"
        stream = int(code) - 1 if code.isdigit() else 0
        report.places.append(_describe(Place(state, queue_name(stream) if 0 <= stream < len(STREAMS) else "",
                                             due_ms=int(score), why=why, interval_s=interval, failures=failures), d))
    for _, fields in scan.stream(k.dlq):
        payload = fields.get(b"r", b"")
        if needle not in payload:
            continue
        d = _meta(payload)
        if d.get("u") != request_url:
            continue
        report.places.append(_describe(Place(
            "dead", reason=text(fields.get(b"reason", b"")), node=text(fields.get(b"node", b"")),
            deliveries=int(float(text(fields.get(b"deliveries", b"0")) or 0)),
            dead_at_ms=int(float(text(fields.get(b"ts", b"0")) or 0))), d))
    return report


def _lease_s(nodes: dict[Any, Any]) -> dict[str, float]:
    out: dict[str, float] = {}
    for node, raw in (nodes or {}).items():
        try:
            out[text(node)] = float(json.loads(raw).get("lease_s") or 0)
        except (ValueError, TypeError, AttributeError):
            continue
    return out


def _stream_places(f: Frontier, scan: _Scan, s: int, key: str, needle: bytes, request_url: str, ready_ms: int,
                   lease_s: dict[str, float], report: UrlReport) -> None:
    if not f.client.exists(key):
        return
    delivered = b""
    for g in f.client.xinfo_groups(key):
        if text(g.get("name", b"")) == GROUP:
            delivered = g.get("last-delivered-id") or b""
    delivered_at = _id(delivered)
    ahead = 0
    for entry_id, fields in scan.stream(key):
        backlog = _id(entry_id) > delivered_at
        payload = fields.get(b"r", b"")
        if needle in payload and _meta(payload).get("u") == request_url:
            d = _meta(payload)
            if backlog:
                report.places.append(_describe(Place("queued", queue_name(s), ahead=ahead, site_ready_ms=ready_ms,
                                                     deliveries=int(fields.get(b"d", b"0") or 0)), d))
            else:
                held = f.client.xpending_range(key, GROUP, min=entry_id, max=entry_id, count=1)
                report.calls += 1
                node, idle, count = "", 0, 0
                if held:
                    node, idle, count = text(held[0]["consumer"]), int(held[0]["time_since_delivered"]), \
                        int(held[0]["times_delivered"])
                since = report.now_ms - idle
                expires = since + int(lease_s.get(node, 0) * 1000) if lease_s.get(node) else 0
                report.places.append(_describe(Place(
                    "leased", queue_name(s), node=node, leased_ms_ago=idle,
                    deliveries=count + int(fields.get(b"d", b"0") or 0), lease_expires_ms=expires), d))
        if backlog:
            ahead += 1


def _id(value: bytes | str) -> tuple[int, int]:
    raw = value.encode() if isinstance(value, str) else value
    ms, _, seq = raw.partition(b"-")
    return (int(ms or 0), int(seq or 0)) if raw else (0, 0)
