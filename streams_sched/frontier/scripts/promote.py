"""promote.lua: move due delayed requests of one site into their streams."""

from __future__ import annotations

from typing import Any

from streams_sched.frontier.keys import SiteKeys
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["args", "call", "keys", "parse"]


def keys(k: SiteKeys) -> list[str]:
    """delayed, dlq, stats, streams, the shard's ready indexes and inbox."""
    return [k.delayed, k.dlq, k.stats, *k.streams, *k.index.readies, k.index.inbox]


def args(group: str, limit: int, site: str) -> list[Arg]:
    return [group, limit, site]


def parse(reply: Any) -> int:
    """The requests moved."""
    return int(reply)


def call(f: Context, site: str, limit: int = 1000) -> Call[int]:
    return Call(f.scripts["promote"], keys(f.site(site)), args(f.group, limit, site), parse)
