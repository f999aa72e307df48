"""Requests survive the msgpack codec; bad input fails with a clear reason; nothing is imported."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.http.request import NO_CALLBACK

from streams_sched.codec import RequestCodec
from streams_sched.errors import ConfigError, EntryError, SerializationError


class MySpider(Spider):
    name = "codec"

    def parse_item(self, response):  # pragma: no cover - never called
        pass

    def on_error(self, failure):  # pragma: no cover
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

    import streams_sched.codec as codec_module

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
