"""release.lua: hand back leases a consumer will not finish, delivery counts unchanged."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from streams_sched.frontier.keys import SiteKeys, stream_code
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["args", "call", "keys", "parse"]


def keys(k: SiteKeys) -> list[str]:
    """stats, streams, the shard's ready indexes and leased index."""
    return [k.stats, *k.streams, *k.index.readies, k.index.leased]


def args(group: str, consumer: str, site: str, entries: Iterable[tuple[int, bytes]]) -> list[Arg]:
    """``entries``: (stream index, entry id) each."""
    out: list[Arg] = [group, consumer, site]
    for stream, entry_id in entries:
        out += (stream_code(stream), entry_id)
    return out


def parse(reply: Any) -> int:
    """The entries handed back."""
    return int(reply)


def call(f: Context, site: str, consumer: str, entries: Iterable[tuple[int, bytes]]) -> Call[int]:
    return Call(f.scripts["release"], keys(f.site(site)), args(f.group, consumer, site, entries), parse)
