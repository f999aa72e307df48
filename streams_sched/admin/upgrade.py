"""Moving a crawl written before shards to the sharded layout (``streams-sched upgrade``).

A crawl of the per-site layout gives each site a hash tag of its own, ``{C/site}``
(:class:`~streams_sched.frontier.keys.SiteKeys` without a shard), keeps one registry of its
sites, ``ss:{C}:sites``, and has no shard indexes. The sharded layout (keys.py) puts a
site's keys under its shard's tag ``{C/#n}`` and names it in the shard's indexes.

What an upgrade does, in this order:

1. It refuses while a node of the crawl is online (a worker of either version would
   write keys behind its back), unless forced.
2. It fixes the number of shards in the crawl's meta hash, field ``upgrade_shards``
   (HSETNX), so that a second run after a crash puts every site where the first run
   put it. The field ``shards`` itself is written only at the end: a Frontier refuses
   a crawl (LayoutError) only while the old registry exists *and* meta has no
   ``shards``, so writing it first would let workers start on a half-moved crawl.
3. For each site of the old registry (SSCAN, ``batch`` sites per round trip): one
   read-only script call counts what its old keys hold and DUMPs every one that exists
   (its streams, delayed requests, seen filter with its revisit buckets, dead letters,
   stats, policy, observed window), which is RESTOREd under its new name with its
   remaining TTL. DUMP/RESTORE keeps a stream's
   consumer group and pending entries with their delivery counts and idle times, so
   a leased entry stays leased and is taken over once its lease expires. Then
   ``reindex.lua`` puts the site in its shard's indexes (its leased-index score is 0:
   the first takeover looks at its leases at once) and registry, and only once all
   of that succeeded are the old keys deleted, in one DEL (they share a slot).
4. The shards' ``enqueued`` counters (what a worker's drain check reads to tell a
   crawl that never had a request) get the sum of their sites' ``enqueued`` stats.
5. ``shards`` goes into meta, then the old registry is deleted: the crawl is upgraded.

Running it again is safe at any point. The old keys of a site are deleted in one
command, after its new keys are in place, so a site has either (some of) its old keys
or none:

- none: an earlier run moved it (or it never had keys); it is skipped;
- some: the old keys are the truth, whatever new keys exist. While the old registry
  exists and meta has no ``shards``, nothing but an upgrade writes the new names (every
  Frontier refuses the crawl), so a new key beside an old one is what an earlier run
  restored: RESTORE ... REPLACE overwrites it, and a new key whose old one is gone
  since (a revisit filter that expired, a stream that an old worker emptied) is
  deleted rather than kept stale.

On Redis Cluster nothing changes: a site's old keys share one slot (the read script
touches only them), RESTORE is a single-key command, so a key can move to a slot of
another master; the old registry and the meta hash live
on the crawl's slot. Pure planning (which keys, which counts) is in
:mod:`.upgrade_plan`; this module owns the procedure and its thin Redis I/O.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from redis.exceptions import NoScriptError, ResponseError

from streams_sched.admin.upgrade_plan import (
    DELAYED_AT,
    DLQ_AT,
    STATS_AT,
    Counts,
    NodesOnline,
    SiteRead,
    UpgradeError,
    UpgradeResult,
    bucket_window,
    key_pairs,
    online_nodes,
    parse_site_read,
)
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.keys import DEFAULT_SHARDS, GROUP, MAX_SHARDS, STREAMS, CrawlKeys, SiteKeys
from streams_sched.frontier.replies import text
from streams_sched.frontier.scripts import read_lua

__all__ = ["UPGRADE_FIELD", "Progress", "Upgrade"]

#: meta field holding the number of shards an unfinished upgrade moves sites to
UPGRADE_FIELD = "upgrade_shards"

#: upgrade_read.lua: what one site's old keys hold, and the DUMP of those that exist (its
#: old keys share a slot): per stream XLEN and pending entries (0 without the group),
#: delayed and dead-letter counts, the enqueued counter, then {position, DUMP, PTTL} of
#: each of KEYS that exists. KEYS: the old keys (streams first); ARGV: group, streams,
#: position of delayed, dlq, stats
_READ_SITE = read_lua("upgrade_read.lua")

# Raise a shard's enqueued counter to at least ARGV[1] (never lower it: a worker may have
# counted more since). One key: fine on a cluster.
_RAISE_ENQUEUED = read_lua("raise_enqueued.lua")


Progress = Callable[[UpgradeResult, int, int], None]


class Upgrade:
    """Moves one crawl from the per-site layout to the sharded one (see the module docstring)."""

    def __init__(self, client: Any, crawl: str, shards: int = DEFAULT_SHARDS, batch: int = 100) -> None:
        if not 1 <= shards <= MAX_SHARDS:
            raise UpgradeError(f"a crawl has 1 to {MAX_SHARDS} shards, not {shards}")
        if batch < 1:
            raise UpgradeError(f"batch must be at least 1, not {batch}")
        self.client = client
        self.crawl = crawl
        self.keys = CrawlKeys(crawl)
        self.wanted_shards = shards
        self.batch = batch
        self._read_sha = ""

    def check_nodes(self) -> list[str]:
        """The crawl's online nodes (by Redis time)."""
        frontier = Frontier(self.client, self.crawl, shards=1)
        sec, usec = self.client.time()
        return online_nodes(frontier.nodes(), int(sec) + int(usec) / 1e6)

    def run(self, force: bool = False, progress: Progress | None = None) -> UpgradeResult:
        started = time.monotonic()
        client, k = self.client, self.keys
        meta = {text(f): text(v) for f, v in client.hgetall(k.meta).items()}
        has_registry = bool(client.exists(k.sites))
        if not has_registry:
            if "shards" in meta:
                return UpgradeResult(self.crawl, int(meta["shards"]), already=True)
            if not meta and not client.sismember(CrawlKeys.registry(), self.crawl):
                raise UpgradeError(f"no crawl named {self.crawl!r} here (see: streams-sched crawls)")
        if not force:
            online = self.check_nodes()
            if online:
                raise NodesOnline(self.crawl, online)
        shards = self._fix_shards(meta)
        result = UpgradeResult(self.crawl, shards)
        frontier = Frontier(client, self.crawl, shards=shards)
        frontier.load_scripts()
        self._read_sha = client.script_load(_READ_SITE)
        enqueued: dict[int, int] = {}
        total = int(client.scard(k.sites)) if has_registry else 0
        chunk: list[str] = []
        for raw in client.sscan_iter(k.sites, count=1000) if has_registry else ():
            chunk.append(text(raw))
            if len(chunk) >= self.batch:
                self._chunk(frontier, meta, chunk, result, enqueued)
                chunk = []
                if progress is not None:
                    progress(result, result.sites, total)
        if chunk:
            self._chunk(frontier, meta, chunk, result, enqueued)
        if progress is not None:
            progress(result, result.sites, total)
        if result.failed:
            result.duration_s = time.monotonic() - started
            return result  # the old registry stays: the crawl is still refused, run again
        for shard, n in sorted(enqueued.items()):
            if n > 0:
                client.eval(_RAISE_ENQUEUED, 1, frontier.shard(shard).stats, n)
        # the end: workers may run on the crawl from the moment meta names its shards
        client.hsetnx(k.meta, "shards", shards)
        client.delete(k.sites)
        client.hdel(k.meta, UPGRADE_FIELD)
        frontier.register()
        result.finished = True
        result.duration_s = time.monotonic() - started
        return result

    def _fix_shards(self, meta: Mapping[str, str]) -> int:
        """The number of shards this crawl moves to: the one recorded (a finished or an
        unfinished upgrade), else ``shards`` given, recorded now."""
        for name in ("shards", UPGRADE_FIELD):
            if meta.get(name):
                return int(meta[name])
        self.client.hsetnx(self.keys.meta, UPGRADE_FIELD, self.wanted_shards)
        return int(self.client.hget(self.keys.meta, UPGRADE_FIELD))

    def _chunk(self, f: Frontier, meta: Mapping[str, str], names: Sequence[str], result: UpgradeResult,
               enqueued: dict[int, int]) -> None:
        sites = self._read(f, meta, names)
        result.sites += len(sites)
        movers = [s for s in sites if s.has_old]
        for s in sites:
            if not s.has_old:
                result.skipped += 1
                shard = f.site(s.name).shard or 0
                enqueued[shard] = enqueued.get(shard, 0) + s.enqueued
        ok = self._write(f, sites, movers, result)
        if not ok:
            return
        pipe = self.client.pipeline(transaction=False)
        for s in ok:
            # a raw DEL: a cluster pipeline refuses delete() of several keys, even of one slot
            pipe.execute_command("DEL", *(old for old, _ in s.pairs), SiteKeys(self.crawl, s.name).sync)
        for s, reply in zip(ok, pipe.execute(raise_on_error=False), strict=True):
            if isinstance(reply, Exception):
                result.failed[s.name] = f"old keys not deleted: {reply}"
        for s, st in zip(ok, f.status_many([s.name for s in ok]), strict=True):
            after = Counts(st.backlog, st.pending, st.delayed, st.dead_letters)
            result.moved += 1
            result.keys_moved += sum(1 for d in s.dumps if d is not None)
            result.before.add(s.before)
            result.after.add(after)
            if after.as_tuple() != s.before.as_tuple():
                result.mismatched.append(s.name)
            shard = f.site(s.name).shard or 0
            enqueued[shard] = enqueued.get(shard, 0) + s.enqueued

    def _read(self, f: Frontier, meta: Mapping[str, str], names: Sequence[str]) -> list[SiteRead]:
        """One round trip: for each site one read-only script call (what its old keys hold,
        and the DUMP and PTTL of those that exist), and its new enqueued counter."""
        buckets = bucket_window(meta, f.clock.now())  # Redis time; the window spares writers whose clocks were off
        plans = [(name, key_pairs(SiteKeys(self.crawl, name), f.site(name), buckets)) for name in names]

        def send() -> list[Any]:
            pipe = self.client.pipeline(transaction=False)
            for name, pairs in plans:
                keys = [old for old, _ in pairs]
                # EVALSHA, not EVALSHA_RO: a cluster pipeline routes it by its first key
                pipe.execute_command("EVALSHA", self._read_sha, len(keys), *keys,
                                     GROUP, len(STREAMS), DELAYED_AT, DLQ_AT, STATS_AT)
                pipe.hget(f.site(name).stats, "enqueued")
            return list(pipe.execute(raise_on_error=False))

        replies = send()
        if any(isinstance(r, NoScriptError) for r in replies):  # a server restarted, a failover
            self._read_sha = self.client.script_load(_READ_SITE)
            replies = send()
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [
            parse_site_read(name, pairs, read, new_enq)
            for (name, pairs), read, new_enq in zip(plans, replies[::2], replies[1::2], strict=True)
        ]

    def _write(self, f: Frontier, sites: Sequence[SiteRead], movers: Sequence[SiteRead], result: UpgradeResult) -> list[SiteRead]:
        """One round trip: every RESTORE, the deletion of new keys without an old one, the reindex of each moved site and the registration
        of the skipped ones. -> the sites whose every write succeeded."""
        pipe = self.client.pipeline(transaction=False)
        for s in movers:
            for (_, new), dumped in zip(s.pairs, s.dumps, strict=True):
                if dumped is not None:
                    payload, ttl = dumped
                    pipe.restore(new, max(ttl, 0), payload, replace=True)
            if s.stale:
                pipe.execute_command("DEL", *s.stale)
            f.reindex(s.name, 0, pipe=pipe)
        skipped = [s.name for s in sites if not s.has_old]
        if skipped:
            f.register_sites(skipped, pipe)
        replies = iter(pipe.execute(raise_on_error=False))
        ok = []
        for s in movers:
            errors = [r for r in (next(replies) for d in s.dumps if d is not None) if isinstance(r, Exception)]
            if s.stale:
                dropped = next(replies)
                if isinstance(dropped, Exception):
                    errors.append(dropped)
                else:
                    result.keys_dropped += int(dropped)
            indexed = next(replies)
            if isinstance(indexed, NoScriptError):
                f.load_scripts()
                try:
                    f.reindex(s.name, 0)
                except ResponseError as exc:
                    errors.append(exc)
            elif isinstance(indexed, Exception):
                errors.append(indexed)
            if errors:
                result.failed[s.name] = str(errors[0])
            else:
                ok.append(s)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return ok
