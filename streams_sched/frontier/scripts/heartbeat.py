"""heartbeat.lua: write a live node's record, stamped with the time Redis received it."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from streams_sched.frontier.keys import CrawlKeys
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["RedisTime", "args", "call", "keys", "parse"]


class RedisTime(NamedTuple):
    """Redis TIME, as :meth:`RedisClock.observe` takes it."""

    seconds: int
    microseconds: int


def keys(k: CrawlKeys) -> list[str]:
    """The crawl's nodes hash."""
    return [k.nodes]


def args(node: str, info: Mapping[str, Any]) -> list[Arg]:
    """The node id and its record as JSON, without ``last_seen`` (the script sets it)."""
    return [node, json.dumps({k: v for k, v in info.items() if k != "last_seen"}, sort_keys=True)]


def parse(reply: Sequence[Any]) -> RedisTime:
    return RedisTime(int(reply[0]), int(reply[1]))


def call(f: Context, node: str, info: Mapping[str, Any]) -> Call[RedisTime]:
    return Call(f.scripts["heartbeat"], keys(f.keys), args(node, info), parse)
