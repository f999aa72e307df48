"""Tracked pages: when a page comes back, and what its ack carries (reactor thread).

A page is tracked through ``meta["revisit"]`` (seconds, or a dict with ``every``, ``min``,
``max``, ``adaptive``; ``0`` or ``False`` = not tracked), its site's policy ``revisit``
(politeness/policy.py) or, for every page of a crawl, ``STREAMS_REVISIT_EVERY_SECONDS``. The I/O thread keeps a tracked page's payload as it was
leased (io/leasing.py), and the page's ack carries the request back with its next visit:
ack.lua deletes the entry and puts the payload in the site's delayed ZSET in one script,
so a page is never lost or scheduled twice between the two.

The page's state travels in its own request, ``meta["_rv"]``, as a short list (a waiting
page costs what the same request costs waiting as a delayed one; :func:`pack_state`):

- the current interval (whole ms),
- the signature of the last answer (adaptive pages; 32 bits of a hash),
- permanent failures (404, 410) in a row,
- temporary failures (no answer, 429, 5xx) in a row,

trailing empty values left out, so nothing per tracked page lives outside its delayed
entry. :func:`next_visit` is the pure decision, on the state as a dict (``i`` seconds,
``s``, ``f``, ``t``); :class:`Revisits` feeds it from Scrapy's signals and builds the ack.
A page tracked by its site's policy is not marked in its meta: every lease and takeover
of it carries the policy (lease.lua, claim.lua), so it follows the policy as it is at
each visit.
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

__all__ = ["PERMANENT", "Revisits", "Spec", "Visit", "next_visit", "pack_state", "signature_of", "spec_of", "unpack_state"]

logger = logging.getLogger(__name__)

#: answers that count towards STREAMS_REVISIT_STOP_AFTER: the page is gone
PERMANENT = frozenset((404, 410))
#: the status a tracked page's ack counts when Scrapy followed its redirect (Scrapy's
#: response_received does not fire for it): an answer, neither changed nor a failure
REDIRECTED = 300
#: the meta key of a page's tracking state (short: it is in every waiting page)
STATE = "_rv"


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


def signature_of(body: bytes) -> int:
    """The change signature of an answer's body, or of what the spider gave
    (``meta["revisit_signature"]``, as bytes): 32 bits of a hash, so a change goes unseen
    once in 4 billion changed visits. An integer, not bytes: the scripts read a waiting
    page's state with Redis' cmsgpack, which does not read msgpack's bin type."""
    return int.from_bytes(hashlib.blake2b(body, digest_size=4).digest(), "big")


def pack_state(state: Mapping[str, Any]) -> list[Any]:
    """The state dict as it travels in meta: [interval ms, signature, permanent failures,
    temporary failures], trailing empty values left out."""
    out: list[Any] = [round(float(state.get("i") or 0) * 1000), state.get("s"), state.get("f") or 0, state.get("t") or 0]
    while len(out) > 1 and not out[-1]:
        out.pop()
    return out


def unpack_state(packed: Any) -> dict[str, Any] | None:
    """The state dict of ``meta["_rv"]``, or None when it is not a tracked page's."""
    if not isinstance(packed, (list, tuple)) or not packed or not isinstance(packed[0], (int, float)):
        return None
    state: dict[str, Any] = {"i": packed[0] / 1000.0}
    for key, value in zip(("s", "f", "t"), packed[1:]):
        if value:
            state[key] = value
    return state


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
    interval = float(state.get("i") or spec.every_s) if spec.adaptive else spec.every_s
    interval = min(spec.max_s, max(spec.min_s, interval)) if spec.adaptive else interval
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
        self.answers: dict[Request, tuple[int, int]] = {}
        #: URLs of tracked requests in flight that answered with a redirect
        self.redirected: set[str] = set()
        #: connects :meth:`on_response` to Scrapy's response_received (the scheduler's),
        #: called when the first tracked request goes to the engine: a crawl that tracks
        #: nothing gets no signal handler called for every response
        self.listen: Callable[[], None] | None = None
        self.listening = False

    def handed_out(self, request: Request) -> None:
        """A tracked request went to the engine."""
        if not self.listening and self.listen is not None:
            self.listening = True
            self.listen()
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
            state = unpack_state(meta.get(STATE))
            first = state is None
            prev_ms = 0 if state is None else _ms(state.get("i"))
            if entry.revisit == "off" or self.crawl_stopped():
                # tracking stopped (streams-sched revisits --stop): a page tracked until now
                # leaves the site's tracked count
                return Ack(entry) if first else Ack(entry, (-1, "", b"", 0, prev_ms))
            if "revisit" not in meta and entry.revisit:
                # tracked by its site's policy, as it is now (a lease or a takeover carries it)
                spec = spec_of(parse_revisit(entry.revisit), self.config)
            else:
                spec = spec_of(meta.get("revisit"), self.config)
        except (ValueError, SerializationError) as exc:
            logger.warning("not tracking %s: %s", url, exc)
            return Ack(entry)
        flags_new = "n" if first else ""
        if spec is None:
            return Ack(entry) if first else Ack(entry, (-1, "", b"", 0, prev_ms))
        given = request.meta.get("revisit_signature")
        signature = signature_of(str(given).encode()) if given is not None else body_sig
        visit = next_visit(spec, state or {}, status, signature, self.config, 2 * self.rand() - 1)
        if visit is None:
            return Ack(entry, (-1, flags_new, b"", 0, prev_ms))
        meta[STATE] = pack_state(visit.state)
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
