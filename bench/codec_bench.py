"""(e) Codec cost per request: encode + decode, and payload size.

- ``msgpack``: streams-sched's ``RequestCodec``;
- ``pickle``: scrapy-redis' way, ``request.to_dict(spider=...)`` then
  ``pickle.dumps(protocol=-1)``; ``pickle.loads`` then ``request_from_dict``;
- ``json``: ``RequestCodec``'s own code with ``json`` in place of msgpack
  (bytes as latin-1 text), so the row isolates the serializer.

Three requests: a follow-up link as the synthetic spider yields it (url,
callback, depth in meta), a heavier one (a FormRequest with headers,
cookies, meta, cb_kwargs and an errback), and one carrying objects (an Item,
an aware datetime, a Decimal and a tuple in meta, a dataclass in cb_kwargs:
the extension types, which JSON cannot carry, so it has no json row).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import pickle
import statistics
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import scrapy
from scrapy import Request
from scrapy.http import FormRequest
from scrapy.utils.request import request_from_dict

from streams_sched.demo.spider import SyntheticSpider
from streams_sched.wire.codec import RequestCodec

__all__ = ["run_codec"]


def _requests(spider: SyntheticSpider) -> dict[str, Request]:
    link = Request("http://site3.test/p/1234", callback=spider.parse, meta={"depth": 7})
    heavy = FormRequest(
        "http://site3.test/search",
        formdata={"q": "lorem ipsum", "page": "3"},
        callback=spider.parse_other,
        errback=spider.errback_record,
        headers={"Referer": "http://site3.test/p/1", "Accept-Language": "en"},
        cookies={"session": "abc123", "consent": "yes"},
        meta={"depth": 3, "site": "site3.test", "trail": ["a", "b", "c"], "score": 0.5},
        cb_kwargs={"page": 3, "category": "books"},
        priority=5,
    )
    objects = Request(
        "http://site3.test/p/77",
        callback=spider.parse_other,
        meta={"depth": 2, "page": BenchItem(url="http://site3.test/p/7", title="seven"),
              "seen": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC), "price": Decimal("19.99"), "trail": (7, 77)},
        cb_kwargs={"offer": BenchOffer("sku-7", Decimal("19.99"))},
    )
    return {"link": link, "form": heavy, "objects": objects}


class BenchItem(scrapy.Item):
    url = scrapy.Field()
    title = scrapy.Field()


@dataclasses.dataclass
class BenchOffer:
    sku: str
    price: Decimal


def _json_codec(spider: SyntheticSpider) -> RequestCodec:
    """A RequestCodec whose encode/decode run unchanged but serialize with json."""

    def dumps(d: Any) -> bytes:
        return json.dumps(d, default=lambda b: b.decode("latin-1"), separators=(",", ":")).encode()

    c = RequestCodec(spider)
    c._packb = dumps  # type: ignore[method-assign]
    c._unpackb = lambda payload, **_: json.loads(payload)
    return c


def _codecs(spider: SyntheticSpider) -> dict[str, tuple[Callable[[Request], bytes], Callable[[bytes], Request]]]:
    mp = RequestCodec(spider)
    js = _json_codec(spider)

    def pk_enc(r: Request) -> bytes:
        return pickle.dumps(r.to_dict(spider=spider), protocol=-1)

    def pk_dec(b: bytes) -> Request:
        return request_from_dict(pickle.loads(b), spider=spider)

    return {"msgpack": (mp.encode, mp.decode), "pickle": (pk_enc, pk_dec), "json": (js.encode, js.decode)}


def _time_us(fn: Callable[[], Any], loops: int, repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t = time.perf_counter()
        for _ in range(loops):
            fn()
        runs.append((time.perf_counter() - t) / loops)
    return 1e6 * statistics.median(runs)


def run_codec(loops: int = 5000, repeats: int = 5) -> list[dict[str, Any]]:
    spider = SyntheticSpider()
    out = []
    for rname, request in _requests(spider).items():
        for cname, (enc, dec) in _codecs(spider).items():
            if cname == "json" and rname == "objects":
                continue
            payload = enc(request)
            back = dec(payload)
            assert back.url == request.url and back.callback == request.callback, (cname, rname)
            out.append({
                "request": rname,
                "codec": cname,
                "bytes": len(payload),
                "encode_us": _time_us(lambda enc=enc, request=request: enc(request), loops, repeats),
                "decode_us": _time_us(lambda dec=dec, payload=payload: dec(payload), loops, repeats),
            })
    for row in out:
        row["total_us"] = row["encode_us"] + row["decode_us"]
    return out
