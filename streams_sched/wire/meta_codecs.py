"""The registry of project codecs: how an object of some class travels in meta.

A codec turns one object into plain data the queue can carry (``encode``) and
back (``decode``). Register one from Python::

    from streams_sched import register_meta_codec

    register_meta_codec(Money, encode=lambda m: [m.amount, m.currency],
                        decode=lambda d: Money(*d))

or with the setting ``STREAMS_META_CODECS = {"myproject.money.Money":
"myproject.codecs.money_codec"}`` (any object with ``encode`` and ``decode``
callables, e.g. a :class:`MetaCodec`). Settings are trusted and loaded at
start; entries only ever name a registered codec, and a worker without that
codec dead-letters the entry with the reason.

One codec ships: scrapy-playwright's ``PageMethod`` (with a string method
name), registered when scrapy_playwright is installed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from streams_sched.errors import ConfigError

__all__ = ["MetaCodec", "MetaCodecProtocol", "register_meta_codec", "registered_codecs", "class_path"]


class MetaCodecProtocol(Protocol):
    """What STREAMS_META_CODECS values provide: two callables."""

    @property
    def encode(self) -> Callable[[Any], Any]: ...

    @property
    def decode(self) -> Callable[[Any], Any]: ...


@dataclass(frozen=True)
class MetaCodec:
    """How instances of ``cls`` travel: ``encode(obj)`` returns data the queue can carry
    (plain types, the built-in extension types, items, other registered classes);
    ``decode(data)`` rebuilds the object and raises on data it does not accept."""

    cls: type
    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]
    #: the name entries carry; default ``module.qualname`` of ``cls``
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            object.__setattr__(self, "name", class_path(self.cls))


def class_path(cls: type) -> str:
    """``module.qualname`` of ``cls``, the name a class has in entries and settings."""
    return f"{cls.__module__}.{cls.__qualname__}"


_REGISTERED: dict[type, MetaCodec] = {}


def register_meta_codec(
    cls: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any], name: str = ""
) -> MetaCodec:
    """Register how ``cls`` travels in meta and cb_kwargs, for codecs built after this call
    (register at import time of your spiders or settings). Returns the codec."""
    if not isinstance(cls, type) or not callable(encode) or not callable(decode):
        raise TypeError("register_meta_codec(cls, encode, decode): a class and two callables")
    codec = MetaCodec(cls, encode, decode, name)
    _REGISTERED[cls] = codec
    return codec


def _page_method_codec() -> MetaCodec | None:
    if importlib.util.find_spec("scrapy_playwright") is None:
        return None
    from scrapy_playwright.page import PageMethod  # a fixed, trusted name, at start

    def encode(pm: Any) -> list[Any]:
        if not isinstance(pm.method, str):
            raise TypeError(
                f"PageMethod with a callable method {pm.method!r} cannot travel; use a page method name"
            )
        return [pm.method, tuple(pm.args), dict(pm.kwargs)]

    def decode(data: Any) -> Any:
        if not (isinstance(data, list) and len(data) == 3 and isinstance(data[0], str)
                and isinstance(data[1], tuple) and isinstance(data[2], dict)
                and all(isinstance(k, str) for k in data[2])):
            raise ValueError("PageMethod data is not [name, args, kwargs]")
        return PageMethod(data[0], *data[1], **data[2])

    return MetaCodec(PageMethod, encode, decode)


def registered_codecs(from_settings: Mapping[str, str] | None = None) -> dict[type, MetaCodec]:
    """The codecs a RequestCodec uses: the shipped ones, then those registered from
    Python, then STREAMS_META_CODECS (class path -> codec object path), later ones win."""
    from scrapy.utils.misc import load_object

    out: dict[type, MetaCodec] = {}
    page_method = _page_method_codec()
    if page_method is not None:
        out[page_method.cls] = page_method
    out.update(_REGISTERED)
    for cls_path, codec_path in (from_settings or {}).items():
        value = f"{cls_path}: {codec_path}"
        try:
            cls = load_object(cls_path)
            obj = load_object(codec_path) if isinstance(codec_path, str) else codec_path
        except Exception as exc:
            raise ConfigError("STREAMS_META_CODECS", value, f"cannot import it ({exc})") from exc
        if not isinstance(cls, type):
            raise ConfigError("STREAMS_META_CODECS", value, f"{cls_path} is not a class")
        enc, dec = getattr(obj, "encode", None), getattr(obj, "decode", None)
        if not (callable(enc) and callable(dec)):
            raise ConfigError(
                "STREAMS_META_CODECS", value, f"{codec_path} has no callable encode and decode"
            )
        out[cls] = MetaCodec(cls, enc, dec)
    return out
