"""dead.lua: move leased entries of one site to its dead-letter stream, with a reason."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streams_sched.frontier.keys import SiteKeys, stream_code
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["args", "call", "keys", "parse"]


def keys(k: SiteKeys) -> list[str]:
    """dlq, stats, streams, the shard's leased index."""
    return [k.dlq, k.stats, *k.streams, k.index.leased]


def args(group: str, node: str, site: str, items: Iterable[tuple[int, bytes, str]]) -> list[Arg]:
    """``items``: (stream index, entry id, reason) each."""
    out: list[Arg] = [group, node, site]
    for stream, entry_id, reason in items:
        out += (stream_code(stream), entry_id, reason)
    return out


def parse(reply: Any) -> int:
    """The entries moved."""
    return int(reply)


def call(f: Context, site: str, node: str, items: Iterable[tuple[int, bytes, str]]) -> Call[int]:
    return Call(f.scripts["dead"], keys(f.site(site)), args(f.group, node, site, items), parse)
