"""enqueue.lua: dedupe and add requests of several sites of one shard in one call.

The worker's I/O thread, the scrapy-redis feed and the Seeder all build their calls
here; the Seeder packs the same KEYS and ARGV as Redis protocol itself
(seeding/packing.py), from :func:`keys` and :func:`head_args`, with its own packing of
each site's part (tests/test_seeding.py checks it byte for byte against :func:`call`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgpack

from streams_sched.frontier.keys import ShardKeys, SiteKeys, stream_code
from streams_sched.frontier.records import BloomParams, Entry
from streams_sched.frontier.scripts._call import Arg, Call, Context

__all__ = ["EnqueueReply", "LoadItem", "args", "call", "dead_extra", "flags_of", "head_args", "keys", "load_args",
           "load_call", "load_keys", "parse", "parse_seed", "parse_site", "seed_call"]


class EnqueueReply(NamedTuple):
    """One site's part of the reply."""

    added: int
    duplicates: int
    delayed: int
    #: one byte per request, in order: ``1`` added, ``0`` a duplicate, ``c`` dropped over
    #: the site's page cap (``over_cap`` counts those); with 'load' keys also ``l`` taken
    #: before (the ledger has its line) and ``s`` a fingerprint recorded (SEEN_ONLY)
    flags: bytes
    over_cap: int = 0


def keys(shard: ShardKeys, sites: Sequence[tuple[SiteKeys, Sequence[str]]], seed: bool = False) -> list[str]:
    """The shard's ready indexes, inbox, stats, site registry, lists of new sites, dump
    journal and halt (a move), then per site: delayed, stats, policy, streams, then its Bloom filter pairs
    (current first). With ``seed`` (enqueue.lua's 'seed' keys) a site has only its stats and
    its filter pairs."""
    out = [*shard.readies, shard.inbox, shard.stats, shard.sites, *shard.freshes, shard.journal, shard.halt]
    for k, filters in sites:
        out += (k.stats, *filters) if seed else (k.delayed, k.stats, k.policy, *k.streams, *filters)
    return out


def load_keys(shard: ShardKeys, sites: Sequence[tuple[SiteKeys, Sequence[str]]], ledger: str) -> list[str]:
    """:func:`keys` with enqueue.lua's 'load' keys: each site's dlq after its filters, the
    load's ledger last."""
    out = [*shard.readies, shard.inbox, shard.stats, shard.sites, *shard.freshes, shard.journal, shard.halt]
    for k, filters in sites:
        out += (k.delayed, k.stats, k.policy, *k.streams, *filters, k.dlq)
    out.append(ledger)
    return out


def head_args(group: str, bloom: BloomParams, default_task: str, filter_pairs: int, seed: bool | str) -> list[Arg]:
    """ARGV[1..9]: the group, the dedupe back-end and its sizing, the revisit TTL, the
    crawl's default task type, the filter pairs per site, and which keys each site has
    (``seed``: True 'seed', False 'all', or the name)."""
    ttl = bloom.bucket_ttl if bloom.revisit_s else 0
    mode = seed if isinstance(seed, str) else ("seed" if seed else "all")
    return [group, bloom.mode, bloom.error_rate, bloom.capacity, bloom.expansion, ttl, default_task, filter_pairs, mode]


def args(
    group: str, bloom: BloomParams, default_task: str, filter_pairs: int,
    sites: Sequence[tuple[str, Sequence[Entry]]], seed: bool = False,
) -> list[Arg]:
    """:func:`head_args`, then per site: its name, the number of requests, then
    fingerprint, stream code, delay and payload of each. ``Entry.stream`` is an index into
    STREAMS, or ``SITE_TASK + band`` for the task type from the site's policy."""
    out = head_args(group, bloom, default_task, filter_pairs, seed)
    for site, items in sites:
        out += (site, len(items))
        for it in items:
            out += (it.fp, stream_code(it.stream), it.delay_ms, it.payload)
    return out


class LoadItem(NamedTuple):
    """A request of a file on its way in with enqueue.lua's 'load' keys: its entry
    (``Entry.stream`` may be ``DEAD_LETTER + index`` or ``SEEN_ONLY``), its line in the load's
    ledger (None: none), and extra: earlier failed deliveries of a request, or the packed
    fields of a dead letter (:func:`dead_extra`)."""

    entry: Entry
    line: int | None
    extra: bytes | str = ""


def dead_extra(reason: str, deliveries: int, node: str, ts_ms: int, origin_id: str, origin: str = "") -> bytes:
    """The extra value of a dead letter: enqueue.lua reads it with cmsgpack (strings only).
    ``origin``: the key it came from when that is no stream of its site ('' one is)."""
    packed: bytes = msgpack.packb([reason, str(deliveries), node, str(ts_ms), origin_id, origin], use_bin_type=False)
    return packed


def load_args(
    group: str, bloom: BloomParams, default_task: str, filter_pairs: int,
    sites: Sequence[tuple[str, Sequence[LoadItem]]], keep: bool = False,
) -> list[Arg]:
    """:func:`head_args` with 'load' ('load-keep' with ``keep``: requests go in whatever the
    seen filter says), then per site: its name, the number of requests, then fingerprint,
    stream code, delay, payload, ledger line and extra of each."""
    out = head_args(group, bloom, default_task, filter_pairs, "load-keep" if keep else "load")
    # numbers as the bytes redis-py would make of them: it then packs every value as is
    for site, items in sites:
        out += (site, len(items))
        for it in items:
            e = it.entry
            out += (e.fp, b"%d" % stream_code(e.stream), b"%d" % e.delay_ms, e.payload,
                    b"" if it.line is None else b"%d" % it.line, it.extra)
    return out


def parse_site(part: Sequence[Any]) -> EnqueueReply:
    """One site's part of the reply."""
    return EnqueueReply(int(part[0]), int(part[1]), int(part[2]), flags_of(part), int(part[4]) if len(part) > 4 else 0)


def flags_of(part: Sequence[Any]) -> bytes:
    """Only the flags of one site's part (the Seeder reads nothing else, a million times)."""
    return bytes(part[3])


def parse(reply: Sequence[Any]) -> list[EnqueueReply]:
    """A part per site, in call order."""
    return [parse_site(part) for part in reply]


def parse_seed(reply: Sequence[Any]) -> list[EnqueueReply | None]:
    """The reply of a call with 'seed' keys: None for each site it left untouched (send
    those again with all their keys)."""
    return [parse_site(part) if part else None for part in reply]


def call(f: Context, sites: Sequence[tuple[str, Sequence[Entry]]]) -> Call[list[EnqueueReply]]:
    """Dedupe and add the requests of several sites of ONE shard: (site, its entries) each
    (an entry's own ``site`` is not read)."""
    built, pairs = _keys(f, [site for site, _ in sites], False)
    return Call(f.scripts["enqueue"], built, args(f.group, f.bloom, f.default_task, pairs, sites), parse)


def seed_call(f: Context, sites: Sequence[tuple[str, Sequence[Entry]]]) -> Call[list[EnqueueReply | None]]:
    """:func:`call` with 'seed' keys: a new site's keys only (the others get None)."""
    built, pairs = _keys(f, [site for site, _ in sites], True)
    return Call(f.scripts["enqueue"], built, args(f.group, f.bloom, f.default_task, pairs, sites, True), parse_seed)


def load_call(f: Context, sites: Sequence[tuple[str, Sequence[LoadItem]]], file_id: str,
              keep: bool = False) -> Call[list[EnqueueReply]]:
    """:func:`call` with 'load' keys: the requests of a file, each taken once by the ledger of
    ``file_id`` (the sites of ONE shard); ``keep``: they go in whatever the seen filter says
    (a dump whose filters replace the sites' own after their requests)."""
    now = f.clock.now() if f.bloom.revisit_s else 0.0
    keyed = [(f.site(site), f.filters(site, now)) for site, _ in sites]
    shard = keyed[0][0].index
    built = load_keys(shard, keyed, shard.ledger(file_id))
    pairs = len(keyed[0][1]) // 2
    return Call(f.scripts["enqueue"], built, load_args(f.group, f.bloom, f.default_task, pairs, sites, keep), parse)


def _keys(f: Context, sites: Sequence[str], seed: bool) -> tuple[list[str], int]:
    """The KEYS of a call for these sites, and the filter pairs per site."""
    # the revisit buckets of Redis time now, so every writer puts a fingerprint in the same one
    now = f.clock.now() if f.bloom.revisit_s else 0.0
    keyed = [(f.site(site), f.filters(site, now)) for site in sites]
    return keys(keyed[0][0].index, keyed, seed), len(keyed[0][1]) // 2
