"""The payload of a stream entry: its keys, its schema versions and the request classes.

A payload is a msgpack map with short keys::

    v   schema version (absent: 1; 2 when the entry uses what version 1 cannot
        carry: extension types in meta/cb_kwargs/cookies, callbacks named
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

Values in meta, cb_kwargs and cookies use the extension codes of :mod:`.values`
(tuples, sets, dates and times, Decimal, UUID, items, STREAMS_META_CLASSES,
registered codecs). A version 1 entry means the same to this decoder as to a
version 1 decoder; a worker that reads only version 1 refuses a version 2 entry
with the reason, and reads the version 2 entries that do not need it.

This module owns the layout and the byte-level edit that marks a payload as version 2;
:mod:`.codec` builds and reads payloads with it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from scrapy import Request
from scrapy.http import FormRequest, JsonRequest

__all__ = ["DEFAULT_REQUEST_CLASSES", "TRANSIENT_META_KEYS", "SCHEMA_VERSION", "READABLE_VERSIONS"]

SCHEMA_VERSION = 2
#: versions this decoder reads
READABLE_VERSIONS = frozenset({1, 2})
NO_CALLBACK_MARK = "!"

#: Request classes every crawl may carry, by the name stored in entries.
DEFAULT_REQUEST_CLASSES: dict[str, type[Request]] = {
    "FormRequest": FormRequest,
    "JsonRequest": JsonRequest,
}

#: Meta keys that describe one download and are not carried into the queue.
TRANSIENT_META_KEYS: frozenset[str] = frozenset({"download_latency"})

KNOWN_KEYS = frozenset({"v", "u", "c", "e", "m", "h", "b", "k", "mt", "a", "p", "df", "en", "f", "t", "x"})
BASE_ATTRIBUTES = frozenset(Request.attributes)
#: request classes whose __init__ leaves meta as given (no need to restore it on decode)
KEEPS_META = frozenset({Request, FormRequest, JsonRequest})
#: what the fields are called in error messages
FIELD_LABELS = {"mt": "meta", "a": "cb_kwargs", "k": "cookies", "h": "headers", "f": "flags", "x": "attributes"}

_VERSION_PAIR = b"\xa1v" + bytes([SCHEMA_VERSION])  # msgpack of "v" and of the version


def with_version(payload: bytes) -> bytes:
    """``payload`` with ``"v": SCHEMA_VERSION`` added, without packing it again: a payload
    has at most 15 keys before "v", so it starts with a fixmap header (0x80 | count)."""
    head = payload[0]
    if head & 0xF0 != 0x80:  # pragma: no cover - every field set is at most 15 keys
        raise AssertionError(f"payload map header {head:#x} is not a fixmap")
    count = (head & 0x0F) + 1
    new_head = bytes([0x80 | count]) if count <= 15 else b"\xde" + count.to_bytes(2, "big")
    return new_head + _VERSION_PAIR + payload[1:]


def without_transient(meta: Mapping[str, Any]) -> Mapping[str, Any]:
    """``meta`` without the keys of TRANSIENT_META_KEYS (the same dict if it has none)."""
    if TRANSIENT_META_KEYS.isdisjoint(meta):
        return meta
    return {k: v for k, v in meta.items() if k not in TRANSIENT_META_KEYS}


def size_message(size: int, max_bytes: int) -> str:
    """Why a payload of ``size`` bytes is refused."""
    return (
        f"encoded request is {size} bytes, over STREAMS_MAX_REQUEST_BYTES="
        f"{max_bytes}; keep large data out of meta and body"
    )
