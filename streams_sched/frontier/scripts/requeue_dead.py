"""requeue_dead.lua: put dead letters of one site back into the streams they came from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from streams_sched.frontier.keys import SiteKeys
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["RequeueDeadReply", "args", "call", "keys", "parse"]


class RequeueDeadReply(NamedTuple):
    requeued: int
    #: letters left where they are: no payload, or not from one of the site's streams
    kept: int
    #: ids no longer in the dead-letter stream
    missing: int


def keys(k: SiteKeys) -> list[str]:
    """dlq, stats, streams, the shard's ready indexes and inbox."""
    return [k.dlq, k.stats, *k.streams, *k.index.readies, k.index.inbox]


def args(group: str, site: str, ids: Sequence[str]) -> list[Arg]:
    return [group, site, *ids]


def parse(reply: Sequence[Any]) -> RequeueDeadReply:
    return RequeueDeadReply(int(reply[0]), int(reply[1]), int(reply[2]))


def call(f: Context, site: str, ids: Sequence[str]) -> Call[RequeueDeadReply]:
    return Call(f.scripts["requeue_dead"], keys(f.site(site)), args(f.group, site, ids), parse)
