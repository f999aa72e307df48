"""The key names of the sites a worker has in hand, cached in two generations.

A site's :class:`~streams_sched.frontier.keys.SiteKeys` holds about 1 KB of key
strings once its scripts have run. A worker touches them from a site's lease to its
ack, so a cache keeps those; but a broad crawl serves thousands of sites a second,
and a cache of every site served would grow with the crawl. When the young
generation is full it becomes the old one: what was used in the last two
generations stays, the rest goes.
"""

from __future__ import annotations

from streams_sched.frontier.keys import SiteKeys

__all__ = ["SiteKeyCache"]


class SiteKeyCache:
    __slots__ = ("old", "size", "young")

    def __init__(self, size: int = 1024) -> None:
        #: sites per generation
        self.size = size
        self.young: dict[str, SiteKeys] = {}
        self.old: dict[str, SiteKeys] = {}

    def get(self, site: str) -> SiteKeys | None:
        """The cached keys of ``site`` (kept for another generation), or None."""
        keys = self.young.get(site)
        if keys is None:
            keys = self.old.get(site)
            if keys is not None:
                self.add(keys)
        return keys

    def add(self, keys: SiteKeys) -> SiteKeys:
        young = self.young
        if len(young) >= self.size:
            self.old = young
            self.young = young = {}
        young[keys.site] = keys
        return keys

    def __len__(self) -> int:
        return len(self.young) + len(self.old)
