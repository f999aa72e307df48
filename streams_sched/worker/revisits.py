"""Tracked pages: when a page comes back, and what its ack carries (reactor thread).

A page is tracked through ``meta["revisit"]`` (seconds, or a dict with ``every``, ``min``,
``max``, ``adaptive``; ``0`` or ``False`` = not tracked), its site's policy ``revisit``
(politeness/policy.py) or, for every page of a crawl, ``STREAMS_REVISIT_EVERY_SECONDS``. The I/O thread keeps a tracked page's payload as it was
leased (io/leasing.py), and the page's ack carries the request back with its next visit:
ack.lua deletes the entry and puts the payload in the site's delayed ZSET in one script,
so a page is never lost or scheduled twice between the two.

The page's state travels in its own request, ``meta["revisit_state"]``:

- ``i``: the current interval (seconds),
- ``s``: the signature of the last answer (adaptive pages),
- ``f``: permanent failures (404, 410) in a row,
- ``t``: temporary failures (no answer, 429, 5xx) in a row,

so nothing per tracked page lives outside its delayed entry. :func:`next_visit` is the
pure decision; :class:`Revisits` feeds it from Scrapy's signals and builds the ack.
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scrapy import Request

from streams_sched.config import StreamsConfig
from streams_sched.errors import SerializationError
from streams_sched.frontier.records import LeasedEntry
from streams_sched.politeness.policy import parse_revisit
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.ops import Ack

__all__ = ["PERMANENT", "Revisits", "Spec", "Visit", "next_visit", "signature_of", "spec_of"]

logger = logging.getLogger(__name__)

#: answers that count towards STREAMS_REVISIT_STOP_AFTER: the page is gone
PERMANENT = frozenset((404, 410))
#: the status a tracked page's ack counts when Scrapy followed its redirect (Scrapy's
#: response_received does not fire for it): an answer, neither changed nor a failure
REDIRECTED = 300
#: the meta key of a page's tracking state
STATE = "revisit_state"


@dataclass(frozen=True, slots=True)
class Spec:
    """How one page is tracked: its first interval, whether it adapts, and the bounds (s)."""

    every_s: float
    adaptive: bool
    min_s: float
    max_s: float


@dataclass(frozen=True, slots=True)
class Visit:
    """The next visit of a page: seconds until it, the state it carries, what this visit
    found ('c' changed, 'u' unchanged, '' neither), and the page's interval (s), which
    the delay differs from by jitter and a temporary failure's back-off."""

    delay_s: float
    state: dict[str, Any]
    found: str
    interval_s: float


def spec_of(value: Any, config: StreamsConfig) -> Spec | None:
    """The tracking of a page whose ``meta["revisit"]`` is ``value`` (None: not set), or
    None when it is not tracked. Raises ValueError on a value that means nothing."""
    c = config
    if value is None:
        value = c.revisit_every_seconds
    if value is False or value is None:
        return None
    if isinstance(value, Mapping):
        every = float(value.get("every", c.revisit_every_seconds) or 0)
        adaptive = bool(value.get("adaptive", c.revisit_adaptive))
        lo = float(value.get("min", c.revisit_min_seconds))
        hi = float(value.get("max", c.revisit_max_seconds))
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        every, adaptive, lo, hi = float(value), c.revisit_adaptive, c.revisit_min_seconds, c.revisit_max_seconds
    else:
        raise ValueError(f"meta['revisit'] must be seconds or a dict with every/min/max/adaptive, not {value!r}")
    if every <= 0:
        return None
    if lo > hi:
        raise ValueError(f"meta['revisit'] has min {lo} above max {hi}")
    return Spec(every, adaptive, lo, hi)


def signature_of(body: bytes) -> str:
    """The default change signature of an answer: a short hash of its body."""
    return hashlib.blake2b(body, digest_size=8).hexdigest()


def next_visit(
    spec: Spec, state: Mapping[str, Any], status: int | None, signature: str | None, config: StreamsConfig,
    jitter: float,
) -> Visit | None:
    """The page's next visit after an answer (``status`` None: no answer, a download error),
    or None when it is no longer tracked. ``jitter`` is drawn from [-1, 1].

    A 404 or 410 counts towards STREAMS_REVISIT_STOP_AFTER and keeps the interval. Any
    other failure (no answer, 429, 5xx) keeps the interval and backs the next visit off:
    each one in a row doubles the delay, up to STREAMS_REVISIT_BACKOFF_LIMIT times the
    interval (and the page's ``max``), so a site that is down is asked less and less
    often, and the first good answer brings the page back to its interval. An adaptive
    page's interval is multiplied by the changed or unchanged factor when its signature
    can be compared with the last one, within its bounds; a fixed page keeps ``every``.
    """
    interval = float(state.get("i") or spec.every_s)
    fails = int(state.get("f") or 0)
    temporary = int(state.get("t") or 0)
    last = state.get("s")
    found = ""
    out: dict[str, Any] = {"i": interval}
    backoff = 1.0
    if status in PERMANENT:
        fails += 1
        temporary = 0
        if fails >= config.revisit_stop_after:
            return None
    elif status is None or status == 429 or status >= 500:
        temporary += 1
        backoff = min(2.0 ** temporary, float(config.revisit_backoff_limit))
    else:
        fails = 0
        temporary = 0
        if spec.adaptive and signature is not None:
            if last is not None:
                changed = signature != last
                found = "c" if changed else "u"
                factor = config.revisit_changed_factor if changed else config.revisit_unchanged_factor
                interval = min(spec.max_s, max(spec.min_s, interval * factor))
                out["i"] = interval
            last = signature
    if last is not None:
        out["s"] = last
    if fails:
        out["f"] = fails
    if temporary:
        out["t"] = temporary
    delay = interval * (1.0 + config.revisit_jitter * jitter)
    if backoff > 1.0:
        delay = max(delay, min(interval * backoff, spec.max_s))
    return Visit(max(0.0, delay), out, found, interval)


def _ms(seconds: Any) -> int:
    """An interval in whole ms, the same way for the visit that adds it to its site's demand
    and the one that takes it away (0: none)."""
    try:
        return max(0, round(float(seconds or 0) * 1000))
    except (TypeError, ValueError):
        return 0


class Revisits:
    """The reactor thread's part of tracking: answers seen per tracked request in flight,
    the URLs of those requests (a retry copy of one is not tracked on its own), and the
    acks that carry each one's next visit."""

    def __init__(
        self, config: StreamsConfig, codec: RequestCodec, is_tracked: Callable[[Request], bool],
        rand: Callable[[], float] = random.random,
    ) -> None:
        """``is_tracked``: whether a request holds a tracked lease (the scheduler's)."""
        self.config = config
        self.is_tracked = is_tracked
        self.codec = codec
        self.rand = rand
        #: every page of the crawl is tracked
        self.track_all = config.revisit_every_seconds > 0
        #: URL -> tracked requests in flight with it
        self.live: dict[str, int] = {}
        #: whether the crawl's tracking was stopped (the frontier's, once the worker runs)
        self.crawl_stopped: Callable[[], bool] = lambda: False
        #: tracked request in flight -> (status, body signature) of its answer
        self.answers: dict[Request, tuple[int, str]] = {}
        #: URLs of tracked requests in flight that answered with a redirect
        self.redirected: set[str] = set()

    def handed_out(self, request: Request) -> None:
        """A tracked request went to the engine."""
        self.live[request.url] = self.live.get(request.url, 0) + 1

    def on_response(self, response: Any, request: Request, spider: Any = None) -> None:
        """Scrapy's response_received: remember a tracked request's answer."""
        if request.url in self.live and self.is_tracked(request):
            self.answers[request] = (response.status, signature_of(response.body))

    def copy_of_tracked(self, request: Request) -> bool:
        """Whether ``request`` is a copy Scrapy made of a tracked request in flight, which is
        then crawled once and not tracked on its own (the page's own ack schedules its next
        visit): a retry's (dont_filter, the same URL) or a redirect's (``redirect_urls``
        starts with its URL; the page stays tracked by the URL it was tracked by, and its
        ack counts the redirect as an answer, not as a failure to back off from)."""
        if request.dont_filter and request.url in self.live:
            self.untrack_copy(request)
            return True
        urls = request.meta.get("redirect_urls")
        if urls and urls[0] in self.live:
            self.untrack_copy(request)
            self.redirected.add(urls[0])
            return True
        return False

    def untrack_copy(self, request: Request) -> None:
        """``request`` is a copy of a tracked request in flight: it is not tracked on its own,
        whether by its meta, the crawl's setting or its site's policy."""
        meta = request.meta
        meta["revisit"] = False
        meta.pop(STATE, None)

    def ack(self, entry: LeasedEntry, request: Request) -> Ack:
        """The ack of a tracked page (``entry.payload``: its request as leased): its next
        visit, or -1 when it is no longer tracked, with its interval before and after this
        visit (ms; its site's revisit demand counts them, 0 = not counted)."""
        url = request.url
        n = self.live.get(url, 0)
        if n > 1:
            self.live[url] = n - 1
        else:
            self.live.pop(url, None)
        status, body_sig = self.answers.pop(request, (None, None))
        if url in self.redirected:
            self.redirected.discard(url)
            if status is None:
                status = REDIRECTED
        payload = entry.payload
        assert payload is not None
        try:
            kept = self.codec.decode(payload)
            meta = kept.meta
            state = meta.get(STATE)
            first = not isinstance(state, Mapping)
            prev_ms = 0 if first else _ms(state.get("i"))
            if entry.revisit == "off" or self.crawl_stopped():
                # tracking stopped (streams-sched revisits --stop): a page tracked until now
                # leaves the site's tracked count
                return Ack(entry) if first else Ack(entry, (-1, "", b"", 0, prev_ms))
            if "revisit" not in meta and entry.revisit:
                # tracked by its site's policy: the page keeps it in its own meta from now
                # on, so whoever takes its lease over knows it is tracked
                meta["revisit"] = parse_revisit(entry.revisit)
            spec = spec_of(meta.get("revisit"), self.config)
        except (ValueError, SerializationError) as exc:
            logger.warning("not tracking %s: %s", url, exc)
            return Ack(entry)
        flags_new = "n" if first else ""
        if spec is None:
            return Ack(entry) if first else Ack(entry, (-1, "", b"", 0, prev_ms))
        signature = request.meta.get("revisit_signature")
        signature = str(signature) if signature is not None else body_sig
        visit = next_visit(spec, {} if first else state, status, signature, self.config, 2 * self.rand() - 1)
        if visit is None:
            return Ack(entry, (-1, flags_new, b"", 0, prev_ms))
        meta[STATE] = visit.state
        try:
            again = self.codec.encode(kept)
        except SerializationError as exc:
            logger.warning("visiting %s again with its state as it was: %s", url, exc)
            again = payload
        return Ack(entry, (int(visit.delay_s * 1000), flags_new or visit.found, again, _ms(visit.interval_s), prev_ms))

    def clear(self) -> None:
        """The worker closed: forget the tracked requests in flight."""
        self.live.clear()
        self.answers.clear()
        self.redirected.clear()
