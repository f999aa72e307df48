"""Building a crawl with every kind of request in it, dumping it and comparing dumps (tests of dump/load)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
import uuid
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

from click.testing import CliRunner, Result
from scrapy import Request
from scrapy.http import FormRequest, JsonRequest
from scrapy.utils.request import RequestFingerprinter

from streams_sched.cli import main
from streams_sched.connect.clients import connect
from streams_sched.frontier.bloom import crawl_bloom
from streams_sched.frontier.client import Frontier
from streams_sched.frontier.entries import entry_for
from streams_sched.frontier.keys import STREAMS
from streams_sched.frontier.seeding import Seeder
from streams_sched.politeness.policy import set_policy
from streams_sched.transfer.dump import Dumper
from streams_sched.transfer.records import End, Header, RequestLine, SiteLine, SiteState, parse_record
from streams_sched.wire.codec import RequestCodec

#: values of every extension type of wire/values.py, and maps JSON cannot write
META_VALUES: dict[str, Any] = {
    "when": dt.datetime(2026, 3, 29, 1, 30, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=-3), "X")),
    "day": dt.date(1999, 12, 31),
    "at": dt.time(23, 59, 59, 999999),
    "span": dt.timedelta(days=-3, seconds=5),
    "price": Decimal("-1234.5600"),
    "id": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "pair": (1, "a", (2, (3,)), b"x\x00\xff"),
    "tags": {1, "b", (2, 3)},
    "frozen": frozenset({frozenset({1}), 2}),
    "raw": b"\x00\xff",
    "keys": {1: "int", b"k": "bytes", None: 0, 2.5: [dt.date(2020, 1, 1)], "$not_a_tag": 1},
    "floats": [float("nan"), float("inf"), -0.0, 1e300],
    "depth": 3,
}


def fresh(url: str) -> str:
    client = connect(url)
    client.flushall()
    client.script_flush()
    client.close()
    return url


def connect_frontier(url: str, crawl: str) -> Frontier:
    """A Frontier of ``crawl`` on ``url`` that writes nothing yet (no meta, no layout)."""
    return Frontier(connect(url), crawl)


def frontier_of(url: str, crawl: str) -> Frontier:
    client = connect(url)
    f = Frontier(client, crawl, crawl_bloom(client, crawl))
    f.ensure_layout()
    f.load_scripts()
    f.use_crawl_defaults(f.crawl_meta())
    return f


def _entry(f: Frontier, request: Request, callback: str | None = None) -> Any:
    return entry_for(request, RequestCodec(None), RequestFingerprinter(), callback=callback, now=f.clock.now)


def build_crawl(url: str, crawl: str) -> dict[str, Any]:
    """A crawl with queued (inbox and stream sites, every band, a browser task), leased,
    requeued (earlier deliveries), delayed, tracked and dead requests, POSTs with bodies,
    dont_filter repeats, meta of every extension type, policies; returns what it made."""
    with Seeder(url, crawl) as seeder:
        seeder.seed([f"http://small{i}.test/p{j}" for i in range(4) for j in range(3)])
        seeder.seed([f"http://big.test/page/{j}" for j in range(40)])
    f = frontier_of(url, crawl)
    set_policy(f, "big.test", {"rate": 5, "max_pages": 1000, "weight": 2})
    set_policy(f, "rich.test", {"task_type": "http", "revisit": "1h"})
    set_policy(f, "*", {"rate": 10})
    requests = [
        Request("http://rich.test/meta", meta={**META_VALUES}, cb_kwargs={"k": (1, 2)}, priority=5),
        Request("http://rich.test/low", priority=-5, headers={"X-A": ["1", "2"], "Cookie": "c=1"}),
        FormRequest("http://rich.test/form", formdata={"q": "é ü"}, dont_filter=True),
        FormRequest("http://rich.test/form", formdata={"q": "é ü"}, dont_filter=True),  # a repeat: both stay
        JsonRequest("http://rich.test/json", data={"a": [1, 2]}),
        Request("http://rich.test/binary", method="PUT", body=b"\x00\x01\xfe\xff"),
        Request("http://rich.test/render", meta={"task_type": "browser"}),
        Request("http://rich.test/later", meta={"not_before": f.clock.now() + 600, "retry_times": 1}),
        Request("http://rich.test/tracked", meta={"_rv": [3_600_000, 123, 0, 1], "not_before": f.clock.now() + 900}),
        Request("http://rich.test/nocb", callback=None, errback=None),
    ]
    for r in requests:
        e = _entry(f, r, callback="parse_item" if "json" in r.url else None)
        f.enqueue(e.site, [e])
    # leases: two held by w1, one failed once (requeued with a delivery counted), two dead letters
    held = f.lease("big.test", "w1", 5, [1, 1, 1])
    ids = [(e.stream, e.id) for e in held.entries]
    f.fail("big.test", "w1", 5, [(ids[0][0], ids[0][1], "render timeout")])
    f.dead_letter("big.test", "w1", [(s, i, "payload cannot be decoded") for s, i in ids[1:3]])
    return {"leased": 2}


def dump_lines(url: str, crawl: str, seen: bool = False, **options: Any) -> list[str]:
    f = frontier_of(url, crawl)
    out: list[str] = []
    Dumper(f, out.append, seen=seen, **options).run()
    return out


def records(lines: list[str]) -> list[Any]:
    return [parse_record(json.loads(line)) for line in lines]


def comparable(lines: list[str], due_bucket_ms: int = 0) -> Counter[str]:
    """The request lines, site lines and site states of a dump as a multiset, without what a
    load changes: the crawl's name, the lease of a request leased at the dump (it is queued
    after a load), and due times within ``due_bucket_ms`` (0: left out)."""
    out: Counter[str] = Counter()
    for r in records(lines):
        if isinstance(r, RequestLine):
            due = round(r.due_in_ms / due_bucket_ms) if due_bucket_ms else None
            out[json.dumps([r.site, r.url, r.state, STREAMS[r.stream], r.payload.hex(), due, r.deliveries,
                            r.dead and [r.dead.reason, r.dead.deliveries, r.dead.node, r.dead.ts_ms, r.dead.origin_id,
                                        r.dead.origin]])] += 1
        elif isinstance(r, SiteLine):
            out[json.dumps(["site", r.site, sorted(r.policy.items())])] += 1
        elif isinstance(r, SiteState):
            seen = sorted((k.suffix, k.kind, k.value if k.kind != "string" else k.value.hex()) for k in r.seen)
            out[json.dumps(["state", r.site, sorted(r.stats.items()), seen], default=str)] += 1
        else:
            assert isinstance(r, (Header, End))
    return out


def dues(lines: list[str]) -> dict[tuple[str, str, str], int]:
    return {(r.site, r.url, r.state): r.due_in_ms for r in records(lines)
            if isinstance(r, RequestLine) and r.state in ("delayed", "tracked")}


def cli(*args: str, url: str, input: str | None = None) -> Result:
    return CliRunner().invoke(main, list(args), env={"REDIS_URL": url}, input=input, catch_exceptions=False)


def write_dump(path: Path, lines: list[str]) -> Path:
    data = "".join(line + "\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path
