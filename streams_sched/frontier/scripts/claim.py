"""claim.lua: take over expired leases of one site (XAUTOCLAIM), or requeue them."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

from streams_sched.frontier.keys import TASK_TYPES, SiteKeys, stream_mask
from streams_sched.frontier.records import LeasedEntry
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts._call import Arg, Call, Context
from streams_sched.frontier.scripts.lease import leased_entries

__all__ = ["NO_MASK", "ClaimReply", "args", "call", "keys", "parse"]

#: the stream mask that considers every stream
NO_MASK = stream_mask(TASK_TYPES)


class ClaimReply(NamedTuple):
    taken: int
    #: entries moved to the dead-letter stream, over the most deliveries
    dead: int
    #: the entries taken, in 'claim' mode (none in 'requeue' mode)
    entries: list[LeasedEntry]


def keys(k: SiteKeys) -> list[str]:
    """dlq, stats, streams, the shard's ready indexes and leased index, the site's policy,
    the shard's halt."""
    return [k.dlq, k.stats, *k.streams, *k.index.readies, k.index.leased, k.policy, k.index.halt]


def args(
    group: str, consumer: str, min_idle_ms: int, count: int, max_deliveries: int, mode: str, mask: str, site: str
) -> list[Arg]:
    return [group, consumer, min_idle_ms, count, max_deliveries, mode, mask, site]


def parse(site: str, reply: Sequence[Any]) -> ClaimReply:
    """Each entry taken carries its site's policy revisit, as a leased one does."""
    entries = leased_entries(site, reply, 3, claimed=True)
    revisit = text(reply[2])
    if revisit:
        for e in entries:
            e.revisit = revisit
    return ClaimReply(int(reply[0]), int(reply[1]), entries)


def call(
    f: Context, site: str, consumer: str, min_idle_ms: int, count: int, max_deliveries: int, mode: str = "claim",
    mask: str = NO_MASK,
) -> Call[ClaimReply]:
    """Take over up to ``count`` entries of ``site`` idle for ``min_idle_ms`` (``mode``
    'claim': they become ``consumer``'s leases; 'requeue': back to their streams) in the
    streams ``mask`` names; an entry past ``max_deliveries`` goes to the dead letters."""
    built = args(f.group, consumer, min_idle_ms, count, max_deliveries, mode, mask, site)
    return Call(f.scripts["claim"], keys(f.site(site)), built, functools.partial(parse, site))
