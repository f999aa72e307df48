"""Fuzz a worker's intake: arbitrary stream entries through the real lease script, the I/O
thread and the codec. Each entry becomes a request or a dead letter with a reason; the
worker's I/O thread never dies and nothing stays leased."""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import time
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest
import scrapy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.utils.request import RequestFingerprinter

from streams_sched.config import StreamsConfig
from streams_sched.errors import EntryError
from streams_sched.wire.codec import RequestCodec
from streams_sched.worker.scheduler import Limits, StreamsScheduler

from helpers import same


class FuzzSpider(Spider):
    name = "fuzz"

    def parse(self, response: Any) -> None:  # pragma: no cover - never called
        pass

    def parse_item(self, response: Any) -> None:  # pragma: no cover
        pass


_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20)
    | st.builds(msgpack.ExtType, st.integers(0, 20), st.binary(max_size=12)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)
_urls = st.sampled_from(["http://a.test/x", "https://a.test/", "no scheme", "", "ftp://a.test/f", "http://[::1/"]) | st.text(max_size=30)
_payload_maps = st.fixed_dictionaries(
    {"u": _urls},
    optional={
        "c": st.sampled_from(["parse", "parse_item", "missing", "__init__", "os.system", "!"]) | _values,
        "e": st.sampled_from(["parse", "nope"]) | _values,
        "m": st.sampled_from(["GET", "POST", "BREW"]) | _values,
        "h": _values, "b": st.binary(max_size=20) | _values, "mt": _values, "a": _values,
        "p": st.integers(-5, 5) | _values, "df": st.booleans() | _values,
        "t": st.sampled_from(["FormRequest", "JsonRequest", "os.system"]) | _values,
        "v": st.sampled_from([1, 2]) | _values, "zz": _values, "x": _values,
    },
)
_payloads = st.binary(max_size=60) | _payload_maps.map(lambda d: msgpack.packb(d, use_bin_type=True))
_entries = st.dictionaries(
    st.sampled_from(["r", "d", "x"]) | st.text(min_size=1, max_size=4),
    _payloads | st.integers(0, 3).map(lambda n: str(n).encode()),
    min_size=1, max_size=3,
)


@pytest.fixture
def scheduler(plain_redis_url: str, crawl: str) -> Iterator[StreamsScheduler]:
    config = StreamsConfig(
        # a 0.01 s idle poll: each example's new site is looked at within ms, not after a back-off
        redis_url=plain_redis_url, crawl=crawl, idle_poll_seconds=0.01, flush_interval_seconds=0.005,
        lease_seconds=30, max_deliveries=100,
    )
    sched = StreamsScheduler(config, fingerprinter=RequestFingerprinter(), limits=Limits(8, 8))
    sched.open(FuzzSpider())
    yield sched
    sched.close("finished")


_sites = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(entries=st.lists(_entries, min_size=1, max_size=6))
def test_any_entry_becomes_a_request_or_a_dead_letter(scheduler: StreamsScheduler, entries: list[dict[str, bytes]]) -> None:
    """Whatever is in a stream entry, the worker leases it and either hands the engine a
    Request or dead-letters it with a reason; nothing stays leased and the I/O thread lives."""
    f = scheduler.frontier
    assert f is not None and scheduler._io is not None
    site = f"fuzz{next(_sites)}.test"
    stream = f.site(site).stream("http", "default")
    f.client.xgroup_create(stream, "workers", id="0", mkstream=True)
    for fields in entries:
        f.client.xadd(stream, fields)
    # the entries come from a foreign writer, which bypasses the scripts that index a site
    # with work: put the site in its shard's ready index, or no worker would ever look at it
    f.reindex(site)
    got: list[Request] = []
    deadline = time.monotonic() + 30
    while True:
        request = scheduler.next_request()
        if request is not None:
            assert isinstance(request, Request)
            got.append(request)
            scheduler.request_done(request)
            continue
        st_ = f.status(site)
        if len(got) + st_.dead_letters == len(entries) and st_.pending == 0 and st_.backlog == 0:
            break
        assert scheduler._x is not None and scheduler._x.fatal is None
        assert time.monotonic() < deadline, (entries, len(got), st_)
        time.sleep(0.01)
    for letter in f.dead_letters(site):
        assert letter["reason"], letter


# -- the codec's values alone (no Redis): every kind comes back equal and of the same type --


class FuzzItem(scrapy.Item):
    name = scrapy.Field()
    value = scrapy.Field()


@dataclasses.dataclass
class FuzzRecord:
    key: Any
    when: dt.datetime | None = None


_fixed_zones = st.builds(
    dt.timezone,
    st.timedeltas(min_value=dt.timedelta(hours=-23, minutes=-59), max_value=dt.timedelta(hours=23, minutes=59)),
) | st.just(dt.UTC)
_zones = st.none() | _fixed_zones | st.timezones()
_hashable = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8) | st.dates() | st.decimals(allow_nan=False, allow_infinity=False) | st.uuids()
    | st.datetimes(timezones=_zones) | st.timedeltas(),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
_rich = st.recursive(
    _hashable | st.times(timezones=st.none() | _fixed_zones),
    lambda inner: (
        st.lists(inner, max_size=3) | st.lists(inner, max_size=3).map(tuple)
        | st.sets(_hashable, max_size=3) | st.frozensets(_hashable, max_size=3)
        | st.dictionaries(_hashable, inner, max_size=3)
        | st.builds(FuzzItem, name=st.text(max_size=5), value=inner)
        | st.builds(FuzzRecord, key=inner, when=st.none() | st.datetimes(timezones=_zones))
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(meta=st.dictionaries(st.text(min_size=1, max_size=8), _rich, max_size=4),
       cb_kwargs=st.dictionaries(st.text(min_size=1, max_size=8).filter(str.isidentifier), _rich, max_size=3))
def test_rich_values_round_trip_with_their_types(meta: dict[str, Any], cb_kwargs: dict[str, Any]) -> None:
    """Any mix of datetimes (naive, fixed offset, zoneinfo), dates, times, timedeltas, Decimals,
    UUIDs, tuples, sets, frozensets, non-str keys, Items and dataclasses, nested, comes back
    equal and of the same type at every level."""
    codec = RequestCodec(FuzzSpider())
    back = codec.decode(codec.encode(Request("http://a.test/", meta=meta, cb_kwargs=cb_kwargs)))
    same(back.meta, meta)
    same(back.cb_kwargs, cb_kwargs)


_ext_garbage = st.builds(msgpack.ExtType, st.integers(0, 127), st.binary(max_size=24)) | st.builds(
    msgpack.ExtType, st.sampled_from([1, 2, 3, 5, 6, 7, 8, 9, 10, 16, 17]),
    _values.map(lambda v: msgpack.packb(v, use_bin_type=True)),
)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=4), _ext_garbage | st.lists(_ext_garbage, max_size=3), max_size=3))
def test_extension_garbage_is_refused_with_a_reason(meta: dict[str, Any]) -> None:
    """Any extension code with any data in meta decodes into values or raises EntryError, nothing else."""
    codec = RequestCodec(FuzzSpider())
    payload = msgpack.packb({"u": "http://a.test/", "v": 2, "mt": meta}, use_bin_type=True)
    try:
        codec.decode(payload)
    except EntryError:
        pass
