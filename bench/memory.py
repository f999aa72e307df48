"""(d) Redis memory per seen fingerprint.

Three ways to remember N fingerprints, each in a fresh redis-server:

- ``bf`` and ``bitmap``: a site's seen filter as ``enqueue.lua`` keeps it
  (``seen_in`` from ``lua/lib/bloom.lua``, driven by a purpose script): an exact set
  of 8-byte prefixes up to EXACT_MAX, then a Bloom filter (RedisBloom
  ``BF.RESERVE key 0.001 N EXPANSION 2`` or the Lua bitmap Bloom filter) at
  error 0.001 and capacity N holding the prefixes;
- ``set``: a SET of 40-hex fingerprints, as scrapy-redis' RFPDupeFilter keeps them.

Bytes are the growth of ``used_memory`` (INFO memory) and ``MEMORY USAGE``
of the keys. The false-positive rate is measured with fingerprints that were
never added (``seen_in`` with ``add`` false).
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import redis

from streams_sched.frontier.scripts import read_lua
from streams_sched.testing import RedisServer

__all__ = ["run_memory"]

ERROR_RATE = 0.001
EXPANSION = 2
BATCH = 2000

_LIB = read_lua("lib/bloom.lua")

# KEYS: seen, meta; ARGV: mode, err, cap, expansion, add (1 insert / 0 look only), fp...
# The same path as enqueue.lua: an exact set first, a Bloom filter of capacity cap
# after EXACT_MAX. Returns how many fingerprints were new (add) or are absent (look only).
_DEDUPE = _LIB + """
local fps = {}
for i = 6, #ARGV do fps[#fps + 1] = ARGV[i] end
local r = seen_in(ARGV[1], KEYS[1], KEYS[2], fps, tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5] == '1')
if r.err then return r end
local n = 0
for _, v in ipairs(r) do n = n + v end
return n
"""


def _fp(salt: bytes, i: int) -> bytes:
    return hashlib.sha1(salt + i.to_bytes(8, "big")).digest()


def _batches(n: int, salt: bytes, size: int = BATCH) -> Any:
    for start in range(0, n, size):
        yield [_fp(salt, i) for i in range(start, min(n, start + size))]


def _used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def _fill(client: redis.Redis, n: int, add: Any) -> float:
    t = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    queued = 0
    for batch in _batches(n, b"in"):
        add(pipe, batch)
        queued += 1
        if queued == 10:
            pipe.execute()
            queued = 0
    if queued:
        pipe.execute()
    return time.perf_counter() - t


def measure(kind: str, n: int, probes: int) -> dict[str, Any]:
    with RedisServer(bloom=(kind == "bf")) as srv:
        client = redis.Redis.from_url(srv.url)
        base = _used(client)
        fp_hits = 0
        if kind in ("bf", "bitmap"):
            script = client.register_script(_DEDUPE)
            script(keys=["seen", "meta"], args=[kind, ERROR_RATE, n, EXPANSION, 1, _fp(b"warm", 0)])
            client.delete("seen", "meta")
            base = _used(client)
            secs = _fill(client, n, lambda p, b: script(keys=["seen", "meta"], args=[kind, ERROR_RATE, n, EXPANSION, 1, *b], client=p))
            for batch in _batches(probes, b"out"):
                fp_hits += len(batch) - int(script(keys=["seen", "meta"], args=[kind, ERROR_RATE, n, EXPANSION, 0, *batch]))
            keys = ["seen", "meta"]
            if kind == "bf":
                reply: Any = client.execute_command("BF.INFO", "seen", "FILTERS") if client.type("seen") != b"string" else 0  # type: ignore[no-untyped-call]
                layers = int(next(iter(reply.values())) if isinstance(reply, dict) else reply[0] if isinstance(reply, list) else reply)
            else:
                layers = int(client.hget("meta", "layers") or 0)
        elif kind == "set":
            secs = _fill(client, n, lambda p, b: p.sadd("dupefilter", *[fp.hex() for fp in b]))
            for batch in _batches(probes, b"out"):
                fp_hits += sum(client.smismember("dupefilter", [fp.hex() for fp in batch]))
            keys = ["dupefilter"]
            layers = 1
        else:
            raise ValueError(kind)
        used = _used(client) - base
        usage = sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)
        client.close()
    return {
        "kind": kind,
        "n": n,
        "used_memory_bytes": used,
        "memory_usage_bytes": usage,
        "bytes_per_fp": usage / n,
        "used_bytes_per_fp": used / n,
        "false_positive_rate": fp_hits / probes if probes else 0.0,
        "probes": probes,
        "layers": layers,
        "fill_s": secs,
    }


def run_memory(sizes: list[int], probes: int = 100_000) -> list[dict[str, Any]]:
    out = []
    for n in sizes:
        for kind in ("bf", "bitmap", "set"):
            out.append(measure(kind, n, min(probes, max(n, 1000))))
    return out
