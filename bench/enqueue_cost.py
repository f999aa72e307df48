"""``python -m bench enqueue-cost``: Redis time of one enqueue.lua call, against a revision's.

The same calls go to this tree's enqueue.lua and to REV's (``--rev``, default ``main``),
both loaded into one throwaway redis-server, in interleaved rounds (each round in the
other order than the last): a worker's call (one registered site, 64 requests, half of
them repeats, all keys) and a seeder's (500 new one-URL sites, 'seed' keys). Reported:
EVALSHA microseconds per call (INFO commandstats) per round, their medians, and the ratio.
It measures what a change to enqueue.lua costs a crawl that does not use what it adds
(the dump's journal, a load's keys).

    python -m bench enqueue-cost                 # against main, 10 rounds
    python -m bench enqueue-cost --rev HEAD~3 --rounds 20
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
from pathlib import Path
from typing import Any

from .revision import checkout

#: enqueue.lua's helper files, in the order they are joined (frontier/scripts/_source.py)
_LIB_ORDER = ("codes", "time", "rate", "streams", "delayed", "inbox", "index", "bands", "answers", "bloom")
PAYLOAD = b"\x83\xa1u\xb3http://a.test/p/1234\xa1c\xa5parse\xa2mt\x81\xa5depth\x07"


def script_of(root: Path) -> str:
    """enqueue.lua of the tree at ``root`` as it is sent: its helper files, then its body."""
    lua = root / "streams_sched" / "frontier" / "lua"
    body = (lua / "enqueue.lua").read_text()
    line = next(x for x in body.splitlines() if x.startswith("-- include:"))
    named = {n.strip() for n in line.split(":", 1)[1].split(",")}
    return "\n".join([*((lua / "lib" / f"{n}.lua").read_text() for n in _LIB_ORDER if n in named), body])


def _fps(n: int, salt: bytes) -> list[bytes]:
    return [hashlib.sha1(salt + i.to_bytes(8, "big")).digest() for i in range(n)]


def call_args(text: str, crawl: str, sites: list[str], per_site: int, salt: bytes, seed: bool) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one call, laid out as ``text``'s header says (with or without a journal key)."""
    from streams_sched.frontier.keys import ShardKeys, SiteKeys

    shard = ShardKeys(crawl, 0)
    keys = [*shard.readies, shard.inbox, shard.stats, shard.sites, *shard.freshes]
    if "-- KEYS[8]      journal" in text:
        keys.append(shard.journal)
    args: list[Any] = ["workers", "bitmap", 0.001, 100000, 2, 0, "http", 1, "seed" if seed else "all"]
    for s in sites:
        k = SiteKeys(crawl, s, 0)
        keys += [k.stats, k.seen, k.seen_meta] if seed else [k.delayed, k.stats, k.policy, *k.streams, k.seen, k.seen_meta]
        args += [s, per_site]
        for fp in _fps(per_site, salt + s.encode()):
            args += [fp, 2, 0, PAYLOAD]
    return keys, args


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench enqueue-cost", description=__doc__.splitlines()[0])
    p.add_argument("--rev", default="main", help="the revision to compare with (default main)")
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    import redis

    from streams_sched.testing import RedisServer

    texts = {"this tree": script_of(Path(__file__).resolve().parent.parent), args.rev: script_of(checkout(args.rev))}
    kinds = list(texts)
    res: dict[tuple[str, str], list[float]] = {(path, k): [] for path in ("worker", "seeder") for k in kinds}
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        shas = {k: r.script_load(t) for k, t in texts.items()}
        for rnd in range(args.rounds):
            for kind in kinds if rnd % 2 == 0 else kinds[::-1]:
                crawl = f"c{rnd}{kinds.index(kind)}"
                r.config_resetstat()
                for c in range(200):  # a worker's calls: one registered site, 64 requests, half repeats
                    keys, argv_ = call_args(texts[kind], crawl, [f"s{c % 20}.test"], 64, b"%d" % (c // 2), False)
                    r.evalsha(shas[kind], len(keys), *keys, *argv_)
                res[("worker", kind)].append(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
                r.config_resetstat()
                for c in range(60):  # a seeder's calls: 500 new one-URL sites, 'seed' keys
                    keys, argv_ = call_args(texts[kind], crawl + "s", [f"n{c}x{i}.test" for i in range(500)], 1, b"s", True)
                    r.evalsha(shas[kind], len(keys), *keys, *argv_)
                res[("seeder", kind)].append(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
                r.flushall()
    print(f"# bench enqueue-cost: enqueue.lua of this tree against {args.rev}, {args.rounds} rounds\n")
    print(f"| call | this tree µs/call | {args.rev} µs/call | ratio | rounds (this tree; {args.rev}) |")
    print("|---|---:|---:|---:|---|")
    for path in ("worker", "seeder"):
        mine, theirs = res[(path, kinds[0])], res[(path, kinds[1])]
        a, b = statistics.median(mine), statistics.median(theirs)
        print(f"| {path} | {a:.1f} | {b:.1f} | {a / b:.3f} | {', '.join(f'{x:.0f}' for x in mine)};"
              f" {', '.join(f'{x:.0f}' for x in theirs)} |")
    sys.stdout.flush()
    return 0
