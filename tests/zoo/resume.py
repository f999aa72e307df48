"""A spider middleware that drops every start request: the crawl goes on from what its
frontier holds, as a crawl moved to another Redis does (its start pages were crawled
before the move; ``dont_filter`` start requests would otherwise be crawled again)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any


class NoStart:
    async def process_start(self, start: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for _ in start:
            pass
        return
        yield  # an async generator that yields nothing

    def process_start_requests(self, start_requests: Iterable[Any], spider: Any) -> Iterable[Any]:
        return iter(())
