"""Requests survive the msgpack codec; bad input fails with a clear reason; nothing is imported."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import sys
import uuid
import zoneinfo
from collections import OrderedDict, namedtuple
from decimal import Decimal
from typing import Any

import attrs
import msgpack
import pytest
import scrapy
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.linkextractors import LinkExtractor
from scrapy.spiders import CrawlSpider, Rule, SitemapSpider
from scrapy_playwright.page import PageMethod

from streams_sched.errors import ConfigError, EntryError, SerializationError
from streams_sched.wire import meta_codecs
from streams_sched.wire.callbacks import spider_method
from streams_sched.wire.codec import RequestCodec
from streams_sched.wire.meta_codecs import MetaCodec, register_meta_codec

from helpers import same


def _import_splash_request() -> type[Request]:
    import scrapy.utils.url
    import w3lib.url

    # scrapy-splash 0.11.1 (the latest) imports canonicalize_url from scrapy.utils.url,
    # which Scrapy 2.19 no longer re-exports from w3lib; give it the same function
    if not hasattr(scrapy.utils.url, "canonicalize_url"):
        scrapy.utils.url.canonicalize_url = w3lib.url.canonicalize_url  # type: ignore[attr-defined]
    from scrapy_splash import SplashRequest

    return SplashRequest


SplashRequest = _import_splash_request()


class MySpider(Spider):
    name = "codec"

    def parse_item(self, response):  # pragma: no cover - never called
        pass

    def on_error(self, failure):  # pragma: no cover
        pass

    def __private(self, response):  # pragma: no cover
        pass


def other_function(response):  # pragma: no cover
    pass


@pytest.fixture
def spider() -> MySpider:
    return MySpider()


@pytest.fixture
def codec(spider: MySpider) -> RequestCodec:
    return RequestCodec(spider)


def test_round_trip_keeps_every_attribute(codec: RequestCodec, spider: MySpider) -> None:
    """Every Request attribute comes back equal, callbacks bound to the same spider."""
    req = Request(
        "http://example.com/a?b=1",
        callback=spider.parse_item,
        errback=spider.on_error,
        method="POST",
        headers={"X-A": ["1", "2"], "Referer": "http://example.com/"},
        body=b"\x00binary\xff",
        cookies={"session": "s1"},
        meta={"depth": 3, "nested": {"k": [1, 2.5, None, True, b"raw"]}},
        encoding="latin-1",
        priority=7,
        dont_filter=True,
        flags=["f1"],
        cb_kwargs={"page": 2},
    )
    back = codec.decode(codec.encode(req))
    assert type(back) is Request
    assert back.url == req.url and back.method == "POST" and back.body == req.body
    assert back.callback == spider.parse_item and back.errback == spider.on_error
    assert back.headers.getlist("X-A") == [b"1", b"2"]
    assert back.cookies == {"session": "s1"} and back.meta == req.meta
    assert (back.encoding, back.priority, back.dont_filter) == ("latin-1", 7, True)
    assert back.flags == ["f1"] and back.cb_kwargs == {"page": 2}


def test_default_and_no_callback(codec: RequestCodec) -> None:
    """callback=None stays None (spider.parse); NO_CALLBACK stays NO_CALLBACK."""
    assert codec.decode(codec.encode(Request("http://a.test/"))).callback is None
    assert codec.decode(codec.encode(Request("http://a.test/", callback=NO_CALLBACK))).callback is NO_CALLBACK


def test_allowed_request_classes_round_trip(codec: RequestCodec) -> None:
    """FormRequest and JsonRequest come back as their own class."""
    form = FormRequest("http://a.test/f", formdata={"q": "x"})
    js = JsonRequest("http://a.test/j", data={"a": 1})
    assert type(codec.decode(codec.encode(form))) is FormRequest
    back = codec.decode(codec.encode(js))
    assert type(back) is JsonRequest and back.body == js.body


def test_foreign_callback_is_refused(codec: RequestCodec) -> None:
    """A callback that is not a method of the spider cannot be enqueued."""
    with pytest.raises(SerializationError, match="callback.*not a method of the spider"):
        codec.encode(Request("http://a.test/", callback=other_function))


def test_unencodable_meta_names_the_key(codec: RequestCodec) -> None:
    """The error names the request and the meta key whose value cannot be encoded."""
    req = Request("http://a.test/x", meta={"ok": 1, "page_obj": object()})
    with pytest.raises(SerializationError) as info:
        codec.encode(req)
    assert info.value.field == "meta['page_obj']"
    assert "http://a.test/x" in str(info.value)


def test_oversize_request_is_refused(spider: MySpider) -> None:
    """A request over the size limit is refused with the limit's setting name."""
    codec = RequestCodec(spider, max_bytes=100)
    with pytest.raises(SerializationError, match="STREAMS_MAX_REQUEST_BYTES"):
        codec.encode(Request("http://a.test/", body=b"x" * 200))


def test_unknown_request_class_is_refused(codec: RequestCodec) -> None:
    """A Request subclass outside the allowlist is refused at enqueue, naming the setting."""

    class Custom(Request):
        pass

    with pytest.raises(SerializationError, match="STREAMS_REQUEST_CLASSES"):
        codec.encode(Custom("http://a.test/"))


def test_extra_request_class_must_be_a_request(spider: MySpider) -> None:
    """STREAMS_REQUEST_CLASSES entries are checked when the codec is built."""
    with pytest.raises(ConfigError, match="STREAMS_REQUEST_CLASSES"):
        RequestCodec(spider, extra_classes=["collections.OrderedDict"])


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"\xc1garbage", "not msgpack"),
        (msgpack.packb([1, 2]), "not a map"),
        (msgpack.packb({"c": "parse"}), "no url"),
        (msgpack.packb({"u": "http://a.test/", "zz": 1}), "unknown keys"),
        (msgpack.packb({"u": "http://a.test/", "c": "missing_method"}), "has no attribute 'missing_method'"),
        (msgpack.packb({"u": "http://a.test/", "c": "__init__"}), "no dunders"),
        (msgpack.packb({"u": "http://a.test/", "c": "os.system"}), "not a method name"),
        (msgpack.packb({"u": "http://a.test/", "t": "os.system"}), "not allowed"),
        (msgpack.packb({"u": "no scheme at all"}), "Scrapy rejects"),
        (msgpack.packb({"u": "http://a.test/", "p": "high"}), "priority"),
        (msgpack.packb({"u": "http://a.test/", "v": 9}), "schema version"),
    ],
)
def test_bad_payloads_give_a_reason(codec: RequestCodec, payload: bytes, reason: str) -> None:
    """Each kind of bad entry raises EntryError with a reason for the dead-letter stream."""
    with pytest.raises(EntryError, match=reason):
        codec.decode(payload)


def test_decode_never_imports(codec: RequestCodec, monkeypatch: pytest.MonkeyPatch) -> None:
    """Decoding resolves names by lookup only: no module named in an entry gets imported."""
    import importlib
    import sys

    def boom(*a, **k):  # pragma: no cover - failing is the point
        raise AssertionError("decode imported something")

    import streams_sched.wire.codec as codec_module

    monkeypatch.setattr(codec_module, "load_object", boom)
    monkeypatch.setattr(importlib, "import_module", boom)
    for name in ("antigravity", "this"):
        with pytest.raises(EntryError):
            codec.decode(msgpack.packb({"u": "http://a.test/", "t": name}))
        with pytest.raises(EntryError):
            codec.decode(msgpack.packb({"u": "http://a.test/", "c": f"{name}.main"}))
        assert name not in sys.modules


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_never_crash_the_decoder(payload: bytes) -> None:
    """Any bytes either decode into a Request or raise EntryError, nothing else."""
    codec = RequestCodec(MySpider())
    try:
        assert isinstance(codec.decode(payload), Request)
    except EntryError:
        pass


_plain = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10,
)


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=10), _plain, max_size=5))
def test_plain_meta_round_trips(meta: dict) -> None:
    """Any plain-data meta comes back unchanged."""
    codec = RequestCodec(MySpider())
    back = codec.decode(codec.encode(Request("http://a.test/", meta=meta)))
    assert back.meta == meta


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["u", "c", "e", "m", "h", "b", "k", "mt", "a", "p", "df", "en", "f", "t", "v"]), _plain, max_size=6))
def test_schema_shaped_garbage_never_crashes(d: dict) -> None:
    """Maps with the right keys but wrong values decode or raise EntryError, nothing else."""
    codec = RequestCodec(MySpider())
    try:
        codec.decode(msgpack.packb(d, use_bin_type=True))
    except EntryError:
        pass


# -- callbacks by one rule, values of every kind, upgrades ---------------------------



class SpiderMixin:
    def __mixin_callback(self, response):  # pragma: no cover
        pass

    def mixin_public(self, response):  # pragma: no cover
        pass


class SpiderDelegation:
    def delegated_callback(self, response):  # pragma: no cover
        pass


def module_parse(response):  # pragma: no cover
    pass


class MethodsSpider(Spider, SpiderMixin):
    """Scrapy's tests/test_request_dict.py cases: mixin, mangled, reference and delegated methods."""

    name = "methods"
    parse_item_reference = module_parse
    __private_reference = module_parse
    not_callable = 42

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.delegated_callback = SpiderDelegation().delegated_callback
        self.own_alias = self.parse_item

    def parse_item(self, response):  # pragma: no cover
        pass

    def _private(self, response):  # pragma: no cover
        pass

    def __parse_item_private(self, response):  # pragma: no cover
        pass

    @classmethod
    def a_classmethod(cls, response):  # pragma: no cover
        pass

    @staticmethod
    def a_staticmethod(response):  # pragma: no cover
        pass


class ZooCrawlSpider(CrawlSpider):
    name = "zoo-crawl"
    rules = (Rule(LinkExtractor(), callback="parse_page", errback="on_error", follow=True),)

    def parse_page(self, response):  # pragma: no cover
        pass

    def on_error(self, failure):  # pragma: no cover
        pass


class ZooSitemapSpider(SitemapSpider):
    name = "zoo-sitemap"
    sitemap_urls = ["http://a.test/sitemap.xml"]


def _spiders() -> list[Spider]:
    return [MethodsSpider(), ZooCrawlSpider(), ZooSitemapSpider(), MySpider()]


def _round_trip(codec: RequestCodec, request: Request) -> Request:
    return codec.decode(codec.encode(request))


@pytest.mark.parametrize(
    "attr",
    ["parse_item", "_private", "_MethodsSpider__parse_item_private", "_SpiderMixin__mixin_callback",
     "mixin_public", "parse_item_reference", "_MethodsSpider__private_reference", "own_alias"],
)
def test_scrapy_named_callbacks_round_trip(attr: str) -> None:
    """Private, name-mangled, mixin and reference methods come back as the same bound method."""
    spider = MethodsSpider()
    codec = RequestCodec(spider)
    method = getattr(spider, attr)
    back = _round_trip(codec, Request("http://a.test/", callback=method, errback=method))
    assert back.callback == method and back.errback == method
    assert back.callback.__self__ is spider


def test_crawl_and_sitemap_spider_private_callbacks_round_trip() -> None:
    """CrawlSpider's _callback/_errback and SitemapSpider's _parse_sitemap travel and come back."""
    crawl = ZooCrawlSpider()
    codec = RequestCodec(crawl)
    req = Request("http://a.test/", callback=crawl._callback, errback=crawl._errback, meta={"rule": 0})
    payload = codec.encode(req)
    assert msgpack.unpackb(payload)["c"] == "_callback" and msgpack.unpackb(payload)["v"] == 2
    back = codec.decode(payload)
    assert back.callback == crawl._callback and back.errback == crawl._errback
    sitemap = ZooSitemapSpider()
    codec = RequestCodec(sitemap)
    back = _round_trip(codec, Request("http://a.test/sitemap.xml", callback=sitemap._parse_sitemap))
    assert back.callback == sitemap._parse_sitemap


@pytest.mark.parametrize("spider", _spiders(), ids=lambda s: s.name)
def test_every_name_follows_one_rule_both_ways(spider: Spider) -> None:
    """For every attribute of the spider, encode accepts it exactly when it is a bound method of
    the spider reachable under a non-dunder name, and what encode writes decodes to the same method;
    every name decode accepts encodes again and comes back the same."""
    codec = RequestCodec(spider)
    accepted = 0
    for name in dir(spider):
        try:
            value = getattr(spider, name)
        except Exception:
            continue
        try:
            decoded = codec.decode(msgpack.packb({"u": "http://a.test/", "c": name}))
        except EntryError:
            decoded = None
        else:
            assert decoded.callback == value
            assert _round_trip(codec, decoded).callback == value
        if not callable(value) or value is NO_CALLBACK:
            assert decoded is None, name
            continue
        own = getattr(value, "__self__", None) is spider and hasattr(value, "__func__")
        try:
            back = _round_trip(codec, Request("http://a.test/", callback=value))
        except SerializationError:
            assert not own or name.startswith("__"), name
            assert decoded is None, name
            continue
        assert own, name
        assert back.callback == value, name
        accepted += 1
    assert accepted >= 5


def test_foreign_callables_are_refused_both_ways() -> None:
    """A delegated method, a classmethod, a staticmethod, a lambda or a dunder is refused on encode
    with the fix, and its name is refused on decode with the reason."""
    spider = MethodsSpider()
    codec = RequestCodec(spider)
    for func in (spider.delegated_callback, spider.a_classmethod, spider.a_staticmethod,
                 lambda r: r, spider.__init__, spider.__repr__):
        with pytest.raises(SerializationError, match="callback"):
            codec.encode(Request("http://a.test/", callback=func))
    reasons = {
        "delegated_callback": "method of SpiderDelegation, not of the spider",
        "a_classmethod": "not of the spider",
        "a_staticmethod": "function, not a bound method",
        "not_callable": "not callable",
        "__init__": "no dunders",
        "_MethodsSpider__nothing": "no attribute",
    }
    for name, reason in reasons.items():
        with pytest.raises(EntryError, match=reason):
            codec.decode(msgpack.packb({"u": "http://a.test/", "e": name}))
    with pytest.raises(ValueError):
        spider_method(spider, "parse_item.__globals__")


# -- values ---------------------------------------------------------------------


class Product(scrapy.Item):
    name = scrapy.Field()
    price = scrapy.Field()
    tags = scrapy.Field()


@dataclasses.dataclass
class Offer:
    sku: str
    price: Decimal
    seen: dt.datetime | None = None
    computed: int = dataclasses.field(init=False, default=0)


@dataclasses.dataclass(frozen=True)
class FrozenKey:
    a: int
    b: tuple[int, ...]


@attrs.define
class Listing:
    url: str
    _secret: str = "s"
    items: list[Any] = attrs.Factory(list)


class Color(enum.Enum):
    RED = "red"
    BLUE = 2


Point = namedtuple("Point", "x y")


class Money:
    def __init__(self, amount: Decimal, currency: str) -> None:
        self.amount, self.currency = amount, currency

    def __eq__(self, other: object) -> bool:
        return type(other) is Money and vars(other) == vars(self)


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self, a: int, b: Any) -> None:
        self.a, self.b = a, b

    def __eq__(self, other: object) -> bool:
        return type(other) is Slotted and (other.a, other.b) == (self.a, self.b)


class NotAllowed:
    pass


_NAIVE = dt.datetime(2026, 3, 29, 1, 30, 5, 123456)
VALUES: dict[str, Any] = {
    "datetime": _NAIVE,
    "datetime_fold": dt.datetime(2026, 10, 25, 2, 30, fold=1),
    "datetime_utc": _NAIVE.replace(tzinfo=dt.UTC),
    "datetime_offset": _NAIVE.replace(tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
    "datetime_named": _NAIVE.replace(tzinfo=dt.timezone(dt.timedelta(hours=1), "CET")),
    "datetime_zoneinfo": _NAIVE.replace(tzinfo=zoneinfo.ZoneInfo("Europe/Paris")),
    "date": dt.date(1999, 12, 31),
    "time": dt.time(23, 59, 59, 999999),
    "time_tz": dt.time(8, 0, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=45))),
    "timedelta": dt.timedelta(days=-3, seconds=5, microseconds=7),
    "decimal": Decimal("-1234.5600"),
    "uuid": uuid.UUID("12345678-1234-5678-1234-567812345678"),
    "tuple": (1, "a", (2, (3,)), b"x"),
    "empty_tuple": (),
    "set": {1, "b", (2, 3)},
    "frozenset": frozenset({frozenset({1}), 2}),
    "bytes": b"\x00\xff",
    "non_str_keys": {1: "int", (1, 2): "tuple", b"k": "bytes", None: 0, 2.5: [dt.date(2020, 1, 1)],
                     frozenset({3}): {Decimal("1"): (4,)}},
    "nested": [{"a": ({"b": {1, 2}},)}, [[(dt.timedelta(1),)]]],
    "item": Product(name="chair", price=Decimal("9.99"), tags=("wood", "oak")),
    "partial_item": Product(name="only a name"),
    "dataclass": Offer("sku1", Decimal("3.50"), _NAIVE),
    "frozen_dataclass": FrozenKey(1, (2, 3)),
    "attrs": Listing("http://a.test/", "hidden", [Product(name="n")]),
    "item_in_item": Product(name="box", tags=[Offer("in", Decimal(0))]),
    "plain": {"depth": 3, "list": [1, 2.5, None, True, "s"]},
}


@pytest.mark.parametrize("key", list(VALUES))
def test_values_come_back_equal_and_of_the_same_type(key: str) -> None:
    """Each kind of value in meta and cb_kwargs comes back equal and of the same type."""
    codec = RequestCodec(MySpider())
    value = VALUES[key]
    back = _round_trip(codec, Request("http://a.test/", meta={"v": value}, cb_kwargs={"v": value}))
    same(back.meta["v"], value)
    same(back.cb_kwargs["v"], value)


def test_all_values_in_one_request_and_non_init_fields() -> None:
    """All the kinds together, and a dataclass field outside __init__ keeps its value."""
    codec = RequestCodec(MySpider())
    offer = Offer("x", Decimal(1))
    offer.computed = 41
    meta = {**VALUES, "offer": offer}
    back = _round_trip(codec, Request("http://a.test/", meta=meta, cookies={"c": "1"}))
    same(back.meta, meta)
    assert back.meta["offer"].computed == 41


def test_zoneinfo_unknown_on_the_worker_falls_back_to_the_fixed_offset(monkeypatch: pytest.MonkeyPatch) -> None:
    """A zone key this worker does not know arrives as the fixed offset of that instant."""
    from streams_sched.wire import times as times_module

    codec = RequestCodec(MySpider())
    when = VALUES["datetime_zoneinfo"]
    payload = codec.encode(Request("http://a.test/", meta={"t": when}))
    monkeypatch.setattr(times_module, "_ZONE_KEYS", {"Europe/Paris": False})
    back = codec.decode(payload).meta["t"]
    assert back == when and back.utcoffset() == when.utcoffset()
    assert isinstance(back.tzinfo, dt.timezone)


def test_plain_meta_pays_nothing_and_writes_version_1() -> None:
    """Plain requests are encoded byte for byte as schema version 1 did; only entries that
    need version 2 say so."""
    codec = RequestCodec(MySpider())
    for name, payload in V1_PAYLOADS.items():
        request = codec.decode(payload)
        assert codec.encode(request) == payload, name
    assert "v" not in msgpack.unpackb(codec.encode(Request("http://a.test/", meta={"d": [1]})))
    d = msgpack.unpackb(codec.encode(Request("http://a.test/", meta={"d": (1,)})))
    assert d["v"] == 2


def test_subclasses_of_plain_types_travel_as_their_base_type() -> None:
    """An IntEnum, an OrderedDict or a namedtuple that is not registered arrives equal, as its base type."""

    class Level(enum.IntEnum):
        HIGH = 3

    codec = RequestCodec(MySpider())
    meta = {"e": Level.HIGH, "od": OrderedDict(a=1), "nt": Point(1, 2)}
    back = _round_trip(codec, Request("http://a.test/", meta=meta)).meta
    assert back == meta
    assert (type(back["e"]), type(back["od"]), type(back["nt"])) == (int, dict, tuple)


def test_meta_classes_travel_by_name_and_state() -> None:
    """Classes in STREAMS_META_CLASSES (plain, slotted, Enum, namedtuple) come back equal and typed."""
    here = __name__
    codec = RequestCodec(MySpider(), meta_classes=[f"{here}.Money", f"{here}.Slotted", f"{here}.Color", f"{here}.Point"])
    meta = {"m": Money(Decimal("2.50"), "EUR"), "s": Slotted(1, (2,)), "c": Color.BLUE, "p": Point(1, (2,))}
    back = _round_trip(codec, Request("http://a.test/", meta=meta)).meta
    same(back, meta)
    with pytest.raises(ConfigError, match="STREAMS_META_CLASSES"):
        RequestCodec(MySpider(), meta_classes=["no_such_module.Thing"])


def test_unknown_values_fail_at_enqueue_naming_the_field_and_the_fix() -> None:
    """A value the codec cannot carry raises SerializationError naming meta/cb_kwargs/cookies key and how to fix it."""
    codec = RequestCodec(MySpider())
    cases = [
        (Request("http://a.test/", meta={"ok": (1,), "money": Money(Decimal(1), "EUR")}), "meta['money']"),
        (Request("http://a.test/", cb_kwargs={"deep": [{"x": NotAllowed()}]}), "cb_kwargs['deep']"),
        (Request("http://a.test/", cookies={"c": NotAllowed()}), "cookies['c']"),
    ]
    for request, field in cases:
        with pytest.raises(SerializationError) as info:
            codec.encode(request)
        assert info.value.field == field
        assert "STREAMS_META_CLASSES" in str(info.value) and "register_meta_codec" in str(info.value)

    @dataclasses.dataclass
    class LocalItem:
        a: int

    with pytest.raises(SerializationError, match="define it at module level"):
        codec.encode(Request("http://a.test/", meta={"local": LocalItem(1)}))


def _class_entry(module: str, qualname: str, state: Any) -> bytes:
    inner = msgpack.packb([module, qualname, state], use_bin_type=True)
    return msgpack.packb({"u": "http://a.test/", "v": 2, "mt": {"x": msgpack.ExtType(16, inner)}}, use_bin_type=True)


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (_class_entry("antigravity", "Thing", {}), "not among the modules"),
        (_class_entry("os", "system", {}), "not among the modules"),
        (_class_entry("collections", "OrderedDict", {}), "neither an item class nor listed"),
        (_class_entry(__name__, "NotAllowed", {}), "neither an item class nor listed"),
        (_class_entry(__name__, "Product", {"nope": 1}), "rejects its state"),
        (_class_entry(__name__, "Offer", {"sku": "a", "nope": 1}), "unknown fields"),
        (_class_entry(__name__, "Offer", [1]), "rejects its state"),
        (_class_entry(__name__, "Product.__init__.__globals__", {}), "not among the modules"),
        (msgpack.packb({"u": "http://a.test/", "mt": {"x": msgpack.ExtType(99, b"")}}), "extension type 99 is unknown"),
        (msgpack.packb({"u": "http://a.test/", "mt": {"x": msgpack.ExtType(5, b"\x93\x01\x02\x03")}}), "datetime is not"),
        (msgpack.packb({"u": "http://a.test/", "mt": {"x": msgpack.ExtType(5, msgpack.packb([2020, 13, 1, 0, 0, 0, 0, 0]))}}), "month must be"),
        (msgpack.packb({"u": "http://a.test/", "mt": {"x": msgpack.ExtType(9, b"not a number")}}), "extension type 9"),
        (msgpack.packb({"u": "http://a.test/", "mt": {"x": msgpack.ExtType(10, b"short")}}), "extension type 10"),
        (msgpack.packb({"u": "http://a.test/", "mt": {"x": msgpack.ExtType(2, msgpack.packb([[1]]))}}), "unhashable"),
        (msgpack.packb({"u": "http://a.test/", "mt": {"x": msgpack.ExtType(17, msgpack.packb(["os.system", 1]))}}), "no codec for os.system"),
        (msgpack.packb({"u": "http://a.test/", "x": {"dumps_kwargs": {}}}), "without a request class"),
        (msgpack.packb({"u": "http://a.test/", "t": "JsonRequest", "x": {"meta": {}}}), "not attributes of"),
        (msgpack.packb({"u": "http://a.test/", "v": [2]}), "schema version"),
        (msgpack.packb({"u": "http://a.test/", "v": 3}), "schema version"),
    ],
)
def test_bad_values_in_entries_are_refused_with_a_reason(payload: bytes, reason: str) -> None:
    """Classes outside item classes / STREAMS_META_CLASSES, unknown codes and bad data raise EntryError."""
    codec = RequestCodec(MySpider(), meta_classes=[f"{__name__}.Money"])
    with pytest.raises(EntryError, match=reason):
        codec.decode(payload)


def test_a_meta_class_with_a_dunder_attribute_is_refused() -> None:
    """State of a STREAMS_META_CLASSES object may only set plain attribute names (no __class__)."""
    codec = RequestCodec(MySpider(), meta_classes=[f"{__name__}.Money"])
    with pytest.raises(EntryError, match="attribute names"):
        codec.decode(_class_entry(__name__, "Money", {"__class__": 1}))


def test_decoding_a_class_never_imports(monkeypatch: pytest.MonkeyPatch) -> None:
    """A class in a module the worker has not imported is refused, and the module stays unimported."""
    import importlib

    def boom(*a: Any, **k: Any) -> None:  # pragma: no cover - failing is the point
        raise AssertionError("decode imported something")

    codec = RequestCodec(MySpider())
    import builtins

    monkeypatch.setattr(importlib, "import_module", boom)
    monkeypatch.setattr(builtins, "__import__", boom)
    for module in ("antigravity", "this", "xml.dom.minidom_not_here"):
        with pytest.raises(EntryError, match="not among the modules"):
            codec.decode(_class_entry(module, "Thing", {}))
        assert module not in sys.modules


# -- the codec registry, scrapy-playwright, scrapy-splash ------------------------------


def test_registered_codec_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    """A class registered from Python travels through its own encode/decode."""
    monkeypatch.setattr(meta_codecs, "_REGISTERED", {})
    register_meta_codec(Money, lambda m: [m.amount, m.currency], lambda d: Money(*d))
    codec = RequestCodec(MySpider())
    meta = {"price": Money(Decimal("1.10"), "USD"), "list": [Money(Decimal(0), "EUR")]}
    same(_round_trip(codec, Request("http://a.test/", meta=meta)).meta, meta)
    other = RequestCodec(MySpider())  # this worker has the codec; the next one does not
    monkeypatch.setattr(meta_codecs, "_REGISTERED", {})
    bare = RequestCodec(MySpider())
    with pytest.raises(EntryError, match=f"no codec for {__name__}.Money"):
        bare.decode(other.encode(Request("http://a.test/", meta=meta)))


money_codec = MetaCodec(Money, lambda m: [str(m.amount), m.currency], lambda d: Money(Decimal(d[0]), d[1]))


def test_codec_from_settings_round_trips_and_bad_ones_fail_at_start() -> None:
    """STREAMS_META_CODECS maps a class path to a codec path; a bad entry is a ConfigError naming the setting."""
    codec = RequestCodec(MySpider(), meta_codecs={f"{__name__}.Money": f"{__name__}.money_codec"})
    meta = {"price": Money(Decimal("7.00"), "GBP")}
    same(_round_trip(codec, Request("http://a.test/", meta=meta)).meta, meta)
    for bad in ({f"{__name__}.Money": "no.such.codec"}, {f"{__name__}.Money": f"{__name__}.Money"},
                {f"{__name__}.money_codec": f"{__name__}.money_codec"}):
        with pytest.raises(ConfigError, match="STREAMS_META_CODECS"):
            RequestCodec(MySpider(), meta_codecs=bad)


def test_playwright_meta_round_trips() -> None:
    """scrapy-playwright's meta (PageMethod objects with string names, args, kwargs) arrives as the same objects."""
    codec = RequestCodec(MySpider())
    methods = [
        PageMethod("wait_for_selector", "div.quote", timeout=5000),
        PageMethod("evaluate", "window.scrollBy(0, document.body.scrollHeight)"),
        PageMethod("screenshot", path="shot.png", full_page=True, clip={"x": 0, "y": 0, "width": 10, "height": 5}),
        PageMethod("click", selector=("a", 1)),
    ]
    meta = {"playwright": True, "playwright_include_page": False, "playwright_context": "ctx-1",
            "playwright_page_methods": methods, "playwright_page_goto_kwargs": {"wait_until": "networkidle"}}
    back = _round_trip(codec, Request("http://a.test/", meta=meta)).meta
    assert {k: v for k, v in back.items() if k != "playwright_page_methods"} == {
        k: v for k, v in meta.items() if k != "playwright_page_methods"}
    got = back["playwright_page_methods"]
    assert [type(m) for m in got] == [PageMethod] * len(methods)
    for a, b in zip(methods, got, strict=True):
        same((a.method, a.args, a.kwargs, a.result), (b.method, b.args, b.kwargs, b.result))
    with pytest.raises(SerializationError, match="playwright_page_methods.*use a page method name"):
        codec.encode(Request("http://a.test/", meta={"playwright_page_methods": [PageMethod(lambda page: None)]}))


def test_splash_request_round_trips_with_its_args() -> None:
    """A SplashRequest allowed by STREAMS_REQUEST_CLASSES comes back with the same class, url and splash meta."""
    spider = MySpider()
    codec = RequestCodec(spider, extra_classes=["scrapy_splash.SplashRequest"])
    requests = [
        SplashRequest("http://a.test/js", callback=spider.parse_item, args={"wait": 0.5, "lua_source": "return 1"},
                      endpoint="execute", splash_headers={"X-Token": "t"}, cache_args=["lua_source"],
                      meta={"item": Product(name="p"), "depth": 2}, cb_kwargs={"page": (1, 2)}),
        SplashRequest("http://a.test/raw", dont_process_response=True, http_status_from_error_code=False,
                      magic_response=False, session_id=None, slot_policy="single_slot"),
    ]
    for req in requests:
        back = _round_trip(codec, req)
        assert type(back) is SplashRequest
        assert (back.url, back.method, back.callback, back.body) == (req.url, req.method, req.callback, req.body)
        same(back.meta, req.meta)
        same(back.cb_kwargs, req.cb_kwargs)


def test_json_request_keeps_its_dumps_kwargs() -> None:
    """A subclass's own attributes (JsonRequest.dumps_kwargs) travel as Scrapy's request_from_dict passes them."""
    codec = RequestCodec(MySpider())
    js = JsonRequest("http://a.test/j", data={"b": 1, "a": (2,)}, dumps_kwargs={"indent": 2})
    back = _round_trip(codec, js)
    assert type(back) is JsonRequest and back.dumps_kwargs == js.dumps_kwargs and back.body == js.body


# -- upgrades ---------------------------------------------------------------------

# Made by a schema version 1 encoder for V1Spider below, kept verbatim: a version 1
# entry already in a queue must decode to the same request.
V1_PAYLOADS: dict[str, bytes] = {
    'plain': b'\x82\xa1u\xb1http://a.test/p/1\xa2mt\x81\xa5depth\x02',
    'full': b'\x8d\xa1u\xb3http://a.test/a?b=1\xa1c\xaaparse_item\xa1e\xa8on_error\xa1m\xa4POST\xa1h\x91\x92\xc4\x03X-A\x92\xc4\x011\xc4\x012\xa1b\xc4\x05\x00bin\xff\xa1k\x81\xa7session\xa2s1\xa2mt\x83\xa5depth\x03\xa6nested\x81\xa1k\x95\x01\xcb@\x04\x00\x00\x00\x00\x00\x00\xc0\xc3\xc4\x03raw\x07\xa7int key\xa1a\x81\xa4page\x02\xa1p\xfd\xa2df\xc3\xa2en\xa7latin-1\xa1f\x91\xa2f1',
    'nocb': b'\x82\xa1u\xafhttp://a.test/n\xa1c\xa1!',
    'form': b'\x86\xa1u\xafhttp://a.test/f\xa1c\xaaparse_item\xa1m\xa4POST\xa1h\x91\x92\xc4\x0cContent-Type\x91\xc4!application/x-www-form-urlencoded\xa1b\xc4\x03q=x\xa1t\xabFormRequest',
    'json': b'\x85\xa1u\xafhttp://a.test/j\xa1m\xa4POST\xa1h\x92\x92\xc4\x0cContent-Type\x91\xc4\x10application/json\x92\xc4\x06Accept\x91\xc4.application/json, text/javascript, */*; q=0.01\xa1b\xc4\x08{"a": 1}\xa1t\xabJsonRequest',
}


def test_version_1_entries_decode_to_the_same_requests() -> None:
    """Entries written by schema version 1 decode under version 2 to the requests they meant."""
    spider = MySpider()
    codec = RequestCodec(spider)
    got = {name: codec.decode(p) for name, p in V1_PAYLOADS.items()}
    assert got["plain"].url == "http://a.test/p/1" and got["plain"].meta == {"depth": 2}
    full = got["full"]
    assert (full.callback, full.errback, full.method, full.body) == (spider.parse_item, spider.on_error, "POST", b"\x00bin\xff")
    assert full.meta == {"depth": 3, "nested": {"k": [1, 2.5, None, True, b"raw"]}, 7: "int key"}
    assert (full.cookies, full.cb_kwargs, full.priority, full.dont_filter) == ({"session": "s1"}, {"page": 2}, -3, True)
    assert (full.encoding, full.flags, full.headers.getlist("X-A")) == ("latin-1", ["f1"], [b"1", b"2"])
    assert got["nocb"].callback is NO_CALLBACK
    assert type(got["form"]) is FormRequest and got["form"].body == b"q=x" and got["form"].callback == spider.parse_item
    assert type(got["json"]) is JsonRequest and got["json"].body == b'{"a": 1}'


def test_version_mark_with_every_field_set() -> None:
    """A request using every payload key (15 of them) plus the version mark still decodes: the
    mark grows the map header from a fixmap to a map16."""
    spider = MySpider()
    codec = RequestCodec(spider)
    req = JsonRequest(
        "http://a.test/all", data={"q": (1, 2)}, dumps_kwargs={"indent": 1}, callback=spider._MySpider__private,
        errback=spider.on_error, method="PUT", cookies={"c": "1"}, meta={"when": dt.date(2020, 1, 2)},
        cb_kwargs={"k": {1, 2}}, priority=3, dont_filter=True, encoding="latin-1", flags=["f"],
    )
    payload = codec.encode(req)
    d = msgpack.unpackb(payload, strict_map_key=False)
    assert payload[0] == 0xDE and len(d) == 16 and d["v"] == 2
    back = codec.decode(payload)
    assert back.callback == spider._MySpider__private and back.dumps_kwargs == {"indent": 1, "sort_keys": True}
    same(back.meta, req.meta)
    same(back.cb_kwargs, req.cb_kwargs)
    assert (back.method, back.body, back.priority, back.encoding, back.flags) == ("PUT", req.body, 3, "latin-1", ["f"])


def test_scheduler_builds_its_codec_from_the_settings(plain_redis_url: str, crawl: str) -> None:
    """A worker's codec takes STREAMS_META_CLASSES and STREAMS_META_CODECS from its settings."""
    from scrapy.utils.request import RequestFingerprinter

    from streams_sched.config import StreamsConfig
    from streams_sched.worker.scheduler import Limits, StreamsScheduler

    config = StreamsConfig.from_settings({
        "REDIS_URL": plain_redis_url, "STREAMS_PREFIX": crawl,
        "STREAMS_IDLE_POLL_SECONDS": 0.02,  # close() waits out the I/O thread's idle sleep
        "STREAMS_META_CLASSES": f"{__name__}.Slotted",
        "STREAMS_META_CODECS": {f"{__name__}.Money": f"{__name__}.money_codec"},
    })
    sched = StreamsScheduler(config, fingerprinter=RequestFingerprinter(), limits=Limits(2, 2))
    sched.open(MySpider())
    try:
        assert sched.codec is not None
        meta = {"s": Slotted(1, 2), "m": Money(Decimal(1), "EUR")}
        same(_round_trip(sched.codec, Request("http://a.test/", meta=meta)).meta, meta)
    finally:
        sched.close("finished")


def test_failing_codecs_and_cycles_are_serialization_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """A project codec that raises, or a cycle through tuples, is a SerializationError naming the key,
    never another exception out of enqueue."""
    monkeypatch.setattr(meta_codecs, "_REGISTERED", {})
    register_meta_codec(Money, lambda m: m.missing_attribute, lambda d: d)
    codec = RequestCodec(MySpider())
    with pytest.raises(SerializationError) as info:
        codec.encode(Request("http://a.test/", meta={"price": Money(Decimal(1), "EUR")}))
    assert info.value.field == "meta['price']" and "AttributeError" in str(info.value)
    cycle: list[Any] = []
    cycle.append((cycle,))
    with pytest.raises(SerializationError, match="deeper than") as info:
        codec.encode(Request("http://a.test/", cb_kwargs={"loop": cycle}))
    assert info.value.field == "cb_kwargs['loop']"
    assert codec.decode(codec.encode(Request("http://a.test/", meta={"ok": (1,)}))).meta == {"ok": (1,)}


def test_nesting_deeper_than_the_encoder_writes_is_refused() -> None:
    """An entry nesting extension values deeper than encode ever writes is an EntryError, not a RecursionError."""
    value = msgpack.packb([1])
    for _ in range(500):
        value = msgpack.packb([msgpack.ExtType(1, value)])
    payload = msgpack.packb({"u": "http://a.test/", "v": 2, "mt": {"x": msgpack.ExtType(1, value)}})
    codec = RequestCodec(MySpider())
    with pytest.raises(EntryError, match="deeper than 64"):
        codec.decode(payload)
    assert codec.decode(codec.encode(Request("http://a.test/", meta={"t": ((((1,),),),)}))).meta["t"] == ((((1,),),),)
