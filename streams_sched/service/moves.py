"""A daemon's crawls that have moved to another Redis (``streams-sched move``): :class:`MovedCrawls`."""

from __future__ import annotations

from typing import Any

from streams_sched.errors import CrawlMoved
from streams_sched.frontier.moves import moved_crawls

__all__ = ["MovedCrawls"]


class MovedCrawls:
    """Leaves the crawls that moved alone, with one ``crawl_moved`` warning each, and stops
    the daemon (:class:`CrawlMoved`, exit code 6) once every crawl it looks after has moved:
    it is then started again with the new REDIS_URL. A daemon of several crawls goes on with
    those that have not. Costs one HGET per crawl and pass."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self.said: dict[str, str] = {}

    def keep(self, client: Any, crawls: list[str]) -> list[str]:
        """The crawls of ``crawls`` that have not moved; CrawlMoved if none is left."""
        moved = moved_crawls(client, crawls)
        for crawl, to in moved.items():
            if self.said.get(crawl) != to:
                self.said[crawl] = to
                self.log.warning("crawl_moved", crawl=crawl, to=to,
                                 hint=f"left alone here; a daemon for it runs with REDIS_URL={to}")
        if crawls and len(moved) == len(crawls):
            raise CrawlMoved(crawls[0], moved[crawls[0]])
        return [c for c in crawls if c not in moved]
