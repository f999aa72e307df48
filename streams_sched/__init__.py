"""streams-sched: a distributed crawl frontier for Scrapy on Redis Streams consumer groups."""

from __future__ import annotations

__version__ = "0.1.0"
