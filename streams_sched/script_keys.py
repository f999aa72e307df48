"""The KEYS of each script, built in one place: one function per ``lua/<name>.lua``.

Each function lists the keys in the order of its script's header (``-- KEYS[n] name``);
tests/test_contract.py parses the headers and checks every builder against them.
``streams`` is always the site's request streams in :data:`~streams_sched.keys.STREAMS`
order, the order the stream codes of ``lua/_codes.lua`` count in.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .keys import SiteKeys

__all__ = ["BUILDERS", "ack", "claim", "dead", "enqueue", "feedback", "lease", "promote",
           "prune", "release", "requeue_dead", "status"]


def enqueue(k: SiteKeys, filters: Sequence[str]) -> list[str]:
    """delayed, stats, policy, streams, then the Bloom filter pairs (current first)."""
    return [k.delayed, k.stats, k.policy, *k.streams, *filters]


def lease(k: SiteKeys) -> list[str]:
    """delayed, dlq, stats, policy, streams."""
    return [k.delayed, k.dlq, k.stats, k.policy, *k.streams]


def status(k: SiteKeys) -> list[str]:
    """delayed, dlq, stats, policy, streams."""
    return [k.delayed, k.dlq, k.stats, k.policy, *k.streams]


def claim(k: SiteKeys) -> list[str]:
    """dlq, stats, streams."""
    return [k.dlq, k.stats, *k.streams]


def dead(k: SiteKeys) -> list[str]:
    """dlq, stats, streams."""
    return [k.dlq, k.stats, *k.streams]


def requeue_dead(k: SiteKeys) -> list[str]:
    """dlq, stats, streams."""
    return [k.dlq, k.stats, *k.streams]


def ack(k: SiteKeys) -> list[str]:
    """stats, streams, policy, obs."""
    return [k.stats, *k.streams, k.policy, k.obs]


def release(k: SiteKeys) -> list[str]:
    """stats, streams."""
    return [k.stats, *k.streams]


def promote(k: SiteKeys) -> list[str]:
    """delayed, dlq, stats, streams."""
    return [k.delayed, k.dlq, k.stats, *k.streams]


def prune(k: SiteKeys) -> list[str]:
    """streams."""
    return list(k.streams)


def feedback(k: SiteKeys) -> list[str]:
    """policy, stats, obs."""
    return [k.policy, k.stats, k.obs]


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
    "promote": promote,
    "prune": prune,
    "feedback": feedback,
}
