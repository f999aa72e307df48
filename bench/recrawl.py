"""``python -m bench recrawl``: continuous crawling against the cron way, on pages that change.

The workload: ``--sites`` sites (default 1,000) of ``--pages`` pages (default 100),
served over local HTTP by this process (``http://s{i}.recrawl.test:PORT/p{j}``, the
host names resolved to 127.0.0.1 by :class:`LoopbackResolver`). Each page changes on its
own Poisson clock: in every site 10% of the pages change on average every minute, 30%
every 10 minutes, 60% never (which page is which, and every change time, come from
``--seed``). A page's body is a function of the page and of how many times it has
changed so far, so the server keeps no state besides its log. Page 0 of a site is its
home page and links to every page of the site; each other page links home and to the
next. Spiders are seeded with the home pages only and discover the rest by following
links. The server logs every fetch (site, page, time, version served): every number
below comes from that log, not from the spiders.

Every site is limited to ``--rate`` requests per second (default 2). The three
schedules run one after the other, on the same change clocks, each with ``--workers``
processes (default 2) and its own start:

- ``cron``: Scrapy's own in-memory scheduler, a fresh crawl process per worker every
  10 minutes crawling each page once (the sites split between the processes); the rate
  is Scrapy's per-domain ``DOWNLOAD_DELAY`` = 1/rate with one request per domain at a
  time. A crawl still running when its next period starts delays that one (as ``flock``
  would); the processes of a period are started ahead of it and wait at a start gate,
  so the interpreter's start-up is not charged to the schedule.
- ``fixed``: streams-sched, every page tracked with a fixed interval
  (``STREAMS_REVISIT_EVERY_SECONDS``); the rate is the site policy ``"*"``.
- ``adaptive``: streams-sched, every page tracked adaptively
  (``STREAMS_REVISIT_ADAPTIVE`` with its min, max and the two factors).

``--time-scale S`` runs everything at 1/S of the time: the change clocks, the cron
period, the revisit intervals, the rate (requests per bench second stay ``--rate``) and
the workers' idle poll; all times in the report are bench seconds (wall seconds / S).
``--minutes`` is the run's length in bench minutes.

What is measured, per schedule, over the fetches of the run ``[0, minutes]``:

- ``freshness``: of the changes whose window ends within the run (a change at ``t`` on a
  page whose mean change interval is ``T`` counts when ``t + T <= run end``), the share
  seen in time, i.e. with a fetch of the page in ``[t, t + T]``;
- ``wasted``: fetches that got the same version as the page's previous fetch (a page's
  first fetch is a discovery, never wasted);
- the rate check: for every site, the most fetches in any window of ``--window-s``
  bench seconds (the windows start at each fetch, so this is the maximum over all
  sliding windows), against ``rate * window + burst``, the most a token bucket of that
  rate and burst can allow in a window; a site over it breaks its rate. The times are
  the server's, so this is the rate as the site sees it: streams-sched applies it when a
  request is leased (a loaded worker may download its leases late and together),
  Scrapy when it downloads. ``--burst`` (default: the rate, the bucket's own default at
  time scale 1) is a number of requests and is not scaled.

The acceptance check, printed as PASS/FAIL lines: adaptive sees at least 1.5x as many
changes in time as cron, with at most as many fetches, and breaks no site's rate.

The parameters come from :func:`simulate`, a discrete-event model of the three
schedules on the same change clocks (per site; each site's fetches paced by a token
bucket of its rate, machines infinitely fast; the streams-sched schedules call the
product's own :func:`streams_sched.worker.revisits.next_visit`). ``--simulate`` runs only
the model and its search; otherwise the search runs first (on at most
``--sim-sites`` sites) and picks the fixed interval whose fetches come closest to
cron's, and the adaptive spec with the most changes in time among those within
``SIM_BUDGET`` of cron's fetches, Nutch's factors (0.8 / 1.4) first when they reach
the target with a margin. ``--fixed-every`` and ``--adaptive`` set them by hand.

Results go to stdout and bench/results/ (``recrawl-*.json`` and ``.md``).
"""

from __future__ import annotations

import argparse
import bisect
import heapq
import json
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from email.utils import formatdate
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent

#: (share of a site's pages, mean change interval in bench seconds; None = never changes)
CLASSES: tuple[tuple[float, float | None], ...] = ((0.10, 60.0), (0.30, 600.0), (0.60, None))
#: the cron way's period (bench seconds)
CRON_PERIOD_S = 600.0
#: time-averaged freshness is measured after this much of the run (bench seconds, at most
#: a third of it): the first visits of every page are discovery, not a schedule
WARM_S = 600.0
#: what the acceptance check asks of the freshness rule against cron
TARGET_RATIO = 1.5
#: the share of the optimal freshness (for the same fetches) the freshness rule must reach
OPTIMUM_SHARE = 0.95
#: the search keeps adaptive specs within this share of cron's simulated fetches; no
#: margin, since real runs fetch less than the model (each next visit counts from the
#: ack, not the fetch, and a due page waits for a lease round)
SIM_BUDGET = 1.0
#: Nutch's factors, tried first: (changed, unchanged)
NUTCH = (0.8, 1.4)
HOST_RE = re.compile(r"^s(\d+)\.recrawl\.test$")
PATH_RE = re.compile(r"^/p(\d+)$")


def say(text: str) -> None:
    print(f"[bench recrawl] {text}", file=sys.stderr, flush=True)


# --- the workload -------------------------------------------------------------------------------


class Fetch(NamedTuple):
    """One fetch the server answered: site, page, bench time (s), version served."""

    site: int
    page: int
    t: float
    version: int


class Web:
    """The change clocks of ``sites`` x ``pages`` pages over ``run_s`` bench seconds, from ``seed``.

    The shares of :data:`CLASSES` are exact per site (rounded), the pages of each class
    drawn from a shuffle of the site's pages; a page's change times are a Poisson process
    of its class's mean, drawn from a generator seeded with the page.
    """

    def __init__(
        self, sites: int, pages: int, run_s: float, seed: int = 1,
        classes: Sequence[tuple[float, float | None]] = CLASSES, etag_share: float = 0.0, page_bytes: int = 0,
        dated_share: float = 0.0,
    ) -> None:
        self.sites, self.pages, self.run_s, self.seed = sites, pages, run_s, seed
        self.classes = tuple(classes)
        #: pages whose server answers with an ETag and a Last-Modified, and 304 to a match:
        #: every page whose index in its site is below this share of the site's pages
        self.etag_pages = round(etag_share * pages)
        #: pages whose server sends a Last-Modified (their last change's date): those with
        #: an ETag, and every page whose index is below this share of the site's pages
        self.dated_pages = max(self.etag_pages, round(dated_share * pages))
        #: page index -> bench seconds (<= 0) of its last change before the run: a page
        #: that changes had its Poisson clock running before the run, so its age at the
        #: start is exponential of its mean (memoryless); one that never changes was last
        #: changed (published) 1 to 365 days before
        self.born_s: list[float] = [0.0] * (sites * pages)
        #: a page's body is padded to this size (a real page's HTML, not a few links)
        self.padding = "<!-- " + "x" * max(0, page_bytes - 200) + " -->" if page_bytes > 200 else ""
        #: page index (site * pages + page) -> mean change interval (None: never)
        self.mean_s: list[float | None] = [None] * (sites * pages)
        #: page index -> its change times, ascending, within [0, run_s]
        self.changes: list[list[float]] = [[] for _ in range(sites * pages)]
        for site in range(sites):
            order = list(range(pages))
            random.Random(f"{seed}/{site}").shuffle(order)
            start = 0
            for share, mean in self.classes:
                n = round(share * pages)
                for page in order[start:start + n]:
                    self._clock(site, page, mean)
                start += n

    def _clock(self, site: int, page: int, mean: float | None) -> None:
        i = site * self.pages + page
        self.mean_s[i] = mean
        before = random.Random(f"{self.seed}/{site}/{page}/before")
        self.born_s[i] = -(before.expovariate(1.0 / mean) if mean is not None else before.uniform(86400.0, 365 * 86400.0))
        if mean is None:
            return
        rng = random.Random(f"{self.seed}/{site}/{page}")
        t, out = 0.0, self.changes[i]
        while True:
            t += rng.expovariate(1.0 / mean)
            if t > self.run_s:
                break
            out.append(t)

    def version(self, site: int, page: int, t: float) -> int:
        """How many times the page has changed by bench time ``t``."""
        return bisect.bisect_right(self.changes[site * self.pages + page], t)

    def links(self, page: int) -> list[int]:
        """The pages ``page`` links to: the home page links to all, the others home and on."""
        if page == 0:
            return list(range(1, self.pages))
        return sorted({0, (page + 1) % self.pages})

    def body(self, site: int, page: int, version: int) -> bytes:
        links = "".join(f'<a href="/p{j}">p{j}</a> ' for j in self.links(page))
        return (f"<html><head><title>s{site} p{page}</title></head><body>"
                f"<p>site {site} page {page} version {version}</p>{links}{self.padding}</body></html>").encode()

    def etag(self, site: int, page: int, version: int) -> str | None:
        """The page's ETag at ``version`` (None: its server sends no validators)."""
        return f'"{site}-{page}-{version}"' if page < self.etag_pages else None

    def modified_s(self, site: int, page: int, version: int) -> float:
        """Bench seconds of the change that made ``version`` (before 0 for the first)."""
        i = site * self.pages + page
        return self.changes[i][version - 1] if version else self.born_s[i]

    def dated(self, page: int) -> bool:
        """Whether the page's server sends a Last-Modified."""
        return page < self.dated_pages

    def rates(self, site: int) -> list[float]:
        """The true change rates (per bench second) of the site's pages."""
        return [0.0 if m is None else 1.0 / m for m in self.mean_s[site * self.pages:(site + 1) * self.pages]]

    def class_name(self, site: int, page: int) -> str:
        mean = self.mean_s[site * self.pages + page]
        return "never" if mean is None else f"{mean:g}s"

    def class_names(self) -> list[str]:
        return ["never" if mean is None else f"{mean:g}s" for _, mean in self.classes]


def parse_classes(text: str) -> list[tuple[float, float | None]]:
    """``SHARE:MEAN,...`` (MEAN in bench seconds or ``never``), e.g. ``0.1:60,0.3:600,0.6:never``."""
    out: list[tuple[float, float | None]] = []
    for part in text.split(","):
        share, _, mean = part.partition(":")
        out.append((float(share), None if mean.strip() == "never" else float(mean)))
    if abs(sum(s for s, _ in out) - 1.0) > 1e-6:
        raise ValueError(f"--classes {text!r}: the shares must sum to 1")
    return out


# --- the numbers ---------------------------------------------------------------------------------


def max_in_window(times: Sequence[float], window_s: float) -> int:
    """The most of ``times`` (ascending) in any half-open window ``[x, x + window_s)``: the
    fullest such window starts at one of the times."""
    return max((bisect.bisect_left(times, t + window_s) - i for i, t in enumerate(times)), default=0)


def score(
    web: Web, fetches: Sequence[Fetch], rate: float, burst: float, window_s: float = 10.0, warm_s: float | None = None,
) -> dict[str, Any]:
    """Freshness, waste, fetches and the rate check of one schedule's fetches (module docstring)."""
    run_s = web.run_s
    warm_s = min(WARM_S, run_s / 3) if warm_s is None else warm_s
    by_page: dict[tuple[int, int], list[Fetch]] = defaultdict(list)
    by_site: dict[int, list[float]] = defaultdict(list)
    for f in fetches:
        if 0.0 <= f.t <= run_s:
            by_page[(f.site, f.page)].append(f)
            by_site[f.site].append(f.t)
    total = wasted = changes = in_time = 0
    per_class: dict[str, dict[str, int]] = defaultdict(lambda: {"fetches": 0, "wasted": 0, "changes": 0, "in_time": 0})
    for site in range(web.sites):
        for page in range(web.pages):
            got = sorted(by_page.get((site, page), ()), key=lambda f: f.t)
            c = per_class[web.class_name(site, page)]
            waste = sum(1 for a, b in zip(got, got[1:]) if a.version == b.version)
            c["fetches"] += len(got)
            c["wasted"] += waste
            mean = web.mean_s[site * web.pages + page]
            if mean is None:
                continue
            times = [f.t for f in got]
            for t in web.changes[site * web.pages + page]:
                if t + mean > run_s:
                    break
                c["changes"] += 1
                j = bisect.bisect_left(times, t)
                if j < len(times) and times[j] <= t + mean:
                    c["in_time"] += 1
    for c in per_class.values():
        total += c["fetches"]
        wasted += c["wasted"]
        changes += c["changes"]
        in_time += c["in_time"]
    fresh = time_freshness(web, by_page, warm_s)
    limit = rate * window_s + burst
    windows = {site: max_in_window(sorted(ts), window_s) for site, ts in by_site.items()}
    worst = max(windows.values(), default=0)
    # where the windows over the limit start (bench minute -> windows), to tell a start-up
    # burst from a steady excess
    over_at: dict[int, int] = defaultdict(int)
    for ts in by_site.values():
        ts.sort()
        for i, t in enumerate(ts):
            if bisect.bisect_left(ts, t + window_s) - i > limit:
                over_at[int(t // 60)] += 1
    return {
        "fetches": total,
        "wasted": wasted,
        "changes": changes,
        "in_time": in_time,
        "freshness": in_time / changes if changes else 0.0,
        "waste_share": wasted / total if total else 0.0,
        "window_s": window_s,
        "window_limit": limit,
        "max_in_window": worst,
        "max_rate": worst / window_s,
        "sites_over_rate": sum(1 for n in windows.values() if n > limit),
        "windows_over_rate_by_minute": dict(sorted(over_at.items())),
        "sites_fetched": len(by_site),
        "pages_seen": len(by_page),
        "by_class": dict(sorted(per_class.items())),
        **fresh,
    }


def fresh_time(changes: Sequence[float], times: Sequence[float], a: float, b: float) -> float:
    """How long in ``[a, b]`` a page with ``changes`` fetched at ``times`` (both ascending)
    was fresh: from each fetch until the page's next change or its next fetch."""
    total = 0.0
    for k, s in enumerate(times):
        j = bisect.bisect_right(changes, s)
        end = min(changes[j] if j < len(changes) else b, times[k + 1] if k + 1 < len(times) else b, b)
        start = max(s, a)
        if end > start:
            total += end - start
    return total


#: per distinct (site budget in fetches, page rates): the optimum's freshness
_OPTIMA: dict[tuple[int, tuple[tuple[float, int], ...]], float] = {}


def optimal_freshness(rates: Sequence[float], budget: float) -> float:
    """The mean freshness of pages of ``rates`` whose visits, ``budget`` per second in all,
    are spread optimally (Cho & Garcia-Molina's Lagrangian: each page's marginal freshness
    equals the site's multiplier, found by bisection)."""
    from streams_sched.worker import freshness as fr

    groups: dict[float, int] = defaultdict(int)
    for r in rates:
        groups[r] += 1
    n = len(rates)
    if budget <= 0:
        return groups.get(0.0, 0) / n

    mu = fr.optimal_mu(list(groups), budget, counts=list(groups.values()))
    return sum(c * fr.freshness(r, fr.frequency(r, mu)) for r, c in groups.items()) / n


def time_freshness(web: Web, by_page: dict[tuple[int, int], list[Fetch]], warm_s: float) -> dict[str, Any]:
    """Time-averaged freshness over ``[warm_s, run end]`` (the share of page-time whose last
    fetch had the page's current version), and the optimum's for the same fetches per site
    in that window from the pages' true rates; their ratio is the schedule's share of the optimum."""
    a, b = warm_s, web.run_s
    span = b - a
    if span <= 0:
        return {}
    fresh_sum = opt_sum = 0.0
    per_site_fetches: dict[int, int] = defaultdict(int)
    for (site, _page), got in by_page.items():
        per_site_fetches[site] += sum(1 for f in got if a <= f.t <= b)
    for site in range(web.sites):
        for page in range(web.pages):
            times = sorted(f.t for f in by_page.get((site, page), ()))
            fresh_sum += fresh_time(web.changes[site * web.pages + page], times, a, b) / span
        rates = web.rates(site)
        n = per_site_fetches.get(site, 0)
        key = (n, tuple(sorted(Counter(rates).items())))
        if key not in _OPTIMA:
            _OPTIMA[key] = optimal_freshness(rates, n / span)
        opt_sum += _OPTIMA[key] * web.pages
    pages = web.sites * web.pages
    fresh, opt = fresh_sum / pages, opt_sum / pages
    return {"time_freshness": fresh, "optimum": opt, "of_optimum": fresh / opt if opt else 0.0,
            "warm_s": a, "fetches_window": sum(per_site_fetches.values())}


# --- the schedules -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Adaptive:
    """An adaptive spec in bench seconds, and the factors of its crawl."""

    every_s: float
    min_s: float
    max_s: float
    changed: float = NUTCH[0]
    unchanged: float = NUTCH[1]

    def text(self) -> str:
        return (f"every {self.every_s:g}s, min {self.min_s:g}s, max {self.max_s:g}s,"
                f" factors {self.changed:g}/{self.unchanged:g}")

    @classmethod
    def parse(cls, text: str) -> Adaptive:
        """``EVERY,MIN,MAX[,CHANGED,UNCHANGED]`` in bench seconds."""
        parts = [float(x) for x in text.split(",")]
        if len(parts) not in (3, 5):
            raise ValueError(f"--adaptive {text!r}: expected EVERY,MIN,MAX[,CHANGED,UNCHANGED]")
        return cls(*parts)


@dataclass(frozen=True)
class Fresh:
    """The freshness rule's spec in bench seconds, and the share of the site's rate its
    revisits spend (STREAMS_REVISIT_BUDGET_SHARE)."""

    every_s: float
    min_s: float
    max_s: float
    share: float

    def text(self) -> str:
        return f"every {self.every_s:g}s, min {self.min_s:g}s, max {self.max_s:g}s, budget share {self.share:g}"

    @classmethod
    def parse(cls, text: str) -> Fresh:
        """``EVERY,MIN,MAX,SHARE`` (bench seconds, share of the site's rate)."""
        parts = [float(x) for x in text.split(",")]
        if len(parts) != 4:
            raise ValueError(f"--freshness {text!r}: expected EVERY,MIN,MAX,SHARE")
        return cls(*parts)


def _config(adaptive: Adaptive | None, jitter: float, rule: str = "nutch") -> Any:
    from streams_sched.config import StreamsConfig

    a = adaptive or Adaptive(1.0, 1.0, 1.0)
    return StreamsConfig(redis_url="redis://sim", crawl="sim", revisit_changed_factor=a.changed,
                         revisit_unchanged_factor=a.unchanged, revisit_jitter=jitter, revisit_rule=rule)


def simulate(
    web: Web, kind: str, rate: float, burst: float, *, fixed_every_s: float = CRON_PERIOD_S,
    adaptive: Adaptive | None = None, fresh: Fresh | None = None, jitter: float = 0.1, seed: int = 0,
) -> list[Fetch]:
    """The fetches of one schedule on ``web`` (``kind``: cron, fixed or adaptive), per site.

    A site fetches its due pages earliest first, each when it is due and its token bucket
    (``rate``, ``burst``) has a token; the home page is due at 0 and every other page when
    the home page is first fetched. cron fetches the home page at each period's start and
    the others after it, in link order, one every 1/rate (Scrapy's download delay, no
    burst); fixed, adaptive (Nutch's rule) and freshness schedule each page's next visit
    with the product's ``next_visit`` from the time of its fetch; freshness also keeps
    the site's multiplier, demand and stretch as ack.lua does (worker/freshness.py).
    """
    from streams_sched.worker import freshness as fr
    from streams_sched.worker.revisits import Spec, next_visit

    out: list[Fetch] = []
    if kind == "cron":
        gap = 1.0 / rate
        start = 0.0
        while start < web.run_s:
            for site in range(web.sites):
                for k, page in enumerate([0, *web.links(0)]):
                    t = start + k * gap
                    if t <= web.run_s:
                        out.append(Fetch(site, page, t, web.version(site, page, t)))
            start += CRON_PERIOD_S
        return out
    if kind == "fixed":
        spec = Spec(fixed_every_s, False, fixed_every_s, fixed_every_s)
        config = _config(None, jitter)
    elif kind == "adaptive" and adaptive is not None:
        spec = Spec(adaptive.every_s, True, adaptive.min_s, adaptive.max_s)
        config = _config(adaptive, jitter)
    elif kind == "freshness" and fresh is not None:
        spec = Spec(fresh.every_s, True, fresh.min_s, fresh.max_s)
        config = _config(None, jitter, "freshness")
    else:
        raise ValueError(f"unknown schedule {kind!r} (or adaptive without its spec)")
    rng = random.Random(seed)
    budget = rate * fresh.share if fresh is not None else 0.0
    for site in range(web.sites):
        due: list[tuple[float, int]] = [(0.0, 0)]
        state: dict[int, dict[str, Any]] = {}
        tokens, t_tokens, now = burst, 0.0, 0.0
        mu: float | None = None
        demand, intervals = 0.0, {}
        while due:
            t, page = heapq.heappop(due)
            t = max(t, now)
            tokens = min(burst, tokens + (t - t_tokens) * rate)
            if tokens < 1.0:
                t += (1.0 - tokens) / rate
                tokens = 1.0
            t_tokens, tokens, now = t, tokens - 1.0, t
            if t > web.run_s:
                break
            version = web.version(site, page, t)
            out.append(Fetch(site, page, t, version))
            if page == 0 and 0 not in state:
                for other in web.links(0):
                    heapq.heappush(due, (t, other))
            modified = web.modified_s(site, page, version) if web.dated(page) else None
            visit = next_visit(spec, state.get(page, {}), 200, str(version), config, 2 * rng.random() - 1,
                               mu=mu, at_s=t, age_s=None if modified is None else t - modified)
            assert visit is not None
            state[page] = visit.state
            if modified is not None:
                state[page]["m"] = modified  # what the worker keeps of the answer's validators
            delay = visit.delay_s
            if kind == "freshness":
                # ack.lua's part: the site's demand, its multiplier and the stretch
                demand += 1.0 / visit.interval_s - (1.0 / intervals[page] if page in intervals else 0.0)
                intervals[page] = visit.interval_s
                if visit.found:
                    mu = fr.next_mu(mu, demand, budget, 1, len(intervals))
                    if demand > budget * 1.1:
                        delay *= demand / (budget * 1.1)
            heapq.heappush(due, (t + delay, page))
    return out


def adaptive_grid() -> Iterator[Adaptive]:
    """The adaptive specs the search tries (bench seconds)."""
    for changed, unchanged in (NUTCH, (0.5, 2.0), (0.3, 2.0), (0.3, 3.0)):
        for every in (600.0, 900.0, 1200.0):
            for lo in (60.0, 120.0, 240.0):
                yield Adaptive(every, lo, 3600.0, changed, unchanged)


FIXED_GRID = (300.0, 450.0, 600.0, 750.0, 900.0, 1200.0)


def fresh_grid() -> Iterator[Fresh]:
    """The freshness specs the search tries (bench seconds, share of the site's rate)."""
    for every in (300.0, 600.0):
        for share in (0.03, 0.04, 0.045, 0.05, 0.055, 0.06, 0.07, 0.08):
            yield Fresh(every, 10.0, 3600.0, share)


def search(web: Web, rate: float, burst: float) -> dict[str, Any]:
    """Simulate the three schedules on ``web`` and choose the fixed interval and the adaptive spec."""
    t0 = time.perf_counter()
    cron = score(web, simulate(web, "cron", rate, burst), rate, burst)
    fixed = []
    for every in FIXED_GRID:
        s = score(web, simulate(web, "fixed", rate, burst, fixed_every_s=every), rate, burst)
        fixed.append({"every_s": every, **_brief(s, cron)})
    best_fixed = min(fixed, key=lambda r: (abs(r["fetches"] - cron["fetches"]), r["every_s"]))
    tried = []
    for a in adaptive_grid():
        s = score(web, simulate(web, "adaptive", rate, burst, adaptive=a), rate, burst)
        tried.append({"spec": asdict(a), "text": a.text(), **_brief(s, cron)})
    fresh_tried = []
    for fs in fresh_grid():
        s = score(web, simulate(web, "freshness", rate, burst, fresh=fs), rate, burst)
        fresh_tried.append({"spec": asdict(fs), "text": fs.text(), **_brief(s, cron)})
    fresh_within = [r for r in fresh_tried if r["fetches"] <= SIM_BUDGET * cron["fetches"]] or fresh_tried
    fresh_chosen = max(fresh_within, key=lambda r: (r["in_time"], -r["fetches"]))
    within = [r for r in tried if r["fetches"] <= SIM_BUDGET * cron["fetches"]] or tried
    nutch = [r for r in within if (r["spec"]["changed"], r["spec"]["unchanged"]) == NUTCH]
    best_nutch = max(nutch, key=lambda r: r["in_time"], default=None)
    margin = TARGET_RATIO * 1.1
    if best_nutch is not None and best_nutch["ratio"] >= margin:
        chosen, why = best_nutch, f"Nutch's factors reach {best_nutch['ratio']:.2f}x cron's changes in time (>= {margin:.2f}x)"
    else:
        chosen = max(within, key=lambda r: (r["in_time"], -r["fetches"]))
        nutch_text = f"{best_nutch['ratio']:.2f}x" if best_nutch else "nothing within budget"
        why = (f"Nutch's factors reach only {nutch_text} cron's changes in time within {SIM_BUDGET:.0%} of its"
               f" fetches; the best spec of the grid reaches {chosen['ratio']:.2f}x")
    return {
        "sites": web.sites, "pages": web.pages, "run_s": web.run_s, "seconds": time.perf_counter() - t0,
        "cron": _brief(cron, cron), "fixed": fixed, "fixed_chosen": best_fixed["every_s"],
        "adaptive_tried": sorted(tried, key=lambda r: (r["fetches"] > SIM_BUDGET * cron["fetches"], -r["in_time"])),
        "adaptive_chosen": chosen["spec"],
        "nutch_best": best_nutch, "why": why,
        "fresh_tried": sorted(fresh_tried, key=lambda r: (r["fetches"] > SIM_BUDGET * cron["fetches"], -r["in_time"])),
        "fresh_chosen": fresh_chosen["spec"],
    }


def _brief(s: dict[str, Any], cron: dict[str, Any]) -> dict[str, Any]:
    return {"fetches": s["fetches"], "in_time": s["in_time"], "freshness": s["freshness"], "wasted": s["wasted"],
            "time_freshness": s.get("time_freshness", 0.0), "of_optimum": s.get("of_optimum", 0.0),
            "ratio": s["in_time"] / max(cron["in_time"], 1), "fetch_ratio": s["fetches"] / max(cron["fetches"], 1),
            "sites_over_rate": s["sites_over_rate"]}


def render_search(res: dict[str, Any], top: int = 8) -> str:
    lines = [f"Simulation: {res['sites']} sites x {res['pages']} pages, {res['run_s'] / 60:g} bench minutes,"
             f" {res['seconds']:.1f} s to run. cron: {res['cron']['fetches']:,} fetches,"
             f" {res['cron']['in_time']:,} changes in time ({res['cron']['freshness']:.1%}).", "",
             "| fixed every | fetches vs cron | changes in time vs cron | freshness |", "|---:|---:|---:|---:|"]
    for r in res["fixed"]:
        mark = " (chosen)" if r["every_s"] == res["fixed_chosen"] else ""
        lines.append(f"| {r['every_s']:g}s{mark} | {r['fetch_ratio']:.2f}x | {r['ratio']:.2f}x | {r['freshness']:.1%} |")
    lines += ["", "| adaptive spec (within cron's fetches first, then the most changes in time first) | fetches vs cron"
              " | changes in time vs cron | freshness |",
              "|---|---:|---:|---:|"]
    for r in res["adaptive_tried"][:top]:
        mark = " (chosen)" if r["spec"] == res["adaptive_chosen"] else ""
        lines.append(f"| {r['text']}{mark} | {r['fetch_ratio']:.2f}x | {r['ratio']:.2f}x | {r['freshness']:.1%} |")
    if res["nutch_best"]:
        r = res["nutch_best"]
        lines.append(f"| best with Nutch's factors: {r['text']} | {r['fetch_ratio']:.2f}x | {r['ratio']:.2f}x |"
                     f" {r['freshness']:.1%} |")
    lines += ["", "| freshness spec (within cron's fetches first) | fetches vs cron | changes in time vs cron"
              " | time-averaged freshness | of the optimum |", "|---|---:|---:|---:|---:|"]
    for r in res["fresh_tried"][:top]:
        mark = " (chosen)" if r["spec"] == res["fresh_chosen"] else ""
        lines.append(f"| {r['text']}{mark} | {r['fetch_ratio']:.2f}x | {r['ratio']:.2f}x | {r['time_freshness']:.3f}"
                     f" | {r['of_optimum']:.1%} |")
    lines += ["", f"Chosen: fixed every {res['fixed_chosen']:g}s; adaptive {Adaptive(**res['adaptive_chosen']).text()}:"
              f" {res['why']}; freshness {Fresh(**res['fresh_chosen']).text()}, the most changes in time within"
              " cron's fetches."]
    return "\n".join(lines)


# --- the real thing: the server, the spider, the processes ----------------------------------------


class RecrawlServer:
    """The synthetic web over HTTP on 127.0.0.1, logging every fetch in bench time.

    Every host ``s{i}.recrawl.test`` is site ``i``; ``/p{j}`` is page ``j``. Bench time is
    (monotonic now - the run's start) / time scale; :meth:`start_run` starts a run and an
    empty log.
    """

    def __init__(self, web: Web, time_scale: float) -> None:
        from streams_sched.demo.serving import answering_server

        self.web, self.time_scale = web, time_scale
        self.t0 = time.monotonic()
        self.log: list[Fetch] = []
        #: per fetch of a page whose server sends validators: (status, bytes answered: the
        #: status line, headers and body)
        self.etag_log: list[tuple[int, int]] = []

        def get(handler: Any) -> tuple[int, dict[str, str], bytes]:
            host = HOST_RE.match((handler.headers.get("Host") or "").split(":")[0])
            path = PATH_RE.match(handler.path)
            if host is None or path is None:
                return 404, {}, b"not here"
            site, page = int(host.group(1)), int(path.group(1))
            if site >= web.sites or page >= web.pages:
                return 404, {}, b"not here"
            t = (time.monotonic() - self.t0) / self.time_scale
            version = web.version(site, page, max(t, 0.0))
            self.log.append(Fetch(site, page, t, version))  # list.append holds the GIL: no lock
            etag = web.etag(site, page, version)
            # the change's time on the wall clock, as an HTTP date (whole seconds, as HTTP
            # has); the answer's Date is on the same clock
            modified = formatdate(time.time() - (time.monotonic() - self.t0)
                                  + web.modified_s(site, page, version) * self.time_scale, usegmt=True)
            if etag is None:
                # a page without an ETag may still be dated; its server ignores If-Modified-Since
                dated = {"Last-Modified": modified} if web.dated(page) else {}
                return 200, {"Content-Type": "text/html", **dated}, web.body(site, page, version)
            headers = {"ETag": etag, "Last-Modified": modified}
            if handler.headers.get("If-None-Match") == etag:
                status, body = 304, b""
            else:
                status, body = 200, web.body(site, page, version)
                headers["Content-Type"] = "text/html"
            self.etag_log.append((status, wire_bytes(status, headers, body)))
            return status, headers, body

        self.httpd = answering_server(get)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> RecrawlServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def start_run(self) -> None:
        self.log = []
        self.etag_log = []
        self.t0 = time.monotonic()

    def now_s(self) -> float:
        """Bench seconds since the run started."""
        return (time.monotonic() - self.t0) / self.time_scale


def wire_bytes(status: int, headers: dict[str, str], body: bytes) -> int:
    """The bytes of an answer as http.server sends it: status line, its Server and Date
    headers, ours, Content-Length, the blank line and the body."""
    head = len(f"HTTP/1.1 {status} OK\r\n") + len("Server: BaseHTTP/0.6 Python/3.11.2\r\n")
    head += len("Date: Mon, 07 Dec 2026 23:00:00 GMT\r\n") + len(f"Content-Length: {len(body)}\r\n") + 2
    return head + sum(len(k) + len(v) + 4 for k, v in headers.items()) + len(body)


def etag_bytes(log: Sequence[tuple[int, int]]) -> dict[str, Any]:
    """Bytes answered to the pages with validators: full answers against 304s."""
    full = [n for s, n in log if s == 200]
    not_modified = [n for s, n in log if s == 304]
    mean_full = sum(full) / len(full) if full else 0.0
    mean_304 = sum(not_modified) / len(not_modified) if not_modified else 0.0
    return {"full": len(full), "not_modified": len(not_modified), "mean_full_bytes": mean_full,
            "mean_304_bytes": mean_304, "ratio": mean_full / mean_304 if mean_304 else 0.0,
            "bytes": sum(full) + sum(not_modified)}


def home_url(site: int, port: int) -> str:
    return f"http://s{site}.recrawl.test:{port}/p0"


try:
    import scrapy
    from scrapy.resolver import CachingThreadedResolver
except ImportError:  # the simulation needs neither
    pass
else:

    class LoopbackResolver(CachingThreadedResolver):
        """Scrapy's TWISTED_DNS_RESOLVER for the bench: ``*.recrawl.test`` is 127.0.0.1."""

        def getHostByName(self, name: str, timeout: Any = ()) -> Any:  # noqa: N802 (Twisted's name)
            from twisted.internet import defer

            if name.endswith(".recrawl.test"):
                return defer.succeed("127.0.0.1")
            return super().getHostByName(name, timeout)

    class RecrawlSpider(scrapy.Spider):
        """Starts from the home pages of its sites (RECRAWL_SITES) once the start gate opens,
        and follows every link."""

        name = "recrawl"

        async def start(self) -> Any:
            s = self.settings
            Path(s["RECRAWL_READY_FILE"]).write_text("ready")
            gate = s["RECRAWL_GATE_FILE"]
            deadline = time.monotonic() + 600
            # Blocking the reactor is harmless here: nothing is crawled until the gate opens.
            while not os.path.exists(gate):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"start gate {gate} never opened")
                time.sleep(0.002)
            for site in s.getlist("RECRAWL_SITES"):
                yield scrapy.Request(home_url(int(site), s.getint("RECRAWL_PORT")), callback=self.parse)

        def parse(self, response: Any) -> Any:
            for href in response.css("a::attr(href)").getall():
                yield response.follow(href, callback=self.parse)


@dataclass
class Plan:
    """What one invocation runs (bench seconds, requests per bench second)."""

    sites: int
    pages: int
    minutes: float
    time_scale: float
    workers: int
    rate: float
    burst: float
    window_s: float
    seed: int
    fixed_every_s: float
    adaptive: Adaptive
    fresh: Fresh
    schedules: list[str] = field(default_factory=lambda: ["cron", "fixed", "adaptive", "freshness"])

    @property
    def run_s(self) -> float:
        return self.minutes * 60.0


def _no_delay_jitter() -> dict[str, Any]:
    """The setting that makes DOWNLOAD_DELAY exact: DOWNLOAD_DELAY_JITTER from Scrapy 2.19 on
    (which deprecates RANDOMIZE_DOWNLOAD_DELAY), RANDOMIZE_DOWNLOAD_DELAY in older versions."""
    from scrapy.settings import default_settings

    if hasattr(default_settings, "DOWNLOAD_DELAY_JITTER"):
        return {"DOWNLOAD_DELAY_JITTER": 0}
    return {"RANDOMIZE_DOWNLOAD_DELAY": False}


class Runner:
    """Runs each schedule's processes against one server and one Redis, one schedule after another."""

    def __init__(self, plan: Plan, server: RecrawlServer, redis_url: str | None, wdir: Path) -> None:
        self.plan, self.server, self.redis_url, self.wdir = plan, server, redis_url, wdir
        self.procs: list[tuple[subprocess.Popen[bytes], Path]] = []

    def _settings(self, kind: str, n: int, tag: str) -> dict[str, Any]:
        p, ts = self.plan, self.plan.time_scale
        s: dict[str, Any] = {
            "BENCH_SPIDER": "bench.recrawl:RecrawlSpider",
            "TWISTED_DNS_RESOLVER": "bench.recrawl.LoopbackResolver",
            "RECRAWL_PORT": self.server.port,
            "RECRAWL_SITES": list(range(n, p.sites, p.workers)),
            "RECRAWL_READY_FILE": str(self.wdir / f"{tag}-ready{n}"),
            "RECRAWL_GATE_FILE": str(self.wdir / f"{tag}-gate"),
            "ROBOTSTXT_OBEY": False,
            "COOKIES_ENABLED": False,
            "TELNETCONSOLE_ENABLED": False,
            "LOG_LEVEL": "INFO",
            "LOGSTATS_INTERVAL": 30.0,
            "CONCURRENT_REQUESTS": 64,
            "EXTENSIONS": {"scrapy.extensions.remote_control.RemoteControl": None},
        }
        if kind == "cron":
            # Scrapy's own politeness: one request at a time per site, 1/rate apart
            s.update({"DOWNLOAD_DELAY": ts / p.rate, "CONCURRENT_REQUESTS_PER_DOMAIN": 1, **_no_delay_jitter()})
            return s
        s.update({
            "SCHEDULER": "streams_sched.scheduler.StreamsScheduler",
            "REDIS_URL": self.redis_url,
            "STREAMS_PREFIX": f"recrawl-{kind}",
            "STREAMS_DEDUPE": "bitmap",
            "STREAMS_SITES": {"*": {"rate": p.rate / ts, "burst": p.burst}},
            "STREAMS_IDLE_POLL_SECONDS": max(0.02, min(1.0, ts)),
        })
        if kind == "fixed":
            s["STREAMS_REVISIT_EVERY_SECONDS"] = p.fixed_every_s * ts
        elif kind == "freshness":
            fs = p.fresh
            s.update({"STREAMS_REVISIT_EVERY_SECONDS": fs.every_s * ts, "STREAMS_REVISIT_ADAPTIVE": True,
                      "STREAMS_REVISIT_MIN_SECONDS": fs.min_s * ts, "STREAMS_REVISIT_MAX_SECONDS": fs.max_s * ts,
                      "STREAMS_REVISIT_RULE": "freshness", "STREAMS_REVISIT_BUDGET_SHARE": fs.share})
        else:
            a = p.adaptive
            s.update({"STREAMS_REVISIT_EVERY_SECONDS": a.every_s * ts, "STREAMS_REVISIT_ADAPTIVE": True,
                      "STREAMS_REVISIT_MIN_SECONDS": a.min_s * ts, "STREAMS_REVISIT_MAX_SECONDS": a.max_s * ts,
                      "STREAMS_REVISIT_CHANGED_FACTOR": a.changed, "STREAMS_REVISIT_UNCHANGED_FACTOR": a.unchanged,
                      "STREAMS_REVISIT_RULE": "nutch"})
        return s

    def _launch(self, kind: str, tag: str) -> list[subprocess.Popen[bytes]]:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        out = []
        for n in range(self.plan.workers):
            log = self.wdir / f"{tag}-worker{n}.log"
            cmd = [sys.executable, "-m", "bench.worker", json.dumps(self._settings(kind, n, tag))]
            proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, cwd=ROOT, env=env)
            self.procs.append((proc, log))
            out.append(proc)
        return out

    def _ready(self, tag: str) -> bool:
        return all((self.wdir / f"{tag}-ready{n}").exists() for n in range(self.plan.workers))

    def _check(self, procs: list[subprocess.Popen[bytes]], bad_exit_only: bool = False) -> None:
        for proc, log in self.procs:
            if proc in procs and proc.poll() is not None and (proc.returncode != 0 or not bad_exit_only):
                tail = log.read_text(errors="replace")[-3000:]
                raise RuntimeError(f"a worker exited with {proc.returncode}; {log}:\n{tail}")

    def _wait_ready(self, tag: str, procs: list[subprocess.Popen[bytes]]) -> float:
        t = time.monotonic()
        deadline = t + 180
        while not self._ready(tag):
            self._check(procs)
            if time.monotonic() > deadline:
                raise RuntimeError(f"workers of {tag} not ready within 180 s; logs in {self.wdir}")
            time.sleep(0.01)
        return time.monotonic() - t

    def stop_all(self) -> None:
        for proc, _ in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc, _ in self.procs:
            proc.wait()
        self.procs = []

    def run(self, kind: str) -> tuple[list[Fetch], dict[str, Any]]:
        """Run one schedule for the plan's length; its fetches and how it went."""
        try:
            if kind == "cron":
                return self._run_cron()
            return self._run_streams(kind)
        finally:
            self.stop_all()

    def _run_streams(self, kind: str) -> tuple[list[Fetch], dict[str, Any]]:
        import redis

        client = redis.Redis.from_url(self.redis_url or "", socket_timeout=None)
        client.flushall()
        client.script_flush()
        procs = self._launch(kind, kind)
        startup = self._wait_ready(kind, procs)
        self.server.start_run()
        (self.wdir / f"{kind}-gate").write_text("go")
        end = self.server.t0 + self.plan.run_s * self.plan.time_scale
        while time.monotonic() < end:
            self._check(procs)
            time.sleep(0.05)
        log = list(self.server.log)
        stats = {}
        for key in client.scan_iter("*:stats", count=1000):
            if client.type(key) == b"hash":
                for k, v in client.hgetall(key).items():
                    name = k.decode()
                    if name in ("revisits", "changed", "unchanged", "tracked"):
                        stats[name] = stats.get(name, 0) + int(v)
        return log, {"startup_s": startup, "frontier_stats": stats, "etag": etag_bytes(self.server.etag_log)}

    def _run_cron(self) -> tuple[list[Fetch], dict[str, Any]]:
        p, ts = self.plan, self.plan.time_scale
        period_wall, run_wall = CRON_PERIOD_S * ts, p.run_s * ts
        procs = self._launch("cron", "cron0")
        startup = self._wait_ready("cron0", procs)
        lead = 2 * startup + 1.0
        self.server.start_run()
        (self.wdir / "cron0-gate").write_text("go")
        t0 = self.server.t0
        current, pending, k = procs, None, 1
        late: list[float] = [0.0]
        while time.monotonic() < t0 + run_wall:
            now = time.monotonic()
            self._check(current, bad_exit_only=True)
            start = t0 + k * period_wall
            if pending is None and start < t0 + run_wall and now >= start - lead:
                pending = self._launch("cron", f"cron{k}")
            if pending is not None and now >= start and all(proc.poll() is not None for proc in current):
                # the previous crawl is over (flock): this period's crawl starts now
                (self.wdir / f"cron{k}-gate").write_text("go")
                late.append((now - start) / ts)
                current, pending, k = pending, None, k + 1
            time.sleep(0.01)
        return list(self.server.log), {"startup_s": startup, "crawls": len(late), "late_s": late,
                                       "etag": etag_bytes(self.server.etag_log)}


# --- the command -----------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench recrawl", description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=30.0, help="length of each schedule's run, bench minutes (default 30)")
    p.add_argument("--sites", type=int, default=1000, help="sites (default 1000)")
    p.add_argument("--pages", type=int, default=100, help="pages per site (default 100)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="wall seconds per bench second (default 1; 0.1 = everything 10x faster)")
    p.add_argument("--workers", type=int, default=2, help="worker processes per schedule (default 2)")
    p.add_argument("--rate", type=float, default=2.0, help="requests per bench second per site (default 2)")
    p.add_argument("--burst", type=float, help="the site bucket's burst, requests (default: the rate)")
    p.add_argument("--window-s", type=float, default=10.0, help="rate-check window, bench seconds (default 10)")
    p.add_argument("--seed", type=int, default=1, help="seed of the change clocks (default 1)")
    p.add_argument("--fixed-every", type=float, help="fixed interval, bench seconds (default: the simulation's choice)")
    p.add_argument("--adaptive", help="EVERY,MIN,MAX[,CHANGED,UNCHANGED] in bench seconds (default: the simulation's choice)")
    p.add_argument("--freshness", help="EVERY,MIN,MAX,SHARE: the freshness rule's spec in bench seconds and its budget"
                   " share of the site's rate (default: the simulation's choice)")
    p.add_argument("--classes", default=",".join(f"{s:g}:{'never' if m is None else f'{m:g}'}" for s, m in CLASSES),
                   help="the pages' change classes, SHARE:MEAN,... (MEAN bench seconds or never)")
    p.add_argument("--dated-share", type=float, default=1.0,
                   help="share of each site's pages whose server sends Last-Modified, the date of the page's last"
                        " change (at least --etag-share; default 1.0)")
    p.add_argument("--etag-share", type=float, default=0.5,
                   help="share of each site's pages whose server sends ETag / Last-Modified and answers 304 (default 0.5)")
    p.add_argument("--page-bytes", type=int, default=16384,
                   help="a page's body is padded to this size, as a real page's HTML (default 16384)")
    p.add_argument("--warm-minutes", type=float,
                   help="time-averaged freshness is measured from this bench minute on (default: 10, at most a third of the run)")
    p.add_argument("--sim-sites", type=int, default=20, help="sites the parameter search simulates (default 20)")
    p.add_argument("--simulate", action="store_true", help="only the simulation and its parameter search (no Redis)")
    p.add_argument("--schedules", default="cron,fixed,adaptive,freshness", help="which schedules run (default all four)")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--work-dir", type=Path, help="where the fetch and worker logs go (default: a new temporary directory)")
    a = p.parse_args(argv)
    a.burst = a.burst if a.burst is not None else max(a.rate, 1.0)
    a.schedules = a.schedules.split(",")
    a.classes = parse_classes(a.classes)
    for s in a.schedules:
        if s not in ("cron", "fixed", "adaptive", "freshness"):
            p.error(f"unknown schedule {s!r}")
    return a


def render(res: dict[str, Any]) -> str:
    c = res["config"]
    runs = res["runs"]
    cron = runs.get("cron")
    lines = [
        f"Recrawl: {c['sites']:,} sites x {c['pages']} pages, {c['minutes']:g} bench minutes at time scale"
        f" {c['time_scale']:g} ({c['minutes'] * 60 * c['time_scale']:.0f} wall s per schedule, run one after the"
        f" other), {c['workers']} worker processes each, {c['rate']:g} req/s per site (burst {c['burst']:g}),"
        f" seed {c['seed']}. Command: `{c['command']}`. Load at start: {res['load']}.",
        "",
        "| schedule | parameters | fetches | vs cron | wasted | changes in time / counted | freshness | in time vs cron"
        " | time-averaged freshness | optimum for its fetches | share of the optimum"
        f" | pages fetched | max fetches in {c['window_s']:g} s (limit) | sites over rate |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for kind, r in runs.items():
        s = r["score"]
        vs = f"{s['fetches'] / cron['score']['fetches']:.2f}x" if cron else "-"
        vs_in = f"{s['in_time'] / max(cron['score']['in_time'], 1):.2f}x" if cron else "-"
        lines.append(
            f"| {kind} | {r['parameters']} | {s['fetches']:,} | {vs} | {s['wasted']:,} ({s['waste_share']:.0%})"
            f" | {s['in_time']:,} / {s['changes']:,} | {s['freshness']:.1%} | {vs_in}"
            f" | {s.get('time_freshness', 0):.3f} | {s.get('optimum', 0):.3f} | {s.get('of_optimum', 0):.1%}"
            f" | {s['pages_seen']:,}"
            f" | {s['max_in_window']} ({s['window_limit']:g}) | {s['sites_over_rate']} |")
    names = [n for n in ("2s", "8s", "30s", "60s", "600s", "never")
             if any(n in r["score"]["by_class"] for r in runs.values())] or list(CLASS_NAMES)
    lines += ["", "By page class (fetches, wasted, changes in time / counted):", "",
              "| schedule | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for kind, r in runs.items():
        cells = []
        for name in names:
            b = r["score"]["by_class"].get(name, {"fetches": 0, "wasted": 0, "changes": 0, "in_time": 0})
            cells.append(f"{b['fetches']:,} f, {b['wasted']:,} w, {b['in_time']:,}/{b['changes']:,}")
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    if any("first_30" in r["score"] for r in runs.values()):
        lines += ["", "The first 30 bench minutes: " + "; ".join(
            f"{k} {r['score']['first_30']['fetches']:,} fetches, {r['score']['first_30']['in_time']:,} changes in time"
            for k, r in runs.items() if "first_30" in r["score"]) + "."]
    lines += ["", "Pages whose server sends ETag / Last-Modified (bytes answered: status line, headers, body):", "",
              "| schedule | full answers | mean bytes | 304 answers | mean bytes | full / 304 | bytes in all |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for kind, r in runs.items():
        e = r["run"].get("etag")
        if e:
            lines.append(f"| {kind} | {e['full']:,} | {e['mean_full_bytes']:,.0f} | {e['not_modified']:,}"
                         f" | {e['mean_304_bytes']:,.0f} | {e['ratio']:.1f}x | {e['bytes']:,} |")
    lines += ["", *(f"- {line}" for line in res["notes"]), "", *res["checks_text"]]
    return "\n".join(lines)


CLASS_NAMES = ("60s", "600s", "never")


def checks(runs: dict[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The acceptance check (module docstring): PASS/FAIL lines."""
    out: list[dict[str, Any]] = []
    c = runs.get("cron")
    kind = "freshness" if "freshness" in runs else "adaptive"
    a = runs.get(kind)
    if a and c:
        sa, sc = a["score"].get("first_30", a["score"]), c["score"].get("first_30", c["score"])
        within = " within the first 30 bench minutes" if "first_30" in a["score"] else ""
        out.append({"what": f"{kind} sees >= {TARGET_RATIO}x cron's changes in time{within}",
                    "ok": sa["in_time"] >= TARGET_RATIO * sc["in_time"],
                    "detail": f"{sa['in_time']:,} vs {sc['in_time']:,} ({sa['in_time'] / max(sc['in_time'], 1):.2f}x)"})
        out.append({"what": f"{kind} fetches at most as much as cron{within}", "ok": sa["fetches"] <= sc["fetches"],
                    "detail": f"{sa['fetches']:,} vs {sc['fetches']:,} ({sa['fetches'] / max(sc['fetches'], 1):.2f}x)"})
    f = runs.get("freshness")
    if f and "of_optimum" in f["score"]:
        s = f["score"]
        out.append({"what": f"freshness reaches >= {OPTIMUM_SHARE:.0%} of the optimal freshness for its fetches",
                    "ok": s["of_optimum"] >= OPTIMUM_SHARE,
                    "detail": f"{s['time_freshness']:.3f} vs {s['optimum']:.3f} ({s['of_optimum']:.1%}) from bench"
                              f" minute {s['warm_s'] / 60:g}"})
        e = f["run"].get("etag")
        if e and e["not_modified"]:
            out.append({"what": "an unchanged revisit of a page with validators downloads >= 5x fewer bytes",
                        "ok": e["ratio"] >= 5.0,
                        "detail": f"{e['mean_full_bytes']:,.0f} against {e['mean_304_bytes']:,.0f} bytes ({e['ratio']:.1f}x)"})
    for kind, r in runs.items():
        s = r["score"]
        out.append({"what": f"{kind} keeps every site within its rate", "ok": s["sites_over_rate"] == 0,
                    "detail": f"at most {s['max_in_window']} fetches in {s['window_s']:g} s against"
                              f" {s['window_limit']:g}; {s['sites_over_rate']} sites over"})
    text = [f"{'PASS' if x['ok'] else 'FAIL'}: {x['what']}: {x['detail']}" for x in out]
    return out, text


def simulate_given(web: Web, args: argparse.Namespace, warm_s: float | None) -> str:
    """The model's numbers for the specs given by hand (--fixed-every, --adaptive,
    --freshness): time-averaged freshness against the optimum for the same fetches, and
    against uniform visits of every page with the same fetches."""
    runs: list[tuple[str, list[Fetch]]] = []
    if args.fixed_every:
        runs.append((f"fixed every {args.fixed_every:g}s", simulate(web, "fixed", args.rate, args.burst,
                                                                  fixed_every_s=args.fixed_every)))
    if args.adaptive:
        a = Adaptive.parse(args.adaptive)
        runs.append((f"Nutch's rule, {a.text()}", simulate(web, "adaptive", args.rate, args.burst, adaptive=a)))
    if args.freshness:
        fs = Fresh.parse(args.freshness)
        runs.append((f"freshness rule, {fs.text()}", simulate(web, "freshness", args.rate, args.burst, fresh=fs)))
    if not runs:
        return ""
    runs.insert(0, (f"cron every {CRON_PERIOD_S:g}s", simulate(web, "cron", args.rate, args.burst)))
    lines = [f"The given specs, simulated on {web.sites} sites x {web.pages} pages for {web.run_s / 60:g} bench minutes:",
             "", "| schedule | fetches | changes in time | time-averaged freshness | optimum for its fetches"
             " | share of the optimum | fetches by class |", "|---|---:|---:|---:|---:|---:|---|"]
    for name, fetches in runs:
        s = score(web, fetches, args.rate, args.burst, args.window_s, warm_s)
        by = ", ".join(f"{k} {v['fetches']:,}" for k, v in sorted(s["by_class"].items()))
        lines.append(f"| {name} | {s['fetches']:,} | {s['in_time']:,} | {s['time_freshness']:.3f} | {s['optimum']:.3f}"
                     f" | {s['of_optimum']:.1%} | {by} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m bench recrawl " + " ".join(shlex.quote(a) for a in argv)
    started = time.time()
    web = Web(args.sites, args.pages, args.minutes * 60.0, args.seed, args.classes, args.etag_share, args.page_bytes,
              args.dated_share)
    warm_s = args.warm_minutes * 60.0 if args.warm_minutes is not None else None
    say(f"{args.sites} sites x {args.pages} pages, {args.minutes:g} bench minutes, time scale {args.time_scale:g},"
        f" {args.workers} workers, rate {args.rate:g}/s burst {args.burst:g}, seed {args.seed}")
    sim_web = web if args.sim_sites >= args.sites else Web(args.sim_sites, args.pages, args.minutes * 60.0, args.seed,
                                                           args.classes, args.etag_share, 0, args.dated_share)
    found = search(sim_web, args.rate, args.burst)
    sim_text = render_search(found)
    print(sim_text + "\n", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if args.simulate:
        given = simulate_given(sim_web, args, warm_s)
        if given:
            print(given + "\n", flush=True)
            sim_text += "\n\n" + given
        (args.out / f"recrawl-sim-{stamp}.json").write_text(json.dumps(found, indent=1))
        (args.out / f"recrawl-sim-{stamp}.md").write_text(sim_text + "\n")
        return 0
    fixed_every = args.fixed_every or found["fixed_chosen"]
    adaptive = Adaptive.parse(args.adaptive) if args.adaptive else Adaptive(**found["adaptive_chosen"])
    fresh = Fresh.parse(args.freshness) if args.freshness else Fresh(**found["fresh_chosen"])
    plan = Plan(args.sites, args.pages, args.minutes, args.time_scale, args.workers, args.rate, args.burst,
                args.window_s, args.seed, fixed_every, adaptive, fresh, args.schedules)
    params = {"cron": f"Scrapy in-memory, every {CRON_PERIOD_S:g}s",
              "fixed": f"every {fixed_every:g}s" + (" (given)" if args.fixed_every else " (simulation)"),
              "adaptive": "Nutch's rule, " + adaptive.text() + (" (given)" if args.adaptive else " (simulation)"),
              "freshness": "freshness rule, " + fresh.text() + (" (given)" if args.freshness else " (simulation)")}
    from streams_sched.testing import RedisServer

    wdir = args.work_dir or Path(tempfile.mkdtemp(prefix="bench-recrawl-"))
    wdir.mkdir(parents=True, exist_ok=True)
    runs: dict[str, Any] = {}
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    with RedisServer() as redis_server, RecrawlServer(web, args.time_scale) as server:
        runner = Runner(plan, server, redis_server.url, wdir)
        for kind in plan.schedules:
            say(f"{kind}: {params[kind]}, {plan.run_s * plan.time_scale:.0f} wall s")
            fetches, how = runner.run(kind)
            s = score(web, fetches, args.rate, args.burst, args.window_s, warm_s)
            if args.minutes > 30:
                # the acceptance check's changes in time: those of the first 30 bench minutes
                first = Web(args.sites, args.pages, 1800.0, args.seed, args.classes)
                s["first_30"] = {k: v for k, v in score(first, fetches, args.rate, args.burst, args.window_s).items()
                                 if k in ("fetches", "in_time", "changes", "freshness")}
            runs[kind] = {"parameters": params[kind], "score": s, "run": how}
            say(f"{kind}: {s['fetches']:,} fetches, {s['in_time']:,}/{s['changes']:,} changes in time,"
                f" {s['wasted']:,} wasted, max {s['max_in_window']} in a window")
            (wdir / f"{kind}-fetches.json").write_text(json.dumps(fetches))
    notes = [f"cron: {r['run']['crawls']} crawls, started late by {', '.join(f'{x:.0f}' for x in r['run']['late_s'])}"
             " bench s (a crawl waits for the previous one to end)" for k, r in runs.items() if k == "cron"]
    notes += [f"{k}: frontier stats {r['run']['frontier_stats']}" for k, r in runs.items() if k != "cron"]
    notes += [f"{k}: windows over the rate start in bench minute (minute: windows) {r['score']['windows_over_rate_by_minute']}"
              for k, r in runs.items() if r["score"]["sites_over_rate"]]
    notes.append(f"fetch logs (JSON, [site, page, bench s, version]) and worker logs in {wdir}")
    check_list, check_text = checks(runs)
    res = {
        "config": {"command": command, "sites": args.sites, "pages": args.pages, "minutes": args.minutes,
                   "time_scale": args.time_scale, "workers": args.workers, "rate": args.rate, "burst": args.burst,
                   "window_s": args.window_s, "seed": args.seed, "fixed_every_s": fixed_every,
                   "adaptive": asdict(adaptive), "freshness": asdict(fresh), "schedules": plan.schedules,
                   "log_dir": str(wdir), "classes": args.classes, "etag_share": args.etag_share,
                   "page_bytes": args.page_bytes},
        "load": load, "simulation": found, "runs": runs, "checks": check_list, "checks_text": check_text,
        "notes": notes, "elapsed_s": time.time() - started,
    }
    text = render(res)
    print(text)
    (args.out / f"recrawl-{stamp}.json").write_text(json.dumps(res, indent=1, default=str))
    (args.out / f"recrawl-{stamp}.md").write_text(sim_text + "\n\n" + text + "\n")
    say(f"done in {res['elapsed_s']:.0f} s; wrote {args.out}/recrawl-{stamp}.{{json,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
