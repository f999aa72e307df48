"""reindex.lua: put one site in its shard's indexes as its keys say."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from streams_sched.frontier.keys import SiteKeys
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["ReindexReply", "args", "call", "keys", "parse"]


class ReindexReply(NamedTuple):
    backlog_http: int
    backlog_browser: int
    pending: int
    delayed: int


def keys(k: SiteKeys) -> list[str]:
    """delayed, streams, the shard's ready indexes, leased index, inbox and site registry."""
    ix = k.index
    return [k.delayed, *k.streams, *ix.readies, ix.leased, ix.inbox, ix.sites]


def args(group: str, site: str, lease_score_ms: int) -> list[Arg]:
    return [group, site, lease_score_ms]


def parse(reply: Sequence[Any]) -> ReindexReply:
    return ReindexReply(*(int(v) for v in reply))


def call(f: Context, site: str, lease_score_ms: int = 0) -> Call[ReindexReply]:
    """``lease_score_ms``: the score of a site that enters the leased index (0: look at its leases now)."""
    return Call(f.scripts["reindex"], keys(f.site(site)), args(f.group, site, lease_score_ms), parse)
