"""The KEYS of each script, built in one place: one function per ``lua/<name>.lua``.

Each function lists the keys in the order of its script's header (``-- KEYS[n] name``);
tests/test_contract.py parses the headers and checks every builder against them.
``streams`` is always the site's request streams in :data:`~streams_sched.frontier.keys.STREAMS`
order, the order the stream codes of ``lua/lib/codes.lua`` count in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from streams_sched.frontier.keys import CrawlKeys, ShardKeys, SiteKeys

__all__ = ["BUILDERS", "ack", "claim", "dead", "enqueue", "fail", "feedback", "heartbeat", "lease", "promote",
           "prune", "reindex", "release", "requeue_dead", "status"]


def enqueue(shard: ShardKeys, sites: Sequence[tuple[SiteKeys, Sequence[str]]], seed: bool = False) -> list[str]:
    """The shard's ready indexes, inbox, stats, site registry and lists of new sites, then per
    site: delayed, stats, policy, streams, then its Bloom filter pairs (current first). With
    ``seed`` (enqueue.lua's 'seed' keys) a site has only its stats and its filter pairs."""
    keys = [*shard.readies, shard.inbox, shard.stats, shard.sites, *shard.freshes]
    for k, filters in sites:
        keys += (k.stats, *filters) if seed else (k.delayed, k.stats, k.policy, *k.streams, *filters)
    return keys


def lease(shard: ShardKeys, sites: Sequence[SiteKeys]) -> list[str]:
    """The shard's ready indexes, leased index, inbox and lists of new sites, then per site:
    delayed, dlq, stats, policy, streams."""
    keys = [*shard.readies, shard.leased, shard.inbox, *shard.freshes]
    for k in sites:
        keys += (k.delayed, k.dlq, k.stats, k.policy, *k.streams)
    return keys


def status(k: SiteKeys) -> list[str]:
    """delayed, dlq, stats, policy, streams, the shard's inbox."""
    return [k.delayed, k.dlq, k.stats, k.policy, *k.streams, k.index.inbox]


def claim(k: SiteKeys) -> list[str]:
    """dlq, stats, streams, the shard's ready indexes and leased index."""
    return [k.dlq, k.stats, *k.streams, *k.index.readies, k.index.leased]


def dead(k: SiteKeys) -> list[str]:
    """dlq, stats, streams, the shard's leased index."""
    return [k.dlq, k.stats, *k.streams, k.index.leased]


def requeue_dead(k: SiteKeys) -> list[str]:
    """dlq, stats, streams, the shard's ready indexes and inbox."""
    return [k.dlq, k.stats, *k.streams, *k.index.readies, k.index.inbox]


def ack(shard: ShardKeys, sites: Sequence[SiteKeys]) -> list[str]:
    """The shard's leased index, then per site: stats, streams, policy, obs."""
    keys = [shard.leased]
    for k in sites:
        keys += (k.stats, *k.streams, k.policy, k.obs)
    return keys


def release(k: SiteKeys) -> list[str]:
    """stats, streams, the shard's ready indexes and leased index."""
    return [k.stats, *k.streams, *k.index.readies, k.index.leased]


def fail(k: SiteKeys) -> list[str]:
    """dlq, stats, streams, the shard's ready indexes and leased index."""
    return [k.dlq, k.stats, *k.streams, *k.index.readies, k.index.leased]


def promote(k: SiteKeys) -> list[str]:
    """delayed, dlq, stats, streams, the shard's ready indexes and inbox."""
    return [k.delayed, k.dlq, k.stats, *k.streams, *k.index.readies, k.index.inbox]


def prune(k: SiteKeys) -> list[str]:
    """streams."""
    return list(k.streams)


def feedback(k: SiteKeys) -> list[str]:
    """policy, stats, obs."""
    return [k.policy, k.stats, k.obs]


def reindex(k: SiteKeys) -> list[str]:
    """delayed, streams, the shard's ready indexes, leased index, inbox and site registry."""
    ix = k.index
    return [k.delayed, *k.streams, *ix.readies, ix.leased, ix.inbox, ix.sites]


def heartbeat(k: CrawlKeys) -> list[str]:
    """The crawl's nodes hash."""
    return [k.nodes]


#: script name -> its KEYS builder (one for every name in scripts.py SCRIPT_NAMES)
BUILDERS: dict[str, Callable[..., list[str]]] = {
    "enqueue": enqueue,
    "lease": lease,
    "status": status,
    "claim": claim,
    "dead": dead,
    "requeue_dead": requeue_dead,
    "ack": ack,
    "release": release,
    "fail": fail,
    "promote": promote,
    "prune": prune,
    "feedback": feedback,
    "reindex": reindex,
    "heartbeat": heartbeat,
}
