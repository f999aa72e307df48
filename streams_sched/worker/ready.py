"""The requests a worker has ready to hand to the engine, per site (reactor thread only).

The I/O thread appends leased requests to the Exchange's ``arrivals``; :meth:`absorb`
takes them into one queue per site. :meth:`pop` serves the site that is least served
relative to its weight among those whose downloader slot can take a request now
(fairness.py), so one slow site never fills the downloader and weights hold when the
worker is the bottleneck. Requests that cannot travel (unserializable.py) wait in the
same queues with no lease. What is kept per site follows the sites ready or in progress
here, never the crawl's sites.
"""

from __future__ import annotations

from collections import deque
from typing import Any

from scrapy import Request

from streams_sched.frontier.records import LeasedEntry
from streams_sched.worker.exchange import Exchange
from streams_sched.worker.fairness import ReadySites
from streams_sched.worker.selection import credit_at_level

__all__ = ["ReadyQueues", "Ready"]

#: a ready request: the request, its lease (None for a local request), its downloader slot key
Ready = tuple[Request, LeasedEntry | None, Any]


class ReadyQueues:
    """Ready requests per site, in the order weighted fairness serves the sites."""

    def __init__(self) -> None:
        #: requests ready per site
        self.by_site: dict[str, deque[Ready]] = {}
        #: the sites of by_site in the order fairness serves them (fairness.py)
        self.fair = ReadySites()
        #: requests handed to the engine and not finished, per site (leased and local): with
        #: by_site, the sites whose served count and weight this worker keeps
        self.busy: dict[str, int] = {}
        #: slot keys of full downloader slots a request is leaving: parked sites behind
        #: them compete again once the slot has room
        self.recheck: set[Any] = set()
        #: sites gone (nothing ready, nothing busy) whose weight the Exchange still stores
        self.unweigh: set[str] = set()
        self.downloader: Any = None
        self.exchange: Exchange | None = None
        self.count = 0
        #: local requests waiting in by_site, and those the engine has not finished -> site
        self.local = 0
        self.local_busy: dict[Request, str] = {}

    def __bool__(self) -> bool:
        return bool(self.by_site)

    # -- in ---------------------------------------------------------------------

    def absorb(self) -> None:
        """Take the I/O thread's arrivals into the site queues."""
        x = self.exchange
        if x is None:
            return
        arrivals = x.arrivals
        ready = self.by_site
        slot_key = self.downloader.get_slot_key if self.downloader is not None else None
        n = 0
        while arrivals:
            request, entry = arrivals.popleft()
            item = (request, entry, slot_key(request) if slot_key is not None else None)
            queue = ready.get(entry.site)
            if queue is None:
                self._make_ready(entry.site, item)
            else:
                queue.append(item)
            n += 1
        self.count += n

    def add_local(self, site: str, request: Request) -> None:
        """A request that cannot travel waits here with no lease."""
        slot = self.downloader.get_slot_key(request) if self.downloader is not None else None
        queue = self.by_site.get(site)
        if queue is None:
            self._make_ready(site, (request, None, slot))
        else:
            queue.append((request, None, slot))
        self.count += 1
        self.local += 1

    def _make_ready(self, site: str, item: Ready) -> None:
        """``site`` has a request ready again (``item``), and none before."""
        x = self.exchange
        fair = self.fair
        level = 0.0
        if x is not None:
            if x.weights.changed:
                self.reweigh(x)
            weight = x.weight(site)
            served = x.served
            count = served.get(site, 0.0)
            least = fair.least_level()
            if least is not None:
                # a site coming back starts at most RETURN_GRACE behind the least served
                count = served[site] = credit_at_level(count, weight, least)
            level = count / weight
        self.by_site[site] = deque((item,))
        fair.add(site, level, item[2])

    # -- out --------------------------------------------------------------------

    def pop(self, x: Exchange) -> tuple[Request, LeasedEntry | None, str] | None:
        """The next request to hand out, counted as served and busy; None while every
        site with requests has a full downloader slot."""
        site = self._pick_site()
        if site is None:
            return None
        queue = self.by_site[site]
        request, entry, _slot = queue.popleft()
        served = x.served
        n = served[site] = served.get(site, 0.0) + 1.0
        busy = self.busy
        busy[site] = busy.get(site, 0) + 1
        if queue:
            self.fair.update(site, n / x.weight(site), queue[0][2])
        else:
            del self.by_site[site]
            self.fair.remove(site)
        self.count -= 1
        if entry is None:
            self.local -= 1
            self.local_busy[request] = site
        return request, entry, site

    def _pick_site(self) -> str | None:
        """The site to serve next: the least served relative to its weight among the
        sites whose downloader slot can take a request now; between equals, the one
        ready first. O(log ready sites): see fairness.py."""
        fair = self.fair
        if self.downloader is None:
            return fair.pick()
        if self.recheck:
            self._unpark_freed()
        site = fair.pick(self._slot_full)
        if site is None and fair.parked:
            # Every ready site waits behind a full slot. Look at each of them again: a
            # downloader that frees a slot without the signals this scheduler watches
            # must not leave its sites waiting for ever.
            for key in list(fair.parked):
                if not self._slot_full(key):
                    fair.unpark(key)
            site = fair.pick(self._slot_full)
        return site

    def _slot_full(self, key: Any) -> bool:
        slot = self.downloader.slots.get(key)
        return slot is not None and len(slot.active) >= slot.concurrency

    def _unpark_freed(self) -> None:
        """Unpark the sites behind the slots a request left, once those have room."""
        recheck = self.recheck
        for key in list(recheck):
            if not self._slot_full(key):
                recheck.discard(key)
                self.fair.unpark(key)

    def slot_leaving(self, request: Request) -> None:
        """``request`` is leaving (or left) its downloader slot: a full slot is looked at
        again at the next pick, and again until the request is out of it."""
        if self.downloader is None:
            return
        key = request.meta.get("download_slot")
        if key is not None and (key in self.fair.parked or self._slot_full(key)):
            self.recheck.add(key)

    def take_all(self) -> list[LeasedEntry]:
        """Empty the queues (the worker is closing): the leases of what was waiting. Local
        requests waiting are dropped; ``local`` still counts them for the caller."""
        leases = [entry for queue in self.by_site.values() for _request, entry, _slot in queue if entry is not None]
        sites = list(self.by_site)
        self.by_site.clear()
        self.fair.clear()
        self.recheck.clear()
        self.count = 0
        for site in sites:
            if site not in self.busy:
                self._site_gone(site)
        return leases

    # -- per-site state: only for the sites ready or in progress ------------------

    def release_site(self, site: str) -> None:
        """A request of ``site`` handed to the engine is finished (or handed back)."""
        busy = self.busy
        n = busy.get(site, 0) - 1
        if n > 0:
            busy[site] = n
            return
        busy.pop(site, None)
        if site not in self.by_site:
            self._site_gone(site)

    def _site_gone(self, site: str) -> None:
        """``site`` has nothing ready and holds nothing: forget what fairness kept of it
        (if it comes back, it starts close to the least served: credit_at_level)."""
        x = self.exchange
        if x is None:
            return
        x.served.pop(site, None)
        if x.weights.holds(site):
            self.unweigh.add(site)

    def _is_gone(self, site: str) -> bool:
        return site not in self.by_site and site not in self.busy

    def reweigh(self, x: Exchange) -> None:
        """The I/O thread changed weights: re-rank the ready sites among them."""
        changed = x.weights.changed
        ready = self.by_site
        served = x.served
        while changed:
            site = changed.popleft()
            queue = ready.get(site)
            if queue is not None:
                self.fair.update(site, served.get(site, 0.0) / x.weight(site), queue[0][2])
            elif site not in self.busy and x.weights.holds(site):
                self.unweigh.add(site)  # e.g. a lease reply without requests

    def forget_weights(self, x: Exchange) -> None:
        """Drop the stored weights of the sites gone (SiteWeights: in two steps around
        taking in the arrivals, so that a weight for requests on their way stays)."""
        weights = x.weights
        sites = self.unweigh
        self.unweigh = set()
        marked = weights.begin_forget(sites)
        if x.arrivals:
            self.absorb()
        again = weights.end_forget(marked, self._is_gone)
        if len(marked) < len(sites):
            kept = sites.difference(marked)
            again.extend(site for site in kept if self._is_gone(site))
        self.unweigh.update(again)
