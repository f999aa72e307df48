"""A bounded local memory of fingerprints this worker already sent to Redis.

Redis' Bloom filter is the authority on duplicates; this cache only saves
sending a request again that this worker itself enqueued before (on a page
with many repeated links, most of them). Two generations of sets: when the
young one is full it becomes the old one, so memory stays bounded and lookups
stay O(1).
"""

from __future__ import annotations

__all__ = ["SeenCache"]


class SeenCache:
    def __init__(self, size: int) -> None:
        self.half = max(size // 2, 0)
        self.young: set[bytes] = set()
        self.old: set[bytes] = set()

    def __contains__(self, fp: bytes) -> bool:
        return fp in self.young or fp in self.old

    def add(self, fp: bytes) -> None:
        if not self.half:
            return
        young = self.young
        young.add(fp)
        if len(young) >= self.half:
            self.old = young
            self.young = set()

    def __len__(self) -> int:
        return len(self.young) + len(self.old)
