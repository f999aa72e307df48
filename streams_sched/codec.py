"""Request <-> stream entry payload, in msgpack. Never pickle.

A payload is a msgpack map with short keys::

    v   schema version (1)
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

Nothing in a payload is evaluated or imported: callbacks resolve by name to
the spider's own methods, and the request class is looked up in an allowlist
built from trusted settings.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import msgpack
from scrapy import Request, Spider
from scrapy.http import FormRequest, JsonRequest
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.misc import load_object

from .errors import ConfigError, EntryError, SerializationError

__all__ = ["RequestCodec", "DEFAULT_REQUEST_CLASSES", "TRANSIENT_META_KEYS"]

SCHEMA_VERSION = 1
_NO_CALLBACK_MARK = "!"

#: Request classes every crawl may carry, by the name stored in entries.
DEFAULT_REQUEST_CLASSES: dict[str, type[Request]] = {
    "FormRequest": FormRequest,
    "JsonRequest": JsonRequest,
}

#: Meta keys that describe one download and are not carried into the queue.
TRANSIENT_META_KEYS: frozenset[str] = frozenset({"download_latency"})

_KNOWN_KEYS = frozenset({"v", "u", "c", "e", "m", "h", "b", "k", "mt", "a", "p", "df", "en", "f", "t"})

_packb = msgpack.Packer(use_bin_type=True).pack


class RequestCodec:
    """Encodes requests into payloads and decodes payloads into requests.

    ``spider`` is used to name callbacks on encode and to resolve them on
    decode; it may be ``None`` for tools that only encode seeds (the CLI),
    in which case only callbacks given by name are possible.
    """

    def __init__(
        self,
        spider: Spider | None = None,
        extra_classes: Iterable[str] = (),
        max_bytes: int = 0,
    ) -> None:
        self.spider = spider
        self.max_bytes = max_bytes
        self._by_name: dict[str, type[Request]] = dict(DEFAULT_REQUEST_CLASSES)
        for path in extra_classes:
            try:
                cls = load_object(path)
            except Exception as exc:
                raise ConfigError(
                    "STREAMS_REQUEST_CLASSES", path, f"cannot import it ({exc})"
                ) from exc
            if not (isinstance(cls, type) and issubclass(cls, Request)):
                raise ConfigError(
                    "STREAMS_REQUEST_CLASSES", path, "is not a subclass of scrapy.Request"
                )
            self._by_name[path] = cls
        self._name_of: dict[type[Request], str] = {c: n for n, c in self._by_name.items()}
        self._method_names: dict[Any, str] = {}

    # -- encode ---------------------------------------------------------

    def encode(self, request: Request) -> bytes:
        """Return the payload of ``request``; raise SerializationError if it has none."""
        d: dict[str, Any] = {"u": request.url}
        cb = request.callback
        if cb is not None:
            d["c"] = self._callback_name(request, cb, "callback")
        eb = request.errback
        if eb is not None:
            d["e"] = self._callback_name(request, eb, "errback")
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
            name = self._name_of.get(cls)
            if name is None:
                raise SerializationError(
                    repr(request),
                    "class",
                    f"{cls.__module__}.{cls.__qualname__} is not an allowed request class;"
                    " add its import path to STREAMS_REQUEST_CLASSES",
                )
            d["t"] = name
        try:
            payload: bytes = _packb(d)
        except (TypeError, ValueError, OverflowError) as exc:
            raise self._explain(request, d, exc) from None
        if self.max_bytes and len(payload) > self.max_bytes:
            raise SerializationError(
                repr(request),
                "size",
                f"encoded request is {len(payload)} bytes, over STREAMS_MAX_REQUEST_BYTES="
                f"{self.max_bytes}; keep large data out of meta and body",
            )
        return payload

    def _callback_name(self, request: Request, func: Callable[..., Any], what: str) -> str:
        if func is NO_CALLBACK:
            return _NO_CALLBACK_MARK
        key = getattr(func, "__func__", func)
        known = self._method_names.get(key)
        if known is not None and getattr(func, "__self__", None) is self.spider:
            return known
        owner = getattr(func, "__self__", None)
        fname: str | None = getattr(func, "__name__", None)
        if owner is None or owner is not self.spider or fname is None:
            raise SerializationError(
                repr(request),
                what,
                f"{func!r} is not a method of the spider; only the spider's own methods"
                " can travel through the shared queue (by name)",
            )
        if getattr(getattr(self.spider, fname, None), "__func__", None) is not key:
            raise SerializationError(
                repr(request),
                what,
                f"spider method {fname!r} is not reachable under that name",
            )
        self._method_names[key] = fname
        return fname

    @staticmethod
    def _explain(request: Request, d: dict[str, Any], exc: Exception) -> SerializationError:
        """Find which field (and which meta / cb_kwargs key) cannot be encoded."""
        names = {"mt": "meta", "a": "cb_kwargs", "k": "cookies", "h": "headers", "f": "flags"}
        for field, value in d.items():
            try:
                _packb(value)
            except (TypeError, ValueError, OverflowError) as inner:
                label = names.get(field, field)
                if isinstance(value, Mapping):
                    for key, item in value.items():
                        try:
                            _packb(key)
                            _packb(item)
                        except (TypeError, ValueError, OverflowError) as leaf:
                            return SerializationError(
                                repr(request),
                                f"{label}[{key!r}]",
                                f"{type(item).__name__} value cannot be encoded ({leaf});"
                                " meta must hold plain data (str, bytes, numbers, bools,"
                                " None, lists, dicts)",
                            )
                return SerializationError(repr(request), label, str(inner))
        return SerializationError(repr(request), "request", str(exc))

    # -- decode ---------------------------------------------------------

    def decode(self, payload: bytes) -> Request:
        """Return the request of ``payload``; raise EntryError with the reason if it has none."""
        try:
            d = msgpack.unpackb(payload, raw=False, strict_map_key=False)
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
        v = d.get("v", SCHEMA_VERSION)
        if v != SCHEMA_VERSION:
            raise EntryError(f"payload schema version {v!r} is not supported (expected 1)")
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
        try:
            return cls(url, **kwargs)
        except Exception as exc:
            raise EntryError(f"Scrapy rejects the request: {type(exc).__name__}: {exc}") from None

    def _resolve(self, name: Any, what: str) -> Any:
        if name == _NO_CALLBACK_MARK:
            return NO_CALLBACK
        if not isinstance(name, str) or not name.isidentifier() or name.startswith("_"):
            raise EntryError(f"{what} name {name!r} is not a public method name")
        spider = self.spider
        if spider is None:
            raise EntryError(f"{what} {name!r} cannot be resolved without a spider")
        method = getattr(spider, name, None)
        if method is None or not callable(method) or getattr(method, "__self__", None) is not spider:
            raise EntryError(
                f"{what} {name!r} is not a method of spider {spider.name!r}"
            )
        return method


def _take(d: dict[str, Any], kwargs: dict[str, Any], key: str, arg: str, types: Any) -> None:
    if key in d:
        value = d[key]
        if not isinstance(value, types) or (types is int and isinstance(value, bool)):
            raise EntryError(f"{arg} (key {key!r}) has type {type(value).__name__}")
        kwargs[arg] = value
