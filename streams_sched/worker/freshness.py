"""The freshness rule's math: a page's change rate from its visits, the revisit frequency
that buys the most freshness for a site's budget, and the site's multiplier (pure).

A page that changes as a Poisson process of rate ``r`` and is visited ``f`` times a
second at even intervals is fresh a share ``F(r, f) = (f / r) (1 - exp(-r / f))`` of the
time (Cho & Garcia-Molina, "Effective page refresh policies for web crawlers", TODS
2003). Spending a site's revisit budget ``B`` (fetches per second) to maximise the sum of
its pages' freshness gives every page the frequency at which one more fetch per second
buys the same freshness, the site's multiplier ``mu``: ``dF/df = mu``. With ``x = r / f``,
``dF/df = g(x) / r`` where ``g(x) = 1 - (1 + x) exp(-x)`` rises from 0 to 1, so

- a page with ``mu * r < 1`` is visited at ``f = r / g^-1(mu * r)``;
- a page with ``mu * r >= 1`` changes faster than the budget can follow and gets
  ``f = 0`` (it is visited once per its ``max``, so a gone page is still noticed), as
  does a page never seen to change.

``mu`` is the one per-site quantity: ack.lua keeps it in the site's policy hash
(``rv_mu``, seconds) and moves it after every ack of tracked pages toward the value at
which the pages' planned fetches (the site's revisit demand, the sum of ``1 / interval``)
equal its budget (:func:`next_mu`, mirrored in ``frontier/lua/lib/freshness.lua``). The
lease carries it to the worker, which chooses the page's next interval from the page's
own estimate (:func:`interval_for`): nothing ever passes over a site's pages.

The change rate is Cho & Garcia-Molina's estimator ("Estimating frequency of change",
TOIT 2003): of ``n`` visits ``I`` apart on average, ``X`` saw a change:
``r = -ln((n - X + 0.5) / (n + 0.5)) / I``, finite even when every visit saw one. The
counts are kept over the page's recent visits (:data:`WINDOW`), so a page whose rate
moves is followed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = [
    "GAIN", "GROWTH", "MU_MAX", "MU_MIN", "WINDOW", "estimate_rate", "frequency", "freshness", "g", "interval_for",
    "marginal", "next_mu", "optimal_mu", "first_mu", "estimate_rate_dated",
]

#: visits an estimate counts; past it the counts and the time are halved, so the
#: estimate follows the page's recent behaviour
WINDOW = 32
#: an interval grows at most this much from one visit to the next, so one or two
#: unchanged visits do not send a page to its ``max`` at once
GROWTH = 2.0
#: the share of the way to the budget the multiplier moves per round of the site's
#: tracked pages (see :func:`next_mu`)
GAIN = 0.5
#: where a site's multiplier starts, as a share of its pages' mean interval at the budget
FIRST_MU_SHARE = 0.02
#: bounds of the multiplier (seconds)
MU_MIN, MU_MAX = 1e-3, 1e9
#: how far one update may move the multiplier's log, either way
_MAX_STEP = math.log(4.0)


def g(x: float) -> float:
    """``1 - (1 + x) exp(-x)``: ``r * dF/df`` at ``x = r / f``."""
    if x <= 0:
        return 0.0
    if x < 1e-4:
        return x * x / 2.0
    return 1.0 - (1.0 + x) * math.exp(-x)


def freshness(r: float, f: float) -> float:
    """The expected share of time a page of change rate ``r`` visited ``f`` times a second is fresh."""
    if r <= 0:
        return 1.0
    if f <= 0:
        return 0.0
    x = r / f
    return -math.expm1(-x) / x


def marginal(r: float, f: float) -> float:
    """``dF/df`` of a page of rate ``r`` at frequency ``f`` (seconds)."""
    if r <= 0 or f <= 0:
        return 0.0 if r <= 0 else 1.0 / r
    return g(r / f) / r


def frequency(r: float, mu: float) -> float:
    """The frequency (visits per second) at which one more visit per second buys ``mu``
    of freshness for a page of rate ``r``: 0 when ``mu * r >= 1`` or ``r <= 0``. The
    inverse of ``g`` by 60 bisection steps over ``log x`` (the Lua mirror does the same)."""
    if r <= 0 or mu <= 0:
        return 0.0
    target = mu * r
    if target >= 1.0:
        return 0.0
    lo, hi = -20.0, 5.0  # log x: g(e^5) = 1 - 1e-62, g(e^-20) = 2e-18
    for _ in range(60):
        mid = (lo + hi) / 2.0
        if g(math.exp(mid)) < target:
            lo = mid
        else:
            hi = mid
    return r / math.exp((lo + hi) / 2.0)


def estimate_rate(n: int, changed: int, observed_s: float) -> float:
    """Cho & Garcia-Molina's change rate (per second) of a page whose ``n`` visits, spanning
    ``observed_s`` seconds between them, saw ``changed`` changes; 0 without visits."""
    if n <= 0 or observed_s <= 0:
        return 0.0
    changed = min(max(changed, 0), n)
    return -math.log((n - changed + 0.5) / (n + 0.5)) / (observed_s / n)


def estimate_rate_dated(changed: int, exposed_s: float) -> float:
    """The change rate (per second) of a page whose server dates its last change
    (Last-Modified): ``changed`` changes over ``exposed_s`` seconds of exposure, where a
    visit that found the page unchanged adds the time since the previous visit and one
    that found it changed adds its age (the visit's time less its Last-Modified), the
    time it has certainly not changed since. The maximum-likelihood rate of a Poisson
    process observed so (Cho & Garcia-Molina, TOIT 2003, estimation with last-modified
    dates); one visit is enough: its age alone gives ``1 / age``. 0 without exposure."""
    if changed <= 0 or exposed_s <= 0:
        return 0.0
    return changed / exposed_s


def interval_for(r: float, mu: float, lo_s: float, hi_s: float, last_s: float | None = None) -> float:
    """The page's next interval (seconds): ``1 / frequency`` within ``[lo_s, hi_s]``, ``hi_s``
    when the page gets no visits of its own, and at most :data:`GROWTH` times ``last_s``."""
    f = frequency(r, mu)
    interval = hi_s if f <= 0 else min(hi_s, max(lo_s, 1.0 / f))
    if last_s is not None and last_s > 0:
        interval = min(interval, max(lo_s, GROWTH * last_s))
    return interval


def first_mu(tracked: int, budget: float) -> float:
    """The multiplier a site starts from: :data:`FIRST_MU_SHARE` of its pages' mean interval
    at the budget. Low on purpose: a multiplier too low asks for more than the budget,
    which the stretch holds to the site's rate while the multiplier rises within a round;
    one too high sends pages toward their ``max``, from where they come back only at
    their next visit."""
    return min(MU_MAX, max(MU_MIN, FIRST_MU_SHARE * max(tracked, 1) / budget))


def next_mu(mu: float | None, demand: float, budget: float, acked: int, tracked: int) -> float:
    """The site's multiplier after ``acked`` of its ``tracked`` pages were scheduled, their
    planned fetches summing to ``demand`` per second against ``budget``: multiplied by
    ``(demand / budget) ** (GAIN * acked / tracked)`` (the step's log at most ln 4 either
    way), so over a round of the site's pages it moves ``GAIN`` of the way (in log) to the
    value that spends the budget. A site over budget raises it (fewer visits), one under
    lowers it. ``budget`` must be above 0."""
    if mu is None or mu <= 0:
        mu = first_mu(tracked, budget)
    weight = min(1.0, acked / max(tracked, 1))
    ratio = max(demand, budget * 1e-6) / budget
    step = max(-_MAX_STEP, min(_MAX_STEP, GAIN * weight * math.log(ratio)))
    return min(MU_MAX, max(MU_MIN, mu * math.exp(step)))


def optimal_mu(rates: Sequence[float], budget: float, hi_s: float | None = None,
               counts: Sequence[int] | None = None) -> float:
    """The multiplier at which the frequencies of ``rates`` sum to ``budget`` (bisection on
    ``log mu``); pages without visits of their own count ``1 / hi_s`` when ``hi_s`` is given.
    ``counts``: how many pages have each rate (one each when not given), so that a caller
    with many pages of few rates computes each rate's frequency once per step."""
    weights = counts if counts is not None else [1] * len(rates)

    def spend(mu: float) -> float:
        total = 0.0
        for r, c in zip(rates, weights, strict=True):
            f = frequency(r, mu)
            if hi_s:
                f = max(f, 1.0 / hi_s)
            total += c * f
        return total

    lo, hi = math.log(MU_MIN), math.log(MU_MAX)
    for _ in range(80):
        mid = (lo + hi) / 2.0
        if spend(math.exp(mid)) > budget:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2.0)
