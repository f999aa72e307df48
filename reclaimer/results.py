"""What one reclaim pass did: per crawl and in sum (the health key and the log line)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .settings import DEFAULT_LEASE_S, DEFAULT_MAX_DELIVERIES

__all__ = ["CrawlPass", "PassResult"]


@dataclass
class CrawlPass:
    crawl: str
    #: sites looked at (expired leases, due delayed requests): not the crawl's number of sites
    sites: int = 0
    requeued: int = 0
    dead_lettered: int = 0
    promoted: int = 0
    consumers_removed: int = 0
    nodes_forgotten: int = 0
    lease_s: float = DEFAULT_LEASE_S
    max_deliveries: int = DEFAULT_MAX_DELIVERIES


@dataclass
class PassResult:
    crawls: list[CrawlPass] = field(default_factory=list)
    pruned: bool = False
    duration_s: float = 0.0
    #: when the pass ended: Redis time in epoch seconds (the health key's ts, the last-pass metric)
    ended_s: float = 0.0

    def total(self, name: str) -> int:
        return sum(int(getattr(c, name)) for c in self.crawls)

    def summary(self) -> dict[str, Any]:
        return {
            "crawls": len(self.crawls),
            "sites": self.total("sites"),
            "requeued": self.total("requeued"),
            "dead_lettered": self.total("dead_lettered"),
            "promoted": self.total("promoted"),
            "consumers_removed": self.total("consumers_removed"),
            "nodes_forgotten": self.total("nodes_forgotten"),
            "pruned": self.pruned,
            "duration_s": round(self.duration_s, 4),
        }
