"""Cluster-wide politeness, the pure parts: batching answers, the effective rate, Crawl-delay.

The state lives in each site's policy hash and moves only in Redis scripts
(``feedback.lua`` records answers and runs the AIMD back-off, ``lease.lua``
applies the effective rate). This module holds what a worker and the status
commands decide without Redis:

- :class:`FeedbackBatch` sums the answers of each site between two reports, so
  a worker sends one ``feedback.lua`` call per site per interval, and one at
  once after a 429 / 503 / timeout or a robots.txt;
- :func:`effective_rate` says what rate a site runs at and why from its policy hash,
  for code that has no status read (a status read carries the rate Redis computed,
  ``SiteStatus.rate``);
- :func:`crawl_delay_of` reads the Crawl-delay out of any of Scrapy's robots.txt parsers;
- :func:`decode_window` and :func:`encode_window` read and write a site's observed answer
  window, the one string feedback.lua keeps in its ``window`` key (``SiteKeys.window``).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Container, Iterator, Mapping
from typing import Any

from streams_sched.frontier.records import EffectiveRate

__all__ = [
    "THROTTLE_STATUSES",
    "EffectiveRate",
    "FeedbackBatch",
    "crawl_delay_of",
    "decode_window",
    "effective_rate",
    "encode_window",
    "is_timeout",
    "robots_body_crawl_delay",
]

#: Answers that mean "slow down".
THROTTLE_STATUSES = frozenset({429, 503})

#: The fields of a site's observed answer window, in the order of its ``window`` string
#: (feedback.lua's report_answers): window start (ms), answers and healthy answers
#: since, and the answer and healthy-answer rates (per s) of the last full window.
OBS_FIELDS = ("o_ts", "o_n", "o_ok", "o_rate", "o_okrate")


def decode_window(raw: bytes | str | None) -> dict[str, str]:
    """The observed window as field -> value ({} for none or a malformed value)."""
    if raw is None:
        return {}
    parts = (raw.decode() if isinstance(raw, bytes) else raw).split(",")
    if len(parts) != len(OBS_FIELDS):
        return {}
    return {name: value for name, value in zip(OBS_FIELDS, parts, strict=True) if value != ""}


def encode_window(fields: Mapping[str, Any]) -> str:
    """The ``window`` string for ``fields`` (absent fields are empty: read as unset)."""
    return ",".join("" if fields.get(name) is None else str(fields[name]) for name in OBS_FIELDS)


#: Names of the exceptions that count as a download timeout: Twisted's TimeoutError and
#: TCPTimedOutError, Scrapy's DownloadTimeoutError (2.14+), asyncio's TimeoutError.
_TIMEOUTS = frozenset({"TimeoutError", "TCPTimedOutError", "DownloadTimeoutError"})


def is_timeout(exc: BaseException) -> bool:
    """True for a download timeout (``twisted.internet.error.TimeoutError``,
    ``scrapy.exceptions.DownloadTimeoutError`` and the like)."""
    return type(exc).__name__ in _TIMEOUTS or isinstance(exc, TimeoutError)


class FeedbackBatch:
    """Per-site sums of answers between two ``feedback.lua`` calls (pump thread only).

    The reactor thread appends ``(site, kind, value)`` to a deque (kinds: ``ok``,
    ``throttled`` with the Retry-After in ms, ``timeout``, ``robots`` with the
    Crawl-delay string); :meth:`absorb` folds them in. A site is due at once when
    it has a congestion signal or a robots.txt delay, else once ``interval_s``
    has passed since the last report. Healthy answers of a site acked in the
    meantime go with its ack instead (:meth:`take_healthy`).
    """

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.sites: dict[str, list[Any]] = {}
        self.urgent = False
        self.next_report = 0.0

    def absorb(self, queue: deque[tuple[str, str, Any]], now: float | None = None) -> None:
        sites = self.sites
        if queue and now is None:
            now = time.monotonic()
        while queue:
            site, kind, value = queue.popleft()
            acc = sites.get(site)
            if acc is None:
                # ok, throttled, timeouts, longest Retry-After ms, robots delay, first answer at
                acc = sites[site] = [0, 0, 0, 0, "", now]
            if kind == "ok":
                acc[0] += value
            elif kind == "throttled":
                acc[1] += 1
                acc[3] = max(acc[3], int(value))
                self.urgent = True
            elif kind == "timeout":
                acc[2] += 1
                self.urgent = True
            elif kind == "robots":
                acc[4] = value
                self.urgent = True

    def take_healthy(self, site: str, now: float, last: bool) -> int:
        """The healthy answers of ``site``, removed from the batch so they ride along with
        an ack of the site, if that is all it has to report (no 429, 503, timeout or
        robots.txt) and either this ack ends the worker's last lease of the site
        (``last``) or the oldest of them waited ``interval_s``; else 0, and they wait.
        So a busy site reports about once per interval, as with feedback.lua calls,
        and a small site's answers go with its last ack instead of a call of their own."""
        acc = self.sites.get(site)
        if acc is None or acc[0] == 0 or acc[1] or acc[2] or acc[4]:
            return 0
        if not last and now - acc[5] < self.interval_s:
            return 0
        del self.sites[site]
        return int(acc[0])

    def due(self, now: float) -> bool:
        return bool(self.sites) and (self.urgent or now >= self.next_report)

    def take(
        self, now: float, acking: Container[str] = ()
    ) -> Iterator[tuple[str, tuple[int, int, int, int], str]]:
        """Every site's sums as (site, (ok, throttled, timeouts, retry_after_ms), robots); resets.

        A site in ``acking`` (the worker holds leases of it) with only healthy answers
        stays: they go with its next ack (:meth:`take_healthy`), not in a call of their own.
        """
        sites, self.sites = self.sites, {}
        self.urgent = False
        self.next_report = now + self.interval_s
        for site, acc in sites.items():
            if site in acking and not (acc[1] or acc[2] or acc[4]):
                self.sites[site] = acc
                continue
            yield site, (acc[0], acc[1], acc[2], acc[3]), acc[4]


def _num(value: Any) -> float | None:
    if value is None or value == "":
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def effective_rate(
    policy: Mapping[str, str],
    now_ms: int,
    *,
    default_rate: float = 0.0,
    default_paused: bool = False,
    adaptive: bool = True,
    robots: bool = True,
) -> EffectiveRate:
    """The rate of a site with this policy hash at Redis time ``now_ms``, for code that
    holds a policy but no status: a status read carries the rate Redis computed
    (``SiteStatus.rate``, lua/lib/rate.lua), the one home of the rule. This copy is kept
    for the monitor until it reads ``SiteStatus.rate``; tests/test_politeness_logic.py
    checks that both agree on a table of cases."""
    if policy.get("paused", "1" if default_paused else "0") == "1":
        return EffectiveRate(0.0, "paused")
    rate = _num(policy.get("rate"))
    if rate is None:
        rate = default_rate
    reason = "policy" if rate > 0 else "unlimited"
    delay = _num(policy.get("robots_delay"))
    if robots and rate <= 0 and delay is not None and delay > 0:
        rate, reason = 1 / delay, "robots"
    a_rate = _num(policy.get("a_rate")) if adaptive else None
    if a_rate is not None and (rate <= 0 or a_rate < rate):
        rate, reason = a_rate, "backoff"
    until = int(_num(policy.get("a_until")) or 0) if adaptive else 0
    if until > now_ms:
        return EffectiveRate(rate, "retry-after", until)
    return EffectiveRate(rate, reason, 0)


def crawl_delay_of(parser: Any, user_agent: str) -> float | None:
    """The Crawl-delay (seconds) a Scrapy robots.txt parser found for ``user_agent``, or None.

    Scrapy 2.18 added ``RobotParser.crawl_delay()``; before it, the parsers keep the
    underlying parser in ``rp``: Protego and urllib's ``RobotFileParser`` have
    ``crawl_delay(ua)``, robotexclusionrulesparser has ``get_crawl_delay(ua)``.
    """
    rp = getattr(parser, "rp", None)
    for owner, name in ((parser, "crawl_delay"), (rp, "crawl_delay"), (rp, "get_crawl_delay")):
        method = getattr(owner, name, None) if owner is not None else None
        if method is None:
            continue
        try:
            value = method(user_agent)
        except Exception:  # a parser that cannot answer: ask the next
            continue
        if value is None:
            continue
        try:
            delay = float(value)
        except (TypeError, ValueError):
            return None
        return delay if delay > 0 else None
    return None


def robots_body_crawl_delay(body: bytes, user_agent: str) -> float | None:
    """The Crawl-delay for ``user_agent`` in a robots.txt body, read with Protego (Scrapy's
    default parser). For Scrapy versions without the ``robots_parsed`` signal."""
    from protego import Protego

    try:
        text = body.decode("utf-8", errors="ignore")
        delay = Protego.parse(text).crawl_delay(user_agent)
    except Exception:  # a robots.txt Protego cannot read: no delay, as Scrapy then allows all
        return None
    return float(delay) if delay is not None and delay > 0 else None
