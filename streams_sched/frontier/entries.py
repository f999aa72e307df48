"""One path from a request to a queue entry.

Every way into a crawl turns a request into an :class:`~streams_sched.frontier.records.Entry`
here: the worker's ``StreamsScheduler.enqueue_request`` (follow-ups), the
:class:`~streams_sched.frontier.seeding.Seeder` (and ``streams-sched push`` on it), the
scrapy-redis feed and ``migrate-scrapy-redis``. :func:`entry_for` decides, in one place:

- the site: ``meta["site"]`` (validated), else the host name through STREAMS_SITE_KEY's
  ``site_of``, else ``"_nohost"`` (:func:`site_for`);
- ``meta["task_type"]``, checked; the band (``band_for``) and the stream (``stream_for``);
- callback and errback names, by the one rule of wire/callbacks.py (private names such
  as CrawlSpider's ``_callback`` included);
- the payload (the codec);
- the fingerprint: b"" for ``dont_filter``, else the fingerprinter's, hashed to 20 bytes
  with SHA-1 when it is not 20 bytes long (:func:`fingerprint_of`);
- the delay of ``meta["not_before"]`` (epoch seconds of Redis time: :func:`_delay_ms`) and
  scrapy-redis's fingerprint for a migrated dupefilter
  (:mod:`streams_sched.scrapy_redis.legacy`; read by frontier/batches.py).

:func:`url_entries` is a faster way to the same entries for URL strings with Scrapy's
default fingerprinter (a seeder's million URLs build no ``scrapy.Request``); it gives
byte for byte the entry :func:`entry_for` gives for ``Request(url)`` (tests/test_entry_path.py),
and turns itself off where this Scrapy or w3lib would disagree (:func:`facts_agree`).

A worker's own caches (the URL shortcut, the recently seen fingerprints) stay in the
scheduler: they decide whether to build an entry, not how.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlsplit

from scrapy import Request
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.httpobj import urlparse_cached
from scrapy.utils.request import RequestFingerprinter
from scrapy.utils.request import fingerprint as scrapy_fingerprint
from w3lib.url import canonicalize_url, safe_url_string

from streams_sched.errors import SerializationError
from streams_sched.frontier.keys import TASK_TYPES, band_for, stream_for, validate_site_name
from streams_sched.frontier.records import Entry
from streams_sched.scrapy_redis.legacy import legacy_fingerprint
from streams_sched.wire.callbacks import check_name
from streams_sched.wire.codec import RequestCodec

__all__ = [
    "FINGERPRINT_BYTES", "default_fingerprinter", "entry_for", "facts_agree", "fingerprint_of", "site_for",
    "stored_fingerprint", "url_entries", "url_facts",
]

logger = logging.getLogger(__name__)

#: Length of a fingerprint in the seen filters; other lengths are hashed to it.
FINGERPRINT_BYTES = 20


def fingerprint_of(request: Request, fingerprinter: Any) -> bytes:
    """The fingerprint the seen filters get for ``request``: b"" for ``dont_filter``
    (never deduped), else the fingerprinter's, made 20 bytes (SHA-1) if it is not."""
    if request.dont_filter:
        return b""
    fp: bytes = fingerprinter.fingerprint(request)
    if len(fp) != FINGERPRINT_BYTES:
        fp = hashlib.sha1(fp).digest()
    return fp


@functools.lru_cache(maxsize=4096)
def _named_site(site: Any) -> str:
    return validate_site_name(site)


def site_for(request: Request, site_of: Callable[[str], str] | None = None) -> str:
    """The site of ``request``: ``meta["site"]`` (SerializationError if it is not a site
    name), else its host name mapped by ``site_of`` (STREAMS_SITE_KEY; None: the host
    itself), else ``"_nohost"``."""
    site = request.meta.get("site")
    if site is None:
        host = urlparse_cached(request).hostname
        if not host:
            return "_nohost"
        return site_of(host) if site_of is not None else host
    try:
        return _named_site(site)
    except (ValueError, TypeError) as exc:  # TypeError: an unhashable meta["site"]
        raise SerializationError(repr(request), "meta['site']", str(exc)) from None


def _name_of(request: Request, func: Any, given: str | None, what: str, codec: RequestCodec) -> str | None:
    """The name a callback travels under when the caller gives one or the codec has no
    spider to name it by (the request's own function, by ``__name__``); None: the codec
    names it (with the spider), or there is none."""
    if given is None:
        if func is None or func is NO_CALLBACK or codec.spider is not None:
            return None
        given = getattr(func, "__name__", "")
    try:
        return check_name(given)
    except ValueError as exc:
        raise SerializationError(repr(request), what, str(exc)) from None


def _delay_ms(request: Request, not_before: Any, now: Callable[[], float]) -> int:
    """The delay ``meta["not_before"]`` asks for: epoch seconds on the crawl's clock (Redis
    TIME), so a retry another worker scheduled waits what it should whatever the clocks of
    the two workers say. A value a wall clock wrote is read the same way: off by that
    clock's error, never by the difference of two."""
    try:
        return max(0, int((float(not_before) - now()) * 1000))
    except (TypeError, ValueError):
        logger.error("ignoring meta['not_before']=%r of %s: not epoch seconds", not_before, request)
        return 0


def entry_for(
    request: Request,
    codec: RequestCodec,
    fingerprinter: Any,
    *,
    high_min: int = 1,
    low_max: int = -1,
    site_of: Callable[[str], str] | None = None,
    legacy: bool = False,
    callback: str | None = None,
    errback: str | None = None,
    fingerprint: bytes | None = None,
    now: Callable[[], float] = time.time,
) -> Entry:
    """The entry of ``request`` (see the module docstring). ``callback``/``errback`` name
    spider methods in place of the request's own; ``fingerprint`` is one computed already
    (:func:`fingerprint_of`, or a caller's own); ``legacy``: the crawl has a migrated
    scrapy-redis dupefilter; ``now``: Redis time, the clock ``meta["not_before"]`` is read
    on (every caller with a frontier passes its ``clock``; this process's wall clock is for
    tests without Redis). Raises SerializationError (meta, site, task type, callback,
    payload)."""
    meta = request.meta
    site = site_for(request, site_of)
    task = meta.get("task_type")
    if task is not None and task not in TASK_TYPES:
        raise SerializationError(
            repr(request), "meta['task_type']", f"unknown task type {task!r}; expected one of {list(TASK_TYPES)}"
        )
    # a worker's codec names the callbacks by its spider: nothing to name here
    named = codec.spider is None or callback is not None or errback is not None
    cb = _name_of(request, request.callback, callback, "callback", codec) if named else None
    eb = _name_of(request, request.errback, errback, "errback", codec) if named else None
    payload = codec.encode(request, cb, eb)
    fp = fingerprint_of(request, fingerprinter) if fingerprint is None else fingerprint
    stream = stream_for(task, band_for(request.priority, high_min, low_max))
    lfp = legacy_fingerprint(request) if legacy and fp else b""
    delay_ms = _delay_ms(request, meta["not_before"], now) if meta.get("not_before") else 0
    return Entry(fp, stream, delay_ms, payload, site, lfp, request.url)


# --- URL strings: what Request(url) and Scrapy's default fingerprinter make of them ---------

#: The JSON Scrapy's default fingerprinter hashes for a GET without body (json.dumps of
#: {"method", "url", "body", "headers"} with sort_keys), up to the URL.
_FP_HEAD = b'{"body": "", "headers": {}, "method": "GET", "url": '
#: A URL that safe_url_string and canonicalize_url leave as it is (but for the "/" of an
#: empty path, which canonicalize_url always adds and safe_url_string adds from w3lib 2.6): http(s), a lowercase host name whose last label
#: starts with a letter (no IP address, no IDNA, no port, no user), a path of unreserved
#: characters with no "." or ".." segment and no "//", no query, no fragment. Segments
#: are separated by exactly one "/", so a URL that does not match fails in linear time.
_PLAIN_URL = re.compile(
    r"https?://((?:[a-z0-9]+(?:-[a-z0-9]+)*\.)*[a-z][a-z0-9]*(?:-[a-z0-9]+)*)"
    r"(/(?:[A-Za-z0-9_~-][A-Za-z0-9_~.-]*(?:/[A-Za-z0-9_~-][A-Za-z0-9_~.-]*)*/?)?)?\Z"
)


#: Whether w3lib's safe_url_string gives an empty path its "/" (w3lib 2.6 and newer do:
#: ``Request("http://a.test").url == "http://a.test/"``; older releases keep the URL as
#: it is). Asked of the installed w3lib once, so the plain-URL path gives ``request.url``
#: as this Scrapy does on every release in range; the fingerprint is the same either way,
#: since canonicalize_url always adds the "/".
_SAFE_URL_ADDS_ROOT = safe_url_string("http://a.test") == "http://a.test/"


def url_facts(url: str) -> tuple[str, str | None, bytes]:
    """(``request.url``, its host name, its fingerprint) of ``Request(url)`` as Scrapy has
    them: the URL made safe, ``urlparse(request.url).hostname`` and the default
    RequestFingerprinter's fingerprint. Raises ValueError where Request(url) would."""
    m = _PLAIN_URL.match(url)
    if m is not None:
        canonical = url if m.group(2) else url + "/"
        safe = canonical if _SAFE_URL_ADDS_ROOT else url
        return safe, m.group(1), hashlib.sha1(_FP_HEAD + b'"' + canonical.encode() + b'"}').digest()
    safe = safe_url_string(url, "utf-8")
    if "://" not in safe and not safe.startswith(("about:", "data:")):
        raise ValueError(f"Missing scheme in request url: {safe}")
    host = urlsplit(safe).hostname
    canonical = canonicalize_url(safe)
    return safe, host, hashlib.sha1(_FP_HEAD + json.dumps(canonical).encode() + b"}").digest()


#: URLs checked against Scrapy itself before the first plain-URL entry of a process
_PROBE_URLS = (
    "http://s1.test/", "https://a-b.example.com/x/y.html", "http://a.test", "http://a.test/p/",
    "http://Ex.COM/p?b=2&a=1#f", "http://bücher.de/ü?q=ü", "http://a.test:8080/./x/../y",
    "HTTP://A.TEST:80/", "http://127.0.0.1/", "data:,x",
)


@functools.cache
def facts_agree() -> bool:
    """True if :func:`url_facts` agrees with this Scrapy and w3lib on the probe URLs; a
    version that changed how it makes URLs safe or fingerprints them turns the plain-URL
    path off (with a warning) instead of letting seeds dedupe apart from the workers."""
    fingerprinter = RequestFingerprinter()
    for url in _PROBE_URLS:
        request = Request(url)
        scrapy_facts = (request.url, urlparse_cached(request).hostname, fingerprinter.fingerprint(request))
        if url_facts(url) != scrapy_facts:
            logger.warning(
                "seeding: this Scrapy (or w3lib) fingerprints %r otherwise than streams-sched expects;"
                " every seed goes through scrapy.Request (slower)", url,
            )
            return False
    return True


def stored_fingerprint(
    url: str, fingerprinter: Any, *, method: str | None = None, body: bytes = b"", headers: Any = None,
    dont_filter: bool = False,
) -> bytes:
    """The fingerprint :func:`fingerprint_of` gives the Request of a request kept as data (a
    line of a dump): ``url`` as ``request.url`` is, its method, body and headers (what
    Scrapy's fingerprinters read; meta is not), b"" for ``dont_filter``. Raises ValueError
    for a URL Scrapy refuses."""
    if dont_filter:
        return b""
    if (method or "GET") == "GET" and not body and default_fingerprinter(fingerprinter) and facts_agree():
        return url_facts(url)[2]
    request = Request(url, method=method or "GET", body=body or b"", headers=headers)
    return fingerprint_of(request, fingerprinter)


def default_fingerprinter(fingerprinter: Any) -> bool:
    """True for Scrapy's own RequestFingerprinter (REQUEST_FINGERPRINTER_CLASS unchanged)."""
    return type(fingerprinter) is RequestFingerprinter and getattr(fingerprinter, "_fingerprint", None) is scrapy_fingerprint


def url_entries(
    codec: RequestCodec,
    fingerprinter: Any,
    *,
    priority: Any = 0,
    meta: Mapping[str, Any] | None = None,
    callback: str | None = None,
    errback: str | None = None,
    dont_filter: bool = False,
    high_min: int = 1,
    low_max: int = -1,
    site_of: Callable[[str], str] | None = None,
    legacy: bool = False,
) -> Callable[[str], Entry | None] | None:
    """A function from a URL string to :func:`entry_for`'s entry of ``Request(url,
    priority=priority, meta=meta, dont_filter=dont_filter)`` with these callback names,
    without building the Request; it returns None for a URL Request(url) refuses (the
    Request path then raises Scrapy's own error). None where this path does not apply: a
    fingerprinter of the project's own, a migrated scrapy-redis dupefilter (its
    fingerprint needs the Request), ``verbatim_url``, ``not_before`` (a delay from now),
    or options :func:`entry_for` refuses (it then raises with its own message)."""
    meta = dict(meta or {})
    if legacy or "verbatim_url" in meta or "not_before" in meta or not default_fingerprinter(fingerprinter):
        return None
    if type(priority) is not int:
        return None
    task = meta.get("task_type")
    fixed_site = meta.get("site")
    if task is not None and task not in TASK_TYPES:
        return None
    try:
        if fixed_site is not None:
            validate_site_name(fixed_site)
        for name in (callback, errback):
            if name is not None:
                check_name(name)
        encode = codec.url_encoder(callback=callback, errback=errback, meta=meta, priority=priority, dont_filter=dont_filter)
    except (ValueError, TypeError, SerializationError):
        return None
    if not facts_agree():
        return None
    stream = stream_for(task, band_for(priority, high_min, low_max))
    facts = url_facts

    def entry(url: str) -> Entry | None:
        try:
            request_url, host, fp = facts(url)
        except ValueError:
            return None
        if fixed_site is not None:
            name = fixed_site
        elif not host:
            name = "_nohost"
        else:
            name = host if site_of is None else site_of(host)
        return Entry(b"" if dont_filter else fp, stream, 0, encode(request_url), name, b"", request_url)

    return entry
