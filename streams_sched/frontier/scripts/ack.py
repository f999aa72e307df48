"""ack.lua: acknowledge and delete finished entries of several sites of one shard, each
site's healthy answers riding along."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from streams_sched.frontier.keys import ShardKeys, SiteKeys, stream_code
from streams_sched.frontier.scripts import feedback
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["SiteAcks", "args", "call", "keys", "parse"]

#: One site's part of a call: the site, its entries (stream index, id), and its healthy
#: answers with the feedback params (as for feedback.lua), or None.
SiteAcks = tuple[str, Iterable[tuple[int, bytes]], tuple[int, Sequence[Any]] | None]


def keys(shard: ShardKeys, sites: Sequence[SiteKeys]) -> list[str]:
    """The shard's leased index, then per site: stats, streams, policy, window."""
    out = [shard.leased]
    for k in sites:
        out += (k.stats, *k.streams, k.policy, k.window)
    return out


def args(group: str, sites: Sequence[SiteAcks], defaults: Sequence[str]) -> list[Arg]:
    """``defaults``: the crawl's default policy, for the answers (feedback.args)."""
    out: list[Arg] = [group]
    for site, entries, answers in sites:
        out.append(site)
        if answers is None:
            out.append(0)
        else:
            ok, params = answers
            extra = feedback.args((ok, 0, 0, 0), "", params, defaults)
            out += (len(extra), *extra)
        pairs: list[Arg] = []
        for stream, entry_id in entries:
            pairs += (stream_code(stream), entry_id)
        out += (len(pairs) // 2, *pairs)
    return out


def parse(reply: Sequence[Any]) -> list[int]:
    """The entries acked and deleted per site, in order."""
    return [int(v) for v in reply]


def call(f: Context, sites: Sequence[SiteAcks]) -> Call[list[int]]:
    """Ack entries of several sites of ONE shard: (site, entries, answers) each; answers
    (healthy answers, feedback params) reports what feedback.lua would with outcome
    (n, 0, 0, 0)."""
    keyed = [f.site(site) for site, _, _ in sites]
    return Call(f.scripts["ack"], keys(keyed[0].index, keyed), args(f.group, sites, f.default_policy), parse)
