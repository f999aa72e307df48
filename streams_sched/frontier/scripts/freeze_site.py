"""freeze_site.lua: copy one site's requests to short-lived keys and take its state at once."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streams_sched.frontier.keys import ShardKeys, SiteKeys
from streams_sched.frontier.scripts._call import Arg, Call, Context
from streams_sched.frontier.scripts.read_site import SiteHead, parse_head

__all__ = ["FrozenKeys", "args", "call", "copies", "keys", "parse"]

#: how long the copies live if the dump that made them dies (it deletes them when done)
COPY_TTL_MS = 3_600_000


class FrozenKeys(SiteKeys):
    """A site's keys whose delayed ZSET, dead letters and streams are its frozen copies (the
    rest are the site's own): read_site.lua reads them like the site."""

    __slots__ = ()


def copies(k: SiteKeys, tag: str) -> FrozenKeys:
    """Where ``k``'s requests are copied: scratch keys of its shard named by ``tag``."""
    frozen = FrozenKeys(k.crawl, k.site, k.shard)
    ix: ShardKeys = k.index
    frozen.delayed = ix.scratch(f"{tag}:delayed")
    frozen.dlq = ix.scratch(f"{tag}:dlq")
    frozen.streams = tuple(ix.scratch(f"{tag}:q{i}") for i in range(len(k.streams)))
    return frozen


def keys(k: SiteKeys, to: SiteKeys | None = None, filters: Sequence[str] = ()) -> list[str]:
    """delayed, dlq, stats, policy, streams, the shard's inbox and journal, then where the
    delayed ZSET, the dead letters and the streams go, then the seen keys to read whole."""
    out = [k.delayed, k.dlq, k.stats, k.policy, *k.streams, k.index.inbox, k.index.journal]
    if to is not None:
        out += (to.delayed, to.dlq, *to.streams, *filters)
    return out


def args(group: str, site: str, ttl_ms: int = COPY_TTL_MS) -> list[Arg]:
    return [group, site, ttl_ms]


def parse(reply: Sequence[Any]) -> SiteHead:
    return parse_head(reply)


def call(f: Context, site: str, to: FrozenKeys, filters: Sequence[str] = ()) -> Call[SiteHead]:
    return Call(f.scripts["freeze_site"], keys(f.site(site), to, filters), args(f.group, site), parse)
