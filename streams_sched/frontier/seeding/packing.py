"""A batch of seeds as enqueue.lua calls packed in the Redis protocol, byte for byte what
redis-py sends for ``scripts.enqueue.call`` (tests/test_seeding.py checks it).

The calls come from frontier/batches.py (``enqueue_calls``, the grouping every producer
uses); only the packing is the Seeder's own: a million sites' keys cost less as one
formatting of a per-site template each than as eleven arguments to pack.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streams_sched.frontier.batches import CallParts
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import ShardKeys, SiteKeys, shard_of, stream_code
from streams_sched.frontier.records import Entry
from streams_sched.frontier.scripts import enqueue
from streams_sched.frontier.scripts._call import Arg
from streams_sched.frontier.seeding.wire import bulk

__all__ = ["Batch", "Packed", "Packer"]


class Packed:
    """One enqueue.lua call of a batch: its shard, its (site, entries) parts, the command
    packed, the primary it goes to, and then its reply."""

    __slots__ = ("shard", "parts", "command", "node", "seed", "reply")

    def __init__(self, shard: int, parts: CallParts, command: bytes, node: str, seed: bool = False) -> None:
        self.shard = shard
        self.parts = parts
        self.command = command
        self.node = node
        #: sent with only the keys a new site needs (enqueue.lua's 'seed' keys)
        self.seed = seed
        self.reply: Any = None


@dataclass
class Batch:
    """A batch of seeds on its way: its calls, what it found already, a crawl registration."""

    calls: list[Packed]
    #: URLs a migrated scrapy-redis dupefilter saw (never sent)
    duplicates: list[str] = field(default_factory=list)
    register: str | None = None
    #: the primary the registration went to (the one to read its reply from)
    register_node: str = ""
    #: the calls that sent again, with all their keys, the sites its 'seed' calls left
    again: list[Packed] = field(default_factory=list)


class Packer:
    """Packs the enqueue.lua calls of one crawl (keeps the per-shard parts it packed)."""

    def __init__(self, frontier: Frontier) -> None:
        self.frontier = frontier
        self.crawl = frontier.crawl
        self._shard_parts: dict[int, tuple[str, int, bytes, bytes]] = {}

    def shard_part(self, shard: int) -> tuple[str, int, bytes, bytes]:
        """A shard's first key, the number and the RESP of the keys enqueue.lua takes for the
        shard itself, and the prefix of its sites' keys (bytes)."""
        part = self._shard_parts.get(shard)
        if part is None:
            probe = SiteKeys(self.crawl, "\x00", shard)
            if not probe.base.endswith("\x00"):  # pragma: no cover - keys.py puts the site last
                raise AssertionError(f"site keys of {probe!r} do not end with the site")
            keys = enqueue.keys(ShardKeys(self.crawl, shard), [])
            part = (keys[0], len(keys), b"".join(bulk(k.encode()) for k in keys), probe.base[:-1].encode())
            self._shard_parts[shard] = part
        return part

    def site_layout(self, now: float, seed: bool = False) -> tuple[list[bytes], list[bytes]]:
        """The suffixes of the keys enqueue.lua takes per site (after the site's key prefix;
        the same for every site at Redis time ``now``: revisit buckets change with it), and the
        call's ARGV head (with ``seed``: its 'seed' keys), as bytes, from the enqueue
        script's own builders (scripts/enqueue.py)."""
        f, b = self.frontier, self.frontier.bloom
        k = SiteKeys(self.crawl, "\x00", 0)
        if b.revisit_s:
            filters: list[str] = []
            for bucket in b.buckets(now):
                filters += k.seen_bucket(bucket)
        else:
            filters = [k.seen, k.seen_meta]
        keys = enqueue.keys(k.index, [(k, filters)], seed)[len(enqueue.keys(k.index, [])):]
        if not all(key.startswith(k.base) for key in keys):  # pragma: no cover - keys.py puts the site last
            raise AssertionError("enqueue.lua's site keys do not all start with the site's key prefix")
        suffixes = [key[len(k.base):].encode() for key in keys]
        head = enqueue.head_args(f.group, b, f.default_task, len(filters) // 2, seed)
        return suffixes, [_encoded(v) for v in head]

    def pack(self, calls: list[CallParts], node_of: Callable[[str], str], seed: bool = False) -> list[Packed]:
        """Each call (the sites of one shard) packed as one EVALSHA, for the primary
        ``node_of`` names for the shard's first key (with ``seed``: enqueue.lua's 'seed'
        keys)."""
        if not calls:
            return []
        suffixes, head = self.site_layout(self.frontier.clock.now() if self.frontier.bloom.revisit_s else 0.0, seed)
        head_resp = b"".join(bulk(v) for v in head)
        start = bulk(b"EVALSHA") + bulk(self.frontier.scripts["enqueue"].sha.encode())
        templates: dict[int, bytes] = {}  # by key prefix length: the RESP of a site's keys
        codes: dict[tuple[int, int], bytes] = {}  # (stream, delay) -> their RESP
        n_sfx = len(suffixes)
        out: list[Packed] = []
        shards = self.frontier.shards
        for parts in calls:
            shard = shard_of(parts[0][0], shards)
            first_key, n_shard_keys, shard_resp, prefix = self.shard_part(shard)
            keys: list[bytes] = [shard_resp]
            args: list[bytes] = [head_resp]
            nargs = len(head)
            for name, items in parts:
                site_b = name.encode()
                base = prefix + site_b
                template = templates.get(len(base))
                if template is None:
                    template = templates[len(base)] = b"".join(
                        b"$%d\r\n%%b%b\r\n" % (len(base) + len(sfx), sfx.replace(b"%", b"%%")) for sfx in suffixes
                    )
                keys.append(template % ((base,) * n_sfx))
                args.append(b"$%d\r\n%b\r\n%b" % (len(site_b), site_b, bulk(b"%d" % len(items))))
                nargs += 2 + 4 * len(items)
                _pack_entries(items, codes, args)
            nkeys = n_shard_keys + n_sfx * len(parts)
            command = b"".join([b"*%d\r\n" % (3 + nkeys + nargs), start, bulk(b"%d" % nkeys), *keys, *args])
            out.append(Packed(shard, parts, command, node_of(first_key), seed))
        return out


def _encoded(value: Arg) -> bytes:
    """An argument as redis-py encodes it: numbers as their repr, text as UTF-8."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    if isinstance(value, (int, float)):
        return repr(value).encode()
    return bytes(value)


def _pack_entries(items: list[Entry], codes: dict[tuple[int, int], bytes], args: list[bytes]) -> None:
    """Append the four arguments of each entry (fp, stream code, delay, payload)."""
    append = args.append
    for e in items:
        cd = codes.get((e.stream, e.delay_ms))
        if cd is None:
            cd = codes[(e.stream, e.delay_ms)] = bulk(b"%d" % stream_code(e.stream)) + bulk(b"%d" % e.delay_ms)
        fp, payload = e.fp, e.payload
        append(b"$%d\r\n%b\r\n%b$%d\r\n%b\r\n" % (len(fp), fp, cd, len(payload), payload))
