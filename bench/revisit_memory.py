"""Redis bytes per tracked page waiting for its next visit, against a delayed request.

Two crawls of the same pages (SITES sites x PAGES pages each, realistic product URLs,
Scrapy's own fingerprints), each in a freshly flushed redis-server, through the real
scripts:

- ``delayed``: every page enqueued with a delay (``meta["not_before"]``, or a
  Retry-After): what a waiting request costs today;
- ``tracked``: every page enqueued, leased and acked as a tracked page
  (``meta["revisit"]``), so it waits in its site's delayed ZSET with its state
  (interval and last signature) in its meta;
- ``estimate``: as ``tracked``, an adaptive page under the freshness rule, its state
  also holding its change-rate estimate (visits, changes, time spanned, the last visit's
  Redis time in ms);
- ``validators``: as ``estimate``, with the ETag (a typical 22-character
  ``"<hex>-<hex>"``, as nginx and Apache send) and Last-Modified (4 bytes) of its last answer;
- ``dated``: as ``estimate``, with only the Last-Modified of its last answer (a server
  that dates its pages but sends no ETag; the freshness rule estimates such a page from
  its first answer).

Bytes are the growth of ``used_memory`` over the empty crawl, divided by the pages;
both include each page's fingerprint in its site's seen filter and the sites' stats.
Then where the difference is: the mean length of a delayed ZSET member of each kind
(``<stream>:<seq>:<payload>``), and the msgpack bytes of each meta field that only one
kind carries.

    python bench/revisit_memory.py                 # 100,000 pages on 100 sites
    python bench/revisit_memory.py --pages 1000 --sites 1000
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import msgpack

from scrapy import Request
from scrapy.utils.request import RequestFingerprinter

from streams_sched.connect.clients import connect
from streams_sched.frontier.client import Frontier
from streams_sched.worker.revisits import pack_state, signature_of
from streams_sched.frontier.entries import entry_for
from streams_sched.testing import RedisServer
from streams_sched.wire.codec import RequestCodec

WEIGHTS = (8, 3, 1)
HOUR_MS = 3_600_000
BATCH = 500


def used(client: Any) -> int:
    time.sleep(0.2)  # let lazy frees settle
    return int(client.info("memory")["used_memory"])


def requests(site: str, pages: int, meta: dict[str, Any]) -> list[Request]:
    return [Request(f"https://{site}/products/item-{i:06d}?ref=catalog&page={i // 48}", meta=dict(meta))
            for i in range(pages)]


def member_sizes(client: Any, f: Frontier, sites: int) -> dict[str, Any]:
    """Mean delayed-member length (a sample of sites), and one member's meta fields with
    their msgpack bytes."""
    lengths: list[int] = []
    for s in range(0, sites, max(1, sites // 20)):
        lengths += [len(m) for m in client.zrange(f.site(f"shop{s:05d}.test").delayed, 0, -1)]
    member = client.zrange(f.site("shop00000.test").delayed, 0, 0)[0]
    payload = member.split(b":", 2)[2]
    meta = msgpack.unpackb(payload, raw=False, strict_map_key=False).get("mt") or {}
    fields = {k: len(msgpack.packb(k)) + len(msgpack.packb(v)) for k, v in meta.items()}
    return {"member": statistics.fmean(lengths), "payload": len(payload), "meta": fields}


def run(url: str, kind: str, sites: int, pages: int) -> tuple[float, dict[str, Any]]:
    client = connect(url)
    client.flushall()
    f = Frontier(client, "bench")
    f.ensure_layout()
    codec, fingerprinter = RequestCodec(None), RequestFingerprinter()
    base = used(client)
    for s in range(sites):
        site = f"shop{s:05d}.test"
        if kind == "delayed":
            meta = {"depth": 2, "not_before": f.clock.now() + 3600}
        else:
            meta = {"depth": 2, "revisit": 3600}
        batch = [entry_for(r, codec, fingerprinter, now=f.clock.now) for r in requests(site, pages, meta)]
        for i in range(0, len(batch), BATCH):
            f.enqueue(site, batch[i : i + BATCH])
        if kind != "delayed":
            left = pages
            while left:
                leased = f.lease(site, "w1", min(left, BATCH), WEIGHTS).entries
                assert leased, "nothing leased"
                revisits = []
                for e in leased:
                    assert e.payload is not None
                    again = codec.decode(e.payload)
                    state: dict[str, Any] = {"i": 3600.0, "s": signature_of(b"<html>a product page</html>")}
                    if kind in ("estimate", "validators", "dated"):
                        state.update(n=12, x=3, o=12 * 3600.0 * 1.07, l=f.clock.now())
                    if kind == "validators":
                        state.update(e='"65f1a2b3-1c9e4d7a2b"', m=int(f.clock.now()) - 86400)
                    if kind == "dated":
                        state.update(m=int(f.clock.now()) - 86400)
                    again.meta["_rv"] = pack_state(state)
                    revisits.append((e.stream, e.id, HOUR_MS, "n", codec.encode(again)))
                f.ack(site, [], revisits=revisits)
                left -= len(leased)
        waiting = client.zcard(f.site(site).delayed)
        assert waiting == pages, (site, waiting)
    per_page = (used(client) - base) / (sites * pages)
    return per_page, member_sizes(client, f, sites)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sites", type=int, default=100)
    ap.add_argument("--pages", type=int, default=1000, help="pages per site")
    ap.add_argument("--kinds", default="delayed,tracked,estimate,validators",
                    help="which kinds to measure (delayed must be first and is always measured)")
    ap.add_argument("--redis-url", help="a Redis to use (it gets FLUSHALL!); default: a throwaway redis-server")
    args = ap.parse_args()
    n = args.sites * args.pages

    def both(url: str) -> None:
        kinds = ["delayed", *(k for k in args.kinds.split(",") if k != "delayed")]
        runs = {kind: run(url, kind, args.sites, args.pages) for kind in kinds}
        got = {kind: r[0] for kind, r in runs.items()}
        sizes = {kind: r[1] for kind, r in runs.items()}
        print(f"{n:,} pages on {args.sites:,} sites: Redis bytes per page waiting")
        print(f"  delayed request  {got['delayed']:7.0f} B")
        for kind in kinds[1:]:
            print(f"  {kind + ' page':16s} {got[kind]:7.0f} B  ({got[kind] / got['delayed']:.2f}x),"
                  f" ZSET member {sizes[kind]['member']:.0f} B")
        if "tracked" not in runs:
            return
        d, t = sizes["delayed"], sizes["tracked"]
        print(f"where: the ZSET member is {t['member'] - d['member']:+.0f} B"
              f" ({d['member']:.0f} B delayed, {t['member']:.0f} B tracked; payloads {d['payload']} and {t['payload']} B)")
        for kind, other in (("delayed", "tracked"), ("tracked", "delayed")):
            own = {k: v for k, v in sizes[kind]["meta"].items() if k not in sizes[other]["meta"]}
            print(f"  meta only a {kind} one carries: "
                  + (", ".join(f"{k} {v} B" for k, v in own.items()) or "none"))

    if args.redis_url:
        both(args.redis_url)
    else:
        with RedisServer() as server:
            both(server.url)


if __name__ == "__main__":
    main()
