"""What a worker holds: its leases, counted per site and per task type.

The I/O thread records every entry it leases or takes over (:meth:`LeaseBook.take`)
and every lease that ends (:meth:`LeaseBook.end`). The counts decide how much
more to lease (``plan_shards`` in selection.py), the browser caps, and whether
the worker may take over an expired lease: a worker holds at most one
*suspect* entry (one that failed a delivery before), so a poison request
cannot take an innocent one down with it. The set of lease ids tells leases
Redis granted but whose reply was lost (recovery.py). Pure data, no Redis.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from streams_sched.frontier.keys import BROWSER_FIRST_STREAM
from streams_sched.frontier.records import LeasedEntry
from streams_sched.worker.io.recovery import LeaseKey

__all__ = ["LeaseBook"]


@dataclass(slots=True)
class LeaseBook:
    """Counts of the leases one worker holds."""

    by_site: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    total: int = 0
    browser: int = 0
    browser_by_site: defaultdict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: held entries that failed a delivery before (at most one is taken at a time)
    suspects: int = 0
    ids: set[LeaseKey] = field(default_factory=set)

    def take(self, entry: LeasedEntry) -> None:
        """The worker now holds ``entry``."""
        self.by_site[entry.site] += 1
        self.total += 1
        self.ids.add((entry.site, entry.stream, entry.id))
        if entry.stream >= BROWSER_FIRST_STREAM:
            self.browser += 1
            self.browser_by_site[entry.site] += 1
        if entry.suspect:
            self.suspects += 1

    def end(self, entry: LeasedEntry) -> bool:
        """The lease of ``entry`` ended (acked, dead-lettered, handed back).

        Returns True if it was a suspect, so the next expired lease may be taken.
        """
        _decrement(self.by_site, entry.site)
        self.total -= 1
        self.ids.discard((entry.site, entry.stream, entry.id))
        if entry.stream >= BROWSER_FIRST_STREAM:
            self.browser -= 1
            _decrement(self.browser_by_site, entry.site)
        if entry.suspect:
            self.suspects -= 1
            return True
        return False


def _decrement(counts: defaultdict[str, int], key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
