"""The scheduler's ready sites, in the order weighted fairness serves them (reactor thread only).

The site served next is the one with the least ``level`` (requests served per weight)
among the ready sites whose next request's Scrapy downloader slot can take one more;
between equal levels, the site that became ready first. :class:`ReadySites` finds it in
O(log n) per request, where looking at every ready site would cost O(ready sites), and a
broad crawl has hundreds of them ready at any time.

- Each ready site belongs to the *group* of its next request's downloader slot key
  (``None``: no slot to check). A group keeps its sites in a heap by (level, order); its
  best site is the top.
- ``_open`` holds the groups whose slot was not found full, by their best site;
  ``_all`` holds every group, which gives the least level of all the ready sites (the
  level a site coming back starts from, selection.credit_at_level).
- :meth:`ReadySites.pick` takes the best open group and asks the caller whether its
  slot is full. A full one is *parked*, out of ``_open``, until the caller
  :meth:`~ReadySites.unpark` s it: one look per slot that fills, however many sites
  wait behind it.
- Nothing is searched: a changed site or group is pushed again with a new stamp, and
  an entry whose stamp is no longer its site's (group's) is dropped when it reaches
  the top. A heap with more dropped entries than live ones is rebuilt.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Hashable, Mapping
from heapq import heapify, heappop, heappush, heapreplace

__all__ = ["ReadySites"]

#: a site's entry in its group's heap: (level, order, stamp, site)
_SiteEntry = tuple[float, int, int, str]
#: a group's entry in _open and _all: (level, order, stamp, slot key) of its best site
_GroupEntry = tuple[float, int, int, Hashable]

#: rebuild a heap once it holds more than twice its live entries plus this
_SLACK = 32


class _Site:
    __slots__ = ("level", "order", "slot", "stamp")

    def __init__(self, level: float, order: int, slot: Hashable) -> None:
        self.level = level
        self.order = order
        self.stamp = order
        self.slot = slot


class _Group:
    __slots__ = ("heap", "live", "parked", "stamp")

    def __init__(self) -> None:
        self.heap: list[_SiteEntry] = []
        self.live = 0
        self.stamp = 0
        self.parked = False


class ReadySites:
    """The ready sites by level and downloader slot; see the module."""

    __slots__ = ("_all", "_groups", "_next", "_open", "_parked", "_sites", "parked")

    def __init__(self) -> None:
        self._sites: dict[str, _Site] = {}
        self._groups: dict[Hashable, _Group] = {}
        self._open: list[_GroupEntry] = []
        self._all: list[_GroupEntry] = []
        self._parked: dict[Hashable, _Group] = {}
        #: the slot keys of the groups parked because their slot was full (read only)
        self.parked: Mapping[Hashable, object] = self._parked
        #: orders and stamps: one counter, so a later order is a later add
        self._next = itertools.count(1).__next__

    def __len__(self) -> int:
        return len(self._sites)

    def __contains__(self, site: object) -> bool:
        return site in self._sites

    def add(self, site: str, level: float, slot: Hashable) -> None:
        """``site`` became ready: served after every ready site of the same level."""
        rec = self._sites[site] = _Site(level, self._next(), slot)
        self._enter(site, rec)

    def update(self, site: str, level: float, slot: Hashable) -> None:
        """The level of ``site`` changed, or the slot of its next request did; it keeps its order."""
        rec = self._sites[site]
        if rec.slot != slot:
            self._leave(rec)
            rec.level = level
            rec.stamp = self._next()
            rec.slot = slot
            self._enter(site, rec)
            return
        if rec.level == level:
            return
        g = self._groups[slot]
        heap = g.heap
        was_best = heap[0][2] == rec.stamp
        rec.level = level
        rec.stamp = stamp = self._next()
        entry = (level, rec.order, stamp, site)
        if was_best:
            heapreplace(heap, entry)
            self._clean(heap)
            self._publish(slot, g)
        else:
            heappush(heap, entry)
            if heap[0] is entry:
                self._publish(slot, g)
            elif len(heap) > 2 * g.live + _SLACK:
                self._compact(g)

    def remove(self, site: str) -> None:
        """``site`` has nothing ready any more."""
        self._leave(self._sites.pop(site))

    def least_level(self) -> float | None:
        """The least level of all the ready sites, parked or not (None: no site ready)."""
        heap = self._all
        groups = self._groups
        while heap:
            level, _order, stamp, key = heap[0]
            g = groups.get(key)
            if g is not None and g.stamp == stamp:
                return level
            heappop(heap)
        return None

    def pick(self, full: Callable[[Hashable], bool] | None = None) -> str | None:
        """The least served ready site per weight whose slot is not ``full`` (None: no slot
        is checked); groups found full are parked. None if every ready site is parked."""
        heap = self._open
        groups = self._groups
        while heap:
            _level, _order, stamp, key = heap[0]
            g = groups.get(key)
            if g is None or g.stamp != stamp or g.parked:
                heappop(heap)
                continue
            if full is not None and full(key):
                heappop(heap)
                g.parked = True
                self._parked[key] = g
                continue
            return g.heap[0][3]
        return None

    def unpark(self, slot: Hashable) -> None:
        """The slot of a parked group may have room: its sites compete again."""
        g = self._parked.pop(slot, None)
        if g is None:
            return
        g.parked = False
        top = g.heap[0]
        heappush(self._open, (top[0], top[1], g.stamp, slot))

    def clear(self) -> None:
        self._sites.clear()
        self._groups.clear()
        self._open.clear()
        self._all.clear()
        self._parked.clear()

    # -- internals ------------------------------------------------------------

    def _enter(self, site: str, rec: _Site) -> None:
        g = self._groups.get(rec.slot)
        if g is None:
            g = self._groups[rec.slot] = _Group()
        g.live += 1
        entry = (rec.level, rec.order, rec.stamp, site)
        heap = g.heap
        heappush(heap, entry)
        if heap[0] is entry:
            self._publish(rec.slot, g)
        elif len(heap) > 2 * g.live + _SLACK:
            self._compact(g)

    def _leave(self, rec: _Site) -> None:
        """Take the site of ``rec`` (its stamp still current) out of its group."""
        slot = rec.slot
        g = self._groups[slot]
        g.live -= 1
        if not g.live:
            del self._groups[slot]
            self._parked.pop(slot, None)
            return
        heap = g.heap
        if heap[0][2] == rec.stamp:
            rec.stamp = -1  # its entry is not live any more, whatever happens to rec next
            heappop(heap)
            self._clean(heap)
            self._publish(slot, g)

    def _live(self, entry: _SiteEntry) -> bool:
        rec = self._sites.get(entry[3])
        return rec is not None and rec.stamp == entry[2]

    def _clean(self, heap: list[_SiteEntry]) -> None:
        """Drop the dead entries from the top of a group's heap (its top is then its best site)."""
        while not self._live(heap[0]):
            heappop(heap)

    def _compact(self, g: _Group) -> None:
        g.heap = [e for e in g.heap if self._live(e)]
        heapify(g.heap)

    def _publish(self, slot: Hashable, g: _Group) -> None:
        """The best site of group ``g`` changed: push the group again under a new stamp."""
        g.stamp = stamp = self._next()
        top = g.heap[0]
        entry = (top[0], top[1], stamp, slot)
        heappush(self._all, entry)
        if not g.parked:
            heappush(self._open, entry)
        limit = 2 * len(self._groups) + _SLACK
        if len(self._all) > limit or len(self._open) > limit:
            self._rebuild()

    def _rebuild(self) -> None:
        entries = [(g.heap[0][0], g.heap[0][1], g.stamp, key, g.parked) for key, g in self._groups.items()]
        self._all = [e[:4] for e in entries]
        self._open = [e[:4] for e in entries if not e[4]]
        heapify(self._all)
        heapify(self._open)
