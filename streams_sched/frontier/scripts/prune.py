"""prune.lua: remove consumers of one site's streams that own no pending entries."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streams_sched.frontier.keys import SiteKeys, stream_code
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["args", "call", "keys", "parse"]


def keys(k: SiteKeys) -> list[str]:
    """streams."""
    return list(k.streams)


def args(group: str, victims: Iterable[tuple[int, str]]) -> list[Arg]:
    """``victims``: (stream index, consumer name) each."""
    out: list[Arg] = [group]
    for stream, consumer in victims:
        out += (stream_code(stream), consumer)
    return out


def parse(reply: Any) -> int:
    """The consumers removed."""
    return int(reply)


def call(f: Context, site: str, victims: Iterable[tuple[int, str]]) -> Call[int]:
    return Call(f.scripts["prune"], keys(f.site(site)), args(f.group, victims), parse)
