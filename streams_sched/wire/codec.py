"""Request <-> stream entry payload, in msgpack. Never pickle.

It owns turning a Scrapy request into the payload laid out in :mod:`.schema` and back:
naming callbacks (:mod:`.callbacks`), the allowlist of request classes and their extra
attributes, and finding which field cannot travel. Values in meta, cb_kwargs and cookies
are packed by :mod:`.values`; many GET payloads that differ by URL only come from
:mod:`.url_template`.

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
from scrapy.http.request import NO_CALLBACK
from scrapy.utils.misc import load_object

from streams_sched.errors import ConfigError, EntryError, SerializationError
from streams_sched.wire import url_template
from streams_sched.wire.callbacks import method_name, spider_method
from streams_sched.wire.meta_codecs import registered_codecs
from streams_sched.wire.schema import (
    BASE_ATTRIBUTES,
    DEFAULT_REQUEST_CLASSES,
    FIELD_LABELS,
    KEEPS_META,
    KNOWN_KEYS,
    NO_CALLBACK_MARK,
    READABLE_VERSIONS,
    size_message,
    with_version,
    without_transient,
)
from streams_sched.wire.values import ValueCodec

__all__ = ["RequestCodec"]

_NO_DEFAULT = object()


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
        d, v2 = self._fields(request, callback, errback)
        cls = type(request)
        if cls is not Request:
            v2 = self._class_fields(request, cls, d) or v2
        values = self.values
        values.ext_used = False
        try:
            payload: bytes = self._packb(d)
        except Exception as exc:  # TypeError (Unencodable), ValueError, OverflowError from msgpack
            raise self.explain(request, d, exc) from None
        if v2 or values.ext_used:
            payload = with_version(payload)
        if self.max_bytes and len(payload) > self.max_bytes:
            raise SerializationError(repr(request), "size", size_message(len(payload), self.max_bytes))
        return payload

    def _fields(self, request: Request, callback: str | None, errback: str | None) -> tuple[dict[str, Any], bool]:
        """The payload map of the fields every request has, and whether it needs version 2
        (a callback or errback named with a leading underscore)."""
        d: dict[str, Any] = {"u": request.url}
        if callback is None and request.callback is not None:
            callback = self._callback_name(request, request.callback, "callback")
        if errback is None and request.errback is not None:
            errback = self._callback_name(request, request.errback, "errback")
        v2 = False
        if callback is not None:
            d["c"] = callback
            v2 = callback[0] == "_"
        if errback is not None:
            d["e"] = errback
            v2 = v2 or errback[0] == "_"
        if request.method != "GET":
            d["m"] = request.method
        if request.headers:
            d["h"] = [[k, list(v)] for k, v in request.headers.items()]
        if request.body:
            d["b"] = request.body
        if request.cookies:
            d["k"] = request.cookies
        if request.meta:
            d["mt"] = without_transient(request.meta)
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
        return d, v2

    def _class_fields(self, request: Request, cls: type[Request], d: dict[str, Any]) -> bool:
        """Add the request class ("t") and its extra attributes ("x") to ``d``; whether they
        need version 2."""
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
            return True
        return False

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
        return url_template.url_encoder(
            self, callback=callback, errback=errback, meta=meta, priority=priority, dont_filter=dont_filter
        )

    def _extra_attributes(self, request: Request, cls: type[Request]) -> dict[str, Any]:
        """The attributes ``cls`` adds to Request.attributes, where they differ from the
        defaults of a fresh instance (as Scrapy's request_from_dict passes them)."""
        defaults = self._extras.get(cls)
        if defaults is None:
            names = [a for a in cls.attributes if a not in BASE_ATTRIBUTES]
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
            return NO_CALLBACK_MARK
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

    def explain(self, request: Any, d: dict[str, Any], exc: Exception) -> SerializationError:
        """Find which field (and which meta / cb_kwargs key) of the payload map ``d`` of
        ``request`` (anything whose repr names it) cannot be encoded."""
        pack = self._packb
        for field, value in d.items():
            try:
                pack(value)
            except Exception as inner:
                label = FIELD_LABELS.get(field, field)
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
        """Return the request of ``payload``; raise EntryError with the reason if it has none:
        the payload must be a map with a URL, known keys and a readable schema version."""
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
        unknown = d.keys() - KNOWN_KEYS
        if unknown:
            raise EntryError(f"payload has unknown keys {sorted(map(str, unknown))}")
        v = d.get("v", 1)
        if v != 1 and (type(v) is not int or v not in READABLE_VERSIONS):
            raise EntryError(
                f"payload schema version {v!r} is not supported (this worker reads"
                f" {sorted(READABLE_VERSIONS)}; upgrade it)"
            )
        kwargs = self._kwargs(d)
        cls = self._request_class(d, kwargs)
        try:
            request = cls(url, **kwargs)
        except Exception as exc:
            raise EntryError(f"Scrapy rejects the request: {type(exc).__name__}: {exc}") from None
        if cls not in KEEPS_META:
            # a subclass __init__ may add to meta (SplashRequest fills meta['splash']
            # defaults); the request had exactly the meta that travelled
            request.meta.clear()
            request.meta.update(kwargs.get("meta", {}))
        return request

    def _kwargs(self, d: dict[Any, Any]) -> dict[str, Any]:
        """The keyword arguments of the request class from the payload map, type-checked."""
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
        return kwargs

    def _request_class(self, d: dict[Any, Any], kwargs: dict[str, Any]) -> type[Request]:
        """The allowed request class the payload names ("t"), its extra attributes ("x")
        added to ``kwargs``."""
        if "t" not in d:
            if "x" in d:
                raise EntryError("extra attributes (key 'x') without a request class (key 't')")
            return Request
        cls = self._by_name.get(d["t"]) if isinstance(d["t"], str) else None
        if cls is None:
            raise EntryError(f"request class {d['t']!r} is not allowed (see STREAMS_REQUEST_CLASSES)")
        if "x" in d:
            extras = d["x"]
            if not isinstance(extras, dict) or not all(
                isinstance(k, str) and k in cls.attributes and k not in BASE_ATTRIBUTES for k in extras
            ):
                raise EntryError(f"extra attributes (key 'x') {extras!r} are not attributes of {d['t']}")
            kwargs.update(extras)
        return cls

    def _resolve(self, name: Any, what: str) -> Any:
        if name == NO_CALLBACK_MARK:
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
