"""fail.lua: leases of one site whose delivery failed: back to their stream with the
delivery counted, or to the dead-letter stream after the most deliveries."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from streams_sched.frontier.keys import SiteKeys, stream_code
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["FailReply", "args", "call", "keys", "parse"]


class FailReply(NamedTuple):
    requeued: int
    dead: int


def keys(k: SiteKeys) -> list[str]:
    """dlq, stats, streams, the shard's ready indexes and leased index."""
    return [k.dlq, k.stats, *k.streams, *k.index.readies, k.index.leased]


def args(
    group: str, consumer: str, site: str, max_deliveries: int, entries: Iterable[tuple[int, bytes, str]]
) -> list[Arg]:
    """``entries``: (stream index, entry id, what went wrong) each."""
    out: list[Arg] = [group, consumer, site, max_deliveries]
    for stream, entry_id, what in entries:
        out += (stream_code(stream), entry_id, what)
    return out


def parse(reply: Sequence[Any]) -> FailReply:
    return FailReply(int(reply[0]), int(reply[1]))


def call(
    f: Context, site: str, consumer: str, max_deliveries: int, entries: Iterable[tuple[int, bytes, str]]
) -> Call[FailReply]:
    built = args(f.group, consumer, site, max_deliveries, entries)
    return Call(f.scripts["fail"], keys(f.site(site)), built, parse)
