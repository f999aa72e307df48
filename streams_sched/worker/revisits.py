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
from email.utils import formatdate, parsedate_to_datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scrapy import Request

from streams_sched.config import StreamsConfig
from streams_sched.errors import SerializationError
from streams_sched.frontier.records import LeasedEntry
from streams_sched.politeness.policy import parse_revisit
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker import freshness
from streams_sched.worker.ops import Ack

__all__ = ["PERMANENT", "Revisits", "Spec", "Visit", "next_visit", "pack_state", "signature_of", "spec_of", "unpack_state"]

logger = logging.getLogger(__name__)

#: answers that count towards STREAMS_REVISIT_STOP_AFTER: the page is gone
PERMANENT = frozenset((404, 410))
#: the status a tracked page's ack counts when Scrapy followed its redirect (Scrapy's
#: response_received does not fire for it): an answer, neither changed nor a failure
REDIRECTED = 300
#: a conditional revisit's answer when the page has not changed
NOT_MODIFIED = 304
#: the meta key of a page's tracking state (short: it is in every waiting page)
STATE = "_rv"
#: the least age a dated answer counts (s): Date and Last-Modified are whole seconds, so
#: a page changed in the second of the answer shows 0
MIN_AGE_S = 0.5


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
    found ('c' changed, 'u' unchanged, 'e' a first visit's estimate from the page's
    Last-Modified, '' neither), and the page's interval (s), which
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


#: the state's fields after the interval, in their order in meta (see the module docstring)
_FIELDS = ("s", "f", "t", "n", "x", "o", "l", "e", "m")
#: fields kept in ms in meta and in seconds in the state dict
_MS = frozenset(("o", "l"))
#: the last visit's Redis time is kept modulo 2**32 ms (49.7 days), in 5 bytes of msgpack
#: rather than 9, which keeps a waiting page's ZSET member in its allocator size class
#: (128 B); a page whose interval is longer than :data:`_WRAP_SAFE_S` counts its interval
#: as the time a visit spanned
_WRAP_MS = 2**32
_WRAP_SAFE_S = 40 * 86400.0


def pack_state(state: Mapping[str, Any]) -> list[Any]:
    """The state dict as it travels in meta: [interval ms, signature, permanent failures,
    temporary failures, visits compared, changes seen, ms those visits spanned, Redis ms of
    the last visit, ETag, Last-Modified (epoch s)], trailing empty values left out."""
    out: list[Any] = [round(float(state.get("i") or 0) * 1000)]
    for key in _FIELDS:
        value = state.get(key)
        if key in _MS:
            value = round(float(value) * 1000) if value else 0
            if key == "l":
                value %= _WRAP_MS
        elif key in ("f", "t", "n", "x", "m"):
            value = value or 0
        out.append(value)
    while len(out) > 1 and not out[-1]:
        out.pop()
    return out


def unpack_state(packed: Any) -> dict[str, Any] | None:
    """The state dict of ``meta["_rv"]``, or None when it is not a tracked page's."""
    if not isinstance(packed, (list, tuple)) or not packed or not isinstance(packed[0], (int, float)):
        return None
    state: dict[str, Any] = {"i": packed[0] / 1000.0}
    for key, value in zip(_FIELDS, packed[1:]):
        if value:
            state[key] = value / 1000.0 if key in _MS else value
    return state


def next_visit(
    spec: Spec, state: Mapping[str, Any], status: int | None, signature: int | str | None, config: StreamsConfig,
    jitter: float, *, mu: float | None = None, at_s: float | None = None, age_s: float | None = None,
) -> Visit | None:
    """The page's next visit after an answer (``status`` None: no answer, a download error),
    or None when it is no longer tracked. ``jitter`` is drawn from [-1, 1]; ``mu`` is the
    site's freshness multiplier as the lease carried it (None: unknown), ``at_s`` the Redis
    time of this visit (its entry's id).

    A 404 or 410 counts towards STREAMS_REVISIT_STOP_AFTER and keeps the interval. Any
    other failure (no answer, 429, 5xx) keeps the interval and backs the next visit off:
    each one in a row doubles the delay, up to STREAMS_REVISIT_BACKOFF_LIMIT times the
    interval (and the page's ``max``), so a site that is down is asked less and less
    often, and the first good answer brings the page back to its interval. A 304 is an
    unchanged answer. An adaptive page whose signature can be compared with the last one
    counts the visit in its change-rate estimate; under the freshness rule, with the
    site's multiplier known, its interval is the one that spends the site's budget best
    (worker/freshness.py), otherwise it is multiplied by the changed or unchanged factor
    (Nutch's rule); within its bounds either way. A fixed page keeps ``every``.
    """
    interval = float(state.get("i") or spec.every_s) if spec.adaptive else spec.every_s
    interval = min(spec.max_s, max(spec.min_s, interval)) if spec.adaptive else interval
    fails = int(state.get("f") or 0)
    temporary = int(state.get("t") or 0)
    last = state.get("s")
    found = ""
    out: dict[str, Any] = {k: state[k] for k in ("n", "x", "o", "l", "e", "m") if state.get(k)}
    out["i"] = interval
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
        if status == NOT_MODIFIED:
            signature = last
        if spec.adaptive and signature is not None:
            if last is not None:
                changed = signature != last
                found = "c" if changed else "u"
                interval = _adapt(spec, state, out, changed, interval, config, mu, at_s, age_s)
                out["i"] = interval
            elif config.revisit_rule == "freshness" and age_s is not None:
                # a first visit whose server dates the page's last change: its age is the
                # first estimate of its rate, so its first interval is the optimum's
                age = max(MIN_AGE_S, age_s)
                out.update(n=1, x=1, o=age)
                found = "e"
                if mu is not None:
                    interval = freshness.interval_for(freshness.estimate_rate_dated(1, age), mu, spec.min_s, spec.max_s)
                    out["i"] = interval
            last = signature
            if at_s is not None and config.revisit_rule == "freshness":
                out["l"] = at_s
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


def _adapt(
    spec: Spec, state: Mapping[str, Any], out: dict[str, Any], changed: bool, interval: float, config: StreamsConfig,
    mu: float | None, at_s: float | None, age_s: float | None = None,
) -> float:
    """An adaptive page's next interval after a compared visit: under the freshness rule
    the visit counts in the page's estimate (``out``'s n, x, o) first."""
    if config.revisit_rule != "freshness":
        factor = config.revisit_changed_factor if changed else config.revisit_unchanged_factor
        return min(spec.max_s, max(spec.min_s, interval * factor))
    since = state.get("l")
    spanned = interval
    if at_s is not None and since and interval < _WRAP_SAFE_S:
        spanned = ((round(at_s * 1000) - round(since * 1000)) % _WRAP_MS) / 1000.0 or interval
    # a page whose server dated this answer and the last one: a change is known to be
    # ``age_s`` old, so the visit adds only that much exposure
    dated = age_s is not None and bool(state.get("m"))
    exposed = spanned
    if dated and changed:
        exposed = min(spanned, max(MIN_AGE_S, age_s))  # type: ignore[arg-type]
    n, x, o = int(state.get("n") or 0) + 1, int(state.get("x") or 0) + int(changed), float(state.get("o") or 0) + exposed
    if n > freshness.WINDOW:
        n, x, o = n // 2, (x + 1) // 2 if x < n else n // 2, o * (n // 2) / n
    out.update(n=n, x=x, o=o)
    if mu is not None:
        rate = freshness.estimate_rate_dated(x, o) if dated else freshness.estimate_rate(n, x, o)
        return freshness.interval_for(rate, mu, spec.min_s, spec.max_s, interval)
    factor = config.revisit_changed_factor if changed else config.revisit_unchanged_factor
    return min(spec.max_s, max(spec.min_s, interval * factor))


def _unchanged(response: Any, **kwargs: Any) -> list[Any]:
    """The callback of a revisit answered 304: the page did not change, nothing to scrape."""
    return []


def _handles_304(request: Request, spider: Any) -> bool:
    """Whether the spider asked for 304 answers itself (HttpErrorMiddleware's rules)."""
    meta = request.meta
    if meta.get("handle_httpstatus_all"):
        return True
    if NOT_MODIFIED in meta.get("handle_httpstatus_list", ()):
        return True
    if NOT_MODIFIED in getattr(spider, "handle_httpstatus_list", ()):
        return True
    settings = getattr(getattr(spider, "crawler", None), "settings", None)
    if settings is not None:
        if settings.getbool("HTTPERROR_ALLOW_ALL") or NOT_MODIFIED in settings.getlist("HTTPERROR_ALLOWED_CODES"):
            return True
    return False


def _epoch_s(value: bytes | None) -> int | None:
    """A Last-Modified header as whole epoch seconds (None: absent or not a date)."""
    if not value:
        return None
    try:
        when = parsedate_to_datetime(value.decode("latin-1"))
    except (TypeError, ValueError, IndexError):
        return None
    seconds = int(when.timestamp())
    return seconds if 0 < seconds < 2**32 else None


def _entry_s(entry_id: bytes) -> float | None:
    """The Redis time of an entry's id (``ms-seq``), in seconds: when its visit was
    enqueued or became due."""
    try:
        return int(entry_id.split(b"-", 1)[0]) / 1000.0
    except ValueError:
        return None


def _keep_validators(state: dict[str, Any], etag: str | None, modified: int | None) -> None:
    """Keep the validators a page answered with in its state (an ETag as the server sent it)."""
    state.pop("e", None)
    state.pop("m", None)
    if etag:
        state["e"] = etag
    if modified:
        state["m"] = modified


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
        #: tracked request in flight -> (status, body signature, ETag, Last-Modified) of its answer
        self.answers: dict[Request, tuple[int, int, str | None, int | None, int | None]] = {}
        #: URLs of tracked requests in flight that answered with a redirect
        self.redirected: set[str] = set()
        #: tracked requests in flight sent with the validators of their last answer
        self.conditional: set[Request] = set()
        #: connects :meth:`on_response` to Scrapy's response_received (the scheduler's),
        #: called when the first tracked request goes to the engine: a crawl that tracks
        #: nothing gets no signal handler called for every response
        self.listen: Callable[[], None] | None = None
        self.listening = False

    def handed_out(self, request: Request) -> None:
        """A tracked request went to the engine: a revisit asks with the validators of the
        page's last answer (unless the request or the crawl turned that off, or the spider
        set the header itself)."""
        if not self.listening and self.listen is not None:
            self.listening = True
            self.listen()
        self.live[request.url] = self.live.get(request.url, 0) + 1
        if not self.config.revisit_conditional:
            return
        meta = request.meta
        packed = meta.get(STATE)
        if not isinstance(packed, list) or len(packed) < 9 or meta.get("revisit_conditional", True) is False:
            return
        state = unpack_state(packed) or {}
        headers = request.headers
        etag, modified = state.get("e"), state.get("m")
        asked = False
        if isinstance(etag, str) and b"If-None-Match" not in headers:
            headers[b"If-None-Match"] = etag
            asked = True
        if isinstance(modified, int) and b"If-Modified-Since" not in headers:
            headers[b"If-Modified-Since"] = formatdate(modified, usegmt=True)
            asked = True
        if asked:
            self.conditional.add(request)

    def on_response(self, response: Any, request: Request, spider: Any = None) -> None:
        """Scrapy's response_received: remember a tracked request's answer and its validators.

        A 304 to a conditional revisit is the page unchanged: unless the spider handles 304
        itself (``handle_httpstatus_list`` / ``handle_httpstatus_all`` in the request's meta,
        the spider's ``handle_httpstatus_list`` or ``HTTPERROR_ALLOWED_CODES``), the request's
        callback becomes one that yields nothing, so the spider sees neither a bodiless
        answer nor an ``HttpError``. The request is this lease's own copy: its next visit is
        built from the payload as leased, with its callback."""
        if request.url not in self.live or not self.is_tracked(request):
            return
        status = response.status
        headers = response.headers
        etag = headers.get(b"ETag")
        modified = _epoch_s(headers.get(b"Last-Modified"))
        # the server's clock at the answer: its Date less the Last-Modified is the page's
        # age, both on the server's clock
        self.answers[request] = (status, signature_of(response.body), etag.decode("latin-1") if etag else None, modified,
                                 _epoch_s(headers.get(b"Date")))
        if status == NOT_MODIFIED and request in self.conditional and not _handles_304(request, spider):
            request.callback = _unchanged
            meta = request.meta
            meta["handle_httpstatus_list"] = [*meta.get("handle_httpstatus_list", ()), NOT_MODIFIED]

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
        if self.conditional and any(r.url == request.url for r in self.conditional):
            # a copy is crawled once and must get the page, not a 304 nobody reads
            for name in (b"If-None-Match", b"If-Modified-Since"):
                request.headers.pop(name, None)

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
        status, body_sig, etag, modified, date = self.answers.pop(request, (None, None, None, None, None))
        self.conditional.discard(request)
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
        dated = modified or (state or {}).get("m") if status == NOT_MODIFIED else modified
        age = float(date - dated) if date and isinstance(dated, int) and date >= dated else None
        given = request.meta.get("revisit_signature")
        signature = signature_of(str(given).encode()) if given is not None else body_sig
        visit = next_visit(spec, state or {}, status, signature, self.config, 2 * self.rand() - 1,
                           mu=entry.mu, at_s=_entry_s(entry.id), age_s=age)
        if visit is None:
            return Ack(entry, (-1, flags_new, b"", 0, prev_ms))
        if status is not None and 200 <= status < 300:
            # the validators of this answer, for the next visit's conditional request
            _keep_validators(visit.state, etag, modified)
        elif status == NOT_MODIFIED:
            _keep_validators(visit.state, etag or visit.state.get("e"), modified or visit.state.get("m"))
        meta[STATE] = pack_state(visit.state)
        try:
            again = self.codec.encode(kept)
        except SerializationError as exc:
            logger.warning("visiting %s again with its state as it was: %s", url, exc)
            again = payload
        flags = ("e" if visit.found == "e" else flags_new) if first else visit.found
        return Ack(entry, (int(visit.delay_s * 1000), flags, again, _ms(visit.interval_s), prev_ms))

    def clear(self) -> None:
        """The worker closed: forget the tracked requests in flight."""
        self.live.clear()
        self.answers.clear()
        self.redirected.clear()
        self.conditional.clear()
