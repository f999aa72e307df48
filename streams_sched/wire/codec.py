"""Request <-> stream entry payload, in msgpack. Never pickle.

A payload is a msgpack map with short keys::

    v   schema version (absent: 1; 2 when the entry uses what version 1 could
        not carry: extension types in meta/cb_kwargs/cookies, callbacks named
        with a leading underscore, "x")
    u   url                         (str, required)
    c   callback name               (absent: spider.parse; "!" : NO_CALLBACK)
    e   errback name                (absent: none)
    m   method                      (absent: GET)
    h   headers [[name, [value, ...]], ...] as bytes
    b   body                        (bytes)
    k   cookies                     (dict or list of dicts)
    mt  meta                        (map with str keys)
    a   cb_kwargs                   (map with str keys)
    p   priority                    (int, absent: 0)
    df  dont_filter                 (bool, absent: False)
    en  encoding                    (absent: utf-8)
    f   flags                       (list of str)
    t   request class               (absent: scrapy.Request; else a name from the allowlist)
    x   extra attributes of the request class (Request.attributes beyond
        scrapy.Request's, e.g. JsonRequest's dumps_kwargs), when not their default

Values in meta, cb_kwargs and cookies use the extension codes of values.py
(tuples, sets, dates and times, Decimal, UUID, items, STREAMS_META_CLASSES,
registered codecs). A version 1 entry means the same to this decoder as it
did to version 1's; a worker still on version 1 refuses a version 2 entry
with the reason, and still reads the version 2 entries that do not need it.

Nothing in a payload is evaluated or imported: callbacks resolve by name to
the spider's own methods (callbacks.py), classes in values are looked up
among modules already imported, and the request class is looked up in an
allowlist built from trusted settings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from types import MethodType
from typing import Any

import msgpack
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.misc import load_object

from streams_sched.errors import ConfigError, EntryError, SerializationError
from streams_sched.wire.callbacks import method_name, spider_method
from streams_sched.wire.meta_codecs import registered_codecs
from streams_sched.wire.values import ValueCodec

__all__ = ["RequestCodec", "DEFAULT_REQUEST_CLASSES", "TRANSIENT_META_KEYS"]

SCHEMA_VERSION = 2
#: versions this decoder reads
READABLE_VERSIONS = frozenset({1, 2})
_NO_CALLBACK_MARK = "!"

#: Request classes every crawl may carry, by the name stored in entries.
DEFAULT_REQUEST_CLASSES: dict[str, type[Request]] = {
    "FormRequest": FormRequest,
    "JsonRequest": JsonRequest,
}

#: Meta keys that describe one download and are not carried into the queue.
TRANSIENT_META_KEYS: frozenset[str] = frozenset({"download_latency"})

_KNOWN_KEYS = frozenset({"v", "u", "c", "e", "m", "h", "b", "k", "mt", "a", "p", "df", "en", "f", "t", "x"})
_BASE_ATTRIBUTES = frozenset(Request.attributes)
#: request classes whose __init__ leaves meta as given (no need to restore it on decode)
_KEEPS_META = frozenset({Request, FormRequest, JsonRequest})


class RequestCodec:
    """Encodes requests into payloads and decodes payloads into requests.

    ``spider`` is used to name callbacks on encode and to resolve them on
    decode; it may be ``None`` for tools that only encode seeds (the CLI),
    in which case only callbacks given by name are possible.
    ``meta_classes`` (STREAMS_META_CLASSES) and ``meta_codecs``
    (STREAMS_META_CODECS) are import paths from trusted settings, loaded here.
    """

    def __init__(
        self,
        spider: Spider | None = None,
        extra_classes: Iterable[str] = (),
        max_bytes: int = 0,
        meta_classes: Iterable[str] = (),
        meta_codecs: Mapping[str, str] | None = None,
    ) -> None:
        self.spider = spider
        self.max_bytes = max_bytes
        self._by_name: dict[str, type[Request]] = dict(DEFAULT_REQUEST_CLASSES)
        for path in extra_classes:
            cls = _load(path, "STREAMS_REQUEST_CLASSES")
            if not (isinstance(cls, type) and issubclass(cls, Request)):
                raise ConfigError(
                    "STREAMS_REQUEST_CLASSES", path, "is not a subclass of scrapy.Request"
                )
            self._by_name[path] = cls
        self._name_of: dict[type[Request], str] = {c: n for n, c in self._by_name.items()}
        self._extras: dict[type[Request], dict[str, Any]] = {}
        classes = []
        for path in meta_classes:
            cls = _load(path, "STREAMS_META_CLASSES")
            if not isinstance(cls, type):
                raise ConfigError("STREAMS_META_CLASSES", path, "is not a class")
            classes.append(cls)
        self.values = ValueCodec(classes, registered_codecs(meta_codecs))
        self._packb = self.values.pack
        self._unpackb: Callable[..., Any] = msgpack.unpackb
        self._ext_hook = self.values.ext_hook
        self._valid_names: set[str] = set()
        self._method_names: dict[Any, str] = {}

    # -- encode ---------------------------------------------------------

    def encode(self, request: Request, callback: str | None = None, errback: str | None = None) -> bytes:
        """Return the payload of ``request``; raise SerializationError if it has none.
        ``callback`` and ``errback`` name spider methods (checked by the caller, with
        callbacks.check_name) in place of the request's own."""
        d: dict[str, Any] = {"u": request.url}
        v2 = False
        if callback is not None:
            d["c"] = callback
            v2 = callback[0] == "_"
        elif request.callback is not None:
            d["c"] = name = self._callback_name(request, request.callback, "callback")
            v2 = name[0] == "_"
        if errback is not None:
            d["e"] = errback
            v2 = v2 or errback[0] == "_"
        elif request.errback is not None:
            d["e"] = name = self._callback_name(request, request.errback, "errback")
            v2 = v2 or name[0] == "_"
        if request.method != "GET":
            d["m"] = request.method
        if request.headers:
            d["h"] = [[k, list(v)] for k, v in request.headers.items()]
        if request.body:
            d["b"] = request.body
        if request.cookies:
            d["k"] = request.cookies
        meta = request.meta
        if meta:
            if not TRANSIENT_META_KEYS.isdisjoint(meta):
                meta = {k: v for k, v in meta.items() if k not in TRANSIENT_META_KEYS}
            d["mt"] = meta
        if request.cb_kwargs:
            d["a"] = request.cb_kwargs
        if request.priority:
            d["p"] = request.priority
        if request.dont_filter:
            d["df"] = True
        if request.encoding != "utf-8":
            d["en"] = request.encoding
        if request.flags:
            d["f"] = request.flags
        cls = type(request)
        if cls is not Request:
            cls_name = self._name_of.get(cls)
            if cls_name is None:
                raise SerializationError(
                    repr(request),
                    "class",
                    f"{cls.__module__}.{cls.__qualname__} is not an allowed request class;"
                    " add its import path to STREAMS_REQUEST_CLASSES",
                )
            d["t"] = cls_name
            extras = self._extra_attributes(request, cls)
            if extras:
                d["x"] = extras
                v2 = True
        values = self.values
        values.ext_used = False
        try:
            payload: bytes = self._packb(d)
        except Exception as exc:  # TypeError (Unencodable), ValueError, OverflowError from msgpack
            raise self._explain(request, d, exc) from None
        if v2 or values.ext_used:
            payload = _with_version(payload)
        if self.max_bytes and len(payload) > self.max_bytes:
            raise SerializationError(
                repr(request),
                "size",
                f"encoded request is {len(payload)} bytes, over STREAMS_MAX_REQUEST_BYTES="
                f"{self.max_bytes}; keep large data out of meta and body",
            )
        return payload

    def url_encoder(
        self,
        *,
        callback: str | None = None,
        errback: str | None = None,
        meta: Mapping[str, Any] | None = None,
        priority: int = 0,
        dont_filter: bool = False,
    ) -> Callable[[str], bytes]:
        """A function from a URL to the payload :meth:`encode` gives for ``Request(url,
        meta=meta, priority=priority, dont_filter=dont_filter)`` with the spider methods
        named ``callback`` and ``errback``, byte for byte. A seeder sends many such
        requests that differ only by their URL: the fields after it are packed once.

        Raises SerializationError (as :meth:`encode` would) if ``meta`` cannot travel;
        the function raises it for a payload over ``max_bytes``."""
        d: dict[str, Any] = {"u": ""}
        v2 = False
        for key, name in (("c", callback), ("e", errback)):
            if name is not None:
                d[key] = name
                v2 = v2 or name[:1] == "_"
        if meta:
            if not TRANSIENT_META_KEYS.isdisjoint(meta):
                meta = {k: v for k, v in meta.items() if k not in TRANSIENT_META_KEYS}
            d["mt"] = dict(meta)
        if priority:
            d["p"] = priority
        if dont_filter:
            d["df"] = True
        values = self.values
        values.ext_used = False
        try:
            template = self._packb(d)
        except Exception as exc:
            raise self._explain(_Named("<GET (each URL)>"), d, exc) from None
        v2 = v2 or values.ext_used
        # a map's msgpack is its header and then its pairs in order, "u" first: what
        # follows the empty URL of the template is every URL's tail
        empty_url = b"\xa1u\xa0"
        if template[1:4] != empty_url:  # pragma: no cover - the template is a fixmap with "u" first
            raise AssertionError(f"unexpected payload template {template[:8]!r}")
        head = (_with_version(template[:1]) if v2 else template[:1]) + b"\xa1u"
        tail = template[4:]
        pack_str = msgpack.Packer(use_bin_type=True).pack
        max_bytes = self.max_bytes
        method = "GET"

        def encode_url(url: str) -> bytes:
            payload: bytes = head + pack_str(url) + tail
            if max_bytes and len(payload) > max_bytes:
                raise SerializationError(
                    f"<{method} {url}>",
                    "size",
                    f"encoded request is {len(payload)} bytes, over STREAMS_MAX_REQUEST_BYTES="
                    f"{max_bytes}; keep large data out of meta and body",
                )
            return payload

        return encode_url

    def _extra_attributes(self, request: Request, cls: type[Request]) -> dict[str, Any]:
        """The attributes ``cls`` adds to Request.attributes, where they differ from the
        defaults of a fresh instance (as Scrapy's request_from_dict passes them)."""
        defaults = self._extras.get(cls)
        if defaults is None:
            names = [a for a in cls.attributes if a not in _BASE_ATTRIBUTES]
            try:
                fresh = cls("http://defaults.invalid/")
                defaults = {a: getattr(fresh, a) for a in names}
            except Exception:
                defaults = {a: _NO_DEFAULT for a in names}
            self._extras[cls] = defaults
        out = {}
        for a, default in defaults.items():
            value = getattr(request, a)
            if value != default:
                out[a] = value
        return out

    def _callback_name(self, request: Request, func: Callable[..., Any], what: str) -> str:
        if func is NO_CALLBACK:
            return _NO_CALLBACK_MARK
        key = getattr(func, "__func__", func)
        known = self._method_names.get(key)
        if known is not None and getattr(func, "__self__", None) is self.spider:
            return known
        try:
            name = method_name(self.spider, func)
        except ValueError as exc:
            raise SerializationError(repr(request), what, str(exc)) from None
        self._method_names[key] = name
        return name

    def _explain(self, request: Request | _Named, d: dict[str, Any], exc: Exception) -> SerializationError:
        """Find which field (and which meta / cb_kwargs key) cannot be encoded."""
        names = {"mt": "meta", "a": "cb_kwargs", "k": "cookies", "h": "headers", "f": "flags", "x": "attributes"}
        pack = self._packb
        for field, value in d.items():
            try:
                pack(value)
            except Exception as inner:
                label = names.get(field, field)
                if isinstance(value, Mapping):
                    for key, item in value.items():
                        try:
                            pack(key)
                            pack(item)
                        except Exception as leaf:
                            return SerializationError(
                                repr(request),
                                f"{label}[{key!r}]",
                                f"{type(item).__name__} value cannot be encoded: {leaf}",
                            )
                return SerializationError(repr(request), label, str(inner))
        return SerializationError(repr(request), "request", str(exc))

    # -- decode ---------------------------------------------------------

    def decode(self, payload: bytes) -> Request:
        """Return the request of ``payload``; raise EntryError with the reason if it has none."""
        try:
            d = self._unpackb(payload, raw=False, strict_map_key=False, ext_hook=self._ext_hook)
        except EntryError:
            raise
        except Exception as exc:
            raise EntryError(f"payload is not msgpack: {type(exc).__name__}: {exc}") from None
        if not isinstance(d, dict):
            raise EntryError(f"payload is a {type(d).__name__}, not a map")
        url = d.get("u")
        if not isinstance(url, str) or not url:
            raise EntryError("payload has no url (key 'u')")
        unknown = d.keys() - _KNOWN_KEYS
        if unknown:
            raise EntryError(f"payload has unknown keys {sorted(map(str, unknown))}")
        v = d.get("v", 1)
        if v != 1 and (type(v) is not int or v not in READABLE_VERSIONS):
            raise EntryError(
                f"payload schema version {v!r} is not supported (this worker reads"
                f" {sorted(READABLE_VERSIONS)}; upgrade it)"
            )
        kwargs: dict[str, Any] = {}
        if "c" in d:
            kwargs["callback"] = self._resolve(d["c"], "callback")
        if "e" in d:
            kwargs["errback"] = self._resolve(d["e"], "errback")
        _take(d, kwargs, "m", "method", str)
        if "h" in d:
            h = d["h"]
            if not isinstance(h, list) or not all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[1], list) for p in h
            ):
                raise EntryError("headers (key 'h') are not a list of [name, [values]]")
            kwargs["headers"] = [(k, vals) for k, vals in h]
        _take(d, kwargs, "b", "body", (bytes, str))
        _take(d, kwargs, "k", "cookies", (dict, list))
        _take(d, kwargs, "mt", "meta", dict)
        _take(d, kwargs, "a", "cb_kwargs", dict)
        _take(d, kwargs, "p", "priority", int)
        _take(d, kwargs, "df", "dont_filter", bool)
        _take(d, kwargs, "en", "encoding", str)
        _take(d, kwargs, "f", "flags", list)
        cls: type[Request] = Request
        if "t" in d:
            found = self._by_name.get(d["t"]) if isinstance(d["t"], str) else None
            if found is None:
                raise EntryError(
                    f"request class {d['t']!r} is not allowed (see STREAMS_REQUEST_CLASSES)"
                )
            cls = found
            if "x" in d:
                extras = d["x"]
                if not isinstance(extras, dict) or not all(
                    isinstance(k, str) and k in cls.attributes and k not in _BASE_ATTRIBUTES for k in extras
                ):
                    raise EntryError(f"extra attributes (key 'x') {extras!r} are not attributes of {d['t']}")
                kwargs.update(extras)
        elif "x" in d:
            raise EntryError("extra attributes (key 'x') without a request class (key 't')")
        try:
            request = cls(url, **kwargs)
        except Exception as exc:
            raise EntryError(f"Scrapy rejects the request: {type(exc).__name__}: {exc}") from None
        if cls not in _KEEPS_META:
            # a subclass __init__ may add to meta (SplashRequest fills meta['splash']
            # defaults); the request had exactly the meta that travelled
            request.meta.clear()
            request.meta.update(kwargs.get("meta", {}))
        return request

    def _resolve(self, name: Any, what: str) -> Any:
        if name == _NO_CALLBACK_MARK:
            return NO_CALLBACK
        spider = self.spider
        if spider is None:
            raise EntryError(f"{what} {name!r} cannot be resolved without a spider")
        if type(name) is str and name in self._valid_names:  # the same rule, its name half checked
            method = getattr(spider, name, None)
            if type(method) is MethodType and method.__self__ is spider:
                return method
        try:
            method = spider_method(spider, name)
        except ValueError as exc:
            raise EntryError(f"{what} {name!r} of spider {spider.name!r}: {exc}") from None
        self._valid_names.add(name)
        return method


_NO_DEFAULT = object()


class _Named:
    """Stands for a request in an error message: its repr is the text given."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


_VERSION_PAIR = b"\xa1v" + bytes([SCHEMA_VERSION])  # msgpack of "v" and of the version


def _with_version(payload: bytes) -> bytes:
    """``payload`` with ``"v": SCHEMA_VERSION`` added, without packing it again: a payload
    has at most 15 keys before "v", so it starts with a fixmap header (0x80 | count)."""
    head = payload[0]
    if head & 0xF0 != 0x80:  # pragma: no cover - every field set is at most 15 keys
        raise AssertionError(f"payload map header {head:#x} is not a fixmap")
    count = (head & 0x0F) + 1
    new_head = bytes([0x80 | count]) if count <= 15 else b"\xde" + count.to_bytes(2, "big")
    return new_head + _VERSION_PAIR + payload[1:]


def _load(path: str, setting: str) -> Any:
    try:
        return load_object(path)
    except Exception as exc:
        raise ConfigError(setting, path, f"cannot import it ({exc})") from exc


def _take(d: dict[str, Any], kwargs: dict[str, Any], key: str, arg: str, types: Any) -> None:
    if key in d:
        value = d[key]
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise EntryError(f"{arg} (key {key!r}) has type {type(value).__name__}")
        kwargs[arg] = value
